"""The `fscil` command line: model summary numbers, help texts, config show."""

from __future__ import annotations

import json

import pytest
import yaml

from pipeline.models.backbones import build_backbone
from tests.pipeline_fixtures import cli


def ss2d_branch_params(c: int, h: int, w: int, d: int, n: int, r: int, k: int, conv: int = 3) -> int:
    """Parameter count of one SS2D branch, from the architecture in reference-facts "Projector"."""
    p_mlp = (c * 2 * c + 2 * c) + 2 * (2 * c * h * w) + 2 * c * d
    return (p_mlp + h * w * d + d * 2 * d + d * conv * conv + d + k * (r + 2 * n) * d + k * d * r + k * d
            + k * d * n + k * d)


def test_model_summary_cifar_setting():
    result = cli("model", "summary", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):result.output.rindex("}") + 1])
    assert summary["feature_map"] == "640x2x2" and summary["num_classes"] == 100
    parts = {k: v["parameters"] for k, v in summary["components"].items()}
    # the preset's branch is the authors' shared 1-D block: their CIFAR-100 neck has 6,590,720 parameters
    assert parts["g_base"] == parts["g_inc"] == 6_590_720 // 2
    ss2d = cli("model", "summary", "--json", "--ssm-branch", "ss2d")
    ss2d_parts = {k: v["parameters"] for k, v in json.loads(ss2d.output)["components"].items()}
    assert ss2d_parts["g_base"] == ss2d_parts["g_inc"] == ss2d_branch_params(640, 2, 2, 640, 256, 256, 4)
    assert parts["p_iden"] == 0  # C == D': identity
    assert parts["classifier"] == 0  # the ETF is a buffer
    assert parts["backbone"] == sum(p.numel() for p in build_backbone("resnet12").parameters())
    assert summary["total_parameters"] == sum(parts.values())


def test_model_summary_variants_table():
    result = cli("model", "summary", "--preset", "synthetic", "--projector", "single_ssm", "--classifier", "linear",
                 "--dim", "96")
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split()[1] for line in result.output.splitlines() if line[:1].isalpha()}
    assert rows["g_inc"] == "0"
    assert int(rows["p_iden"].replace(",", "")) == 128 * 96
    assert int(rows["classifier"].replace(",", "")) == 96 * 100 + 100
    assert cli("model", "summary", "--k-paths", "3").exit_code == 2


def test_model_summary_projector_family_side_by_side():
    from pipeline.models.registry import PROJECTOR_KINDS

    result = cli("model", "summary", "--preset", "synthetic", "--projector", "all")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(line for line in lines if line.startswith("component")).split()[1:]
    assert header == list(PROJECTOR_KINDS)
    rows = {line.split()[0]: [int(v.replace(",", "")) for v in line.split()[1:]] for line in lines
            if line.split()[0] in ("backbone", "g_base", "g_inc", "total")}
    assert len(set(rows["backbone"])) == 1  # one backbone, the projectors differ
    by_kind = dict(zip(header, rows["g_inc"], strict=True))
    assert by_kind["single_ssm"] == 0 and all(v > 0 for k, v in by_kind.items() if k != "single_ssm")
    assert rows["g_base"][header.index("dual_ssm")] == by_kind["dual_ssm"]
    one = cli("model", "summary", "--preset", "synthetic", "--projector", "gru", "--json")
    assert json.loads(one.output)["components"]["g_inc"]["parameters"] == by_kind["gru"]
    assert cli("model", "summary", "--projector", "dual_ssm,rnn").exit_code == 2


@pytest.mark.parametrize("args", [[], ["stage"], ["stage", "incremental"], ["stage", "prepare"], ["model", "summary"],
                                  ["model", "benchmark"], ["config", "show"]])
def test_help_everywhere(args):
    result = cli(*args, "--help")
    assert result.exit_code == 0 and "Usage" in result.output


def test_config_show_merges_the_preset(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"preset": "cifar100", "data": {"root": "/x", "split_dir": "/y"},
                                      "incremental": {"lambda3": 0.5, "grad_clip_norm": None}}))
    result = cli("config", "show", "--params", str(params))
    assert result.exit_code == 0, result.output
    cfg = yaml.safe_load(result.output)
    assert cfg["model"]["dim"] == 640 and cfg["base"]["epochs"] == 200
    assert cfg["incremental"]["lambda3"] == 0.5 and cfg["incremental"]["lr"] == 0.25  # an absent key: the preset's
    assert cfg["incremental"]["grad_clip_norm"] is None


def test_model_benchmark_reports_times():
    # medians of 5 (one timing alone was at the mercy of a busy machine)
    result = cli("model", "benchmark", "--preset", "synthetic", "--channels", "8", "--batch", "4", "--repeats", "5")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.splitlines()[0])
    assert out["forward_ms"] > 0 and out["forward_backward_ms"] > 0


@pytest.mark.parametrize("threads", [1, 3])
def test_threads_param_pins_torch_threads(tmp_path, threads):
    # CPU results depend on the intra-op thread count, so every stage takes it from params, not from the machine
    import torch

    before = torch.get_num_threads()
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"preset": "synthetic", "threads": threads}))
    try:
        result = cli("config", "show", "--params", str(params))
        assert result.exit_code == 0, result.output
        assert yaml.safe_load(result.output)["threads"] == threads
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    params.write_text(yaml.safe_dump({"preset": "synthetic", "threads": 0}))
    result = cli("config", "show", "--params", str(params))
    assert result.exit_code == 2 and "threads must be a positive integer" in result.output


@pytest.mark.parametrize(("argv", "needle"), [
    (["stage", "incremental", "--session", "abc"], "Invalid value for '--session'"),
    (["stage", "incremental"], "Missing option '--session'"),
    (["config", "show", "--nope"], "No such option: --nope"),
    (["nosuch"], "No such command 'nosuch'"),
    (["config", "show", "incremental.nosuch"], "no key incremental.nosuch"),
    (["model", "summary", "--projector", "nosuch"], "--projector must be one or more of dual_ssm"),
    (["model", "summary", "--k-paths", "3"], "--k-paths must be"),
    (["predict", "x.png", "--model", "m.safetensors"], "m.safetensors"),
    (["predict", "x.png", "--device", "cuda:7", "--model", "m.safetensors"], "--device cuda:7 asked for"),
    (["model", "summary", "--widths", "a,b"], "--widths must be comma-separated integers, got 'a,b'"),
    (["model", "summary", "--dim", "0"], "--dim must be >= 1"),
])
def test_usage_errors_are_one_line_and_exit_2(argv, needle, capsys):
    """What the `fscil` command prints (stages.cli.main, not typer's boxes): one line on stderr naming the flag."""
    from stages.cli import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1 and needle in err, err


def test_config_show_prints_the_keys_asked_for():
    result = cli("config", "show", "incremental.lr", "model.dim", "--origin")
    assert result.exit_code == 0
    assert [line.split(":")[0] for line in result.output.splitlines()] == ["model.dim", "incremental.lr"]


def test_outside_the_repository_the_error_says_where_to_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("config", "show")
    assert result.exit_code == 2 and "run fscil from the repository's root, or pass --params FILE" in result.output


def test_help_shows_flags_without_type_boxes():
    result = cli("stage", "base", "--help")
    assert "<bool>" not in result.output and "╭" not in result.output and "-q, --quiet" in result.output


def test_an_interrupted_stage_says_so_and_exits_130(capsys):
    """Ctrl-C in a stage (`fscil stage ...` and `python -m stages.<name>` alike): one line naming it, exit 130."""
    from stages.cli_common import _run
    from stages.entry import one_line_errors, timed

    def interrupted():
        raise KeyboardInterrupt

    for run in (lambda: timed("base", interrupted), lambda: _run("base", interrupted)):
        with pytest.raises(SystemExit) as done, one_line_errors():
            run()
        assert done.value.code == 130 and capsys.readouterr().err == "error: base interrupted; nothing was written\n"
