"""The precedence rule (pipeline/config/layers.py): what the user configures is what runs, or a one-line error says
why not. One test per surprise of the old five-layer merge, and `fscil config show --origin` / `-S` / `fscil list`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import pipeline.config as config
import pipeline.config.layers as config_layers
from pipeline.config import build_config, load_config
from pipeline.errors import FSCILError
from tests.pipeline_fixtures import cli

FSCIL = Path(sys.executable).with_name("fscil")
OMNIGLOT = {"preset": "omniglot", "data": {"root": "/nonexistent"}}


def test_a_user_value_the_variant_fixes_is_an_error_naming_both():
    """Was: preset omniglot (which named dual_ssm) + `incremental.lambda1: 30` ran with lambda1 0.0, exit 0."""
    with pytest.raises(FSCILError) as err:
        build_config({**OMNIGLOT, "variant": "dual_ssm", "incremental": {"lambda1": 30}})
    message = str(err.value)
    assert "incremental.lambda1 = 30 (params.yaml)" in message and "variant dual_ssm" in message
    assert "fixes it at 0.0" in message and "\n" not in message
    # the same value as the variant's is no conflict; -S is the user's too
    assert build_config({**OMNIGLOT, "variant": "dual_ssm", "incremental": {"lambda1": 0.0}}).incremental.lambda1 == 0
    with pytest.raises(FSCILError, match=r"incremental\.lambda1 = 5 \(-S\) conflicts with variant dual_ssm"):
        build_config({**OMNIGLOT, "variant": "dual_ssm"}, ["incremental.lambda1=5"])


def test_a_preset_no_longer_picks_a_variant_and_the_user_value_wins_over_selected_values():
    """Was: with preset omniglot, `model.out_norm: false` and `incremental.vertex_match: false` stayed true (the
    preset's variant_params won over params.yaml)."""
    assert build_config(OMNIGLOT).variant is None
    plus = {**OMNIGLOT, "variant": "mamba_fscil_plus"}
    assert build_config(plus).model.out_norm is True  # the value selected for that variant on this preset
    mine = build_config({**plus, "model": {"out_norm": False}, "incremental": {"vertex_match": False}})
    assert mine.model.out_norm is False and mine.incremental.vertex_match is False
    assert mine.origins["model.out_norm"] == "params.yaml"
    assert build_config(plus).origins["model.out_norm"] == "preset omniglot: variant_params.mamba_fscil_plus"


def test_a_key_can_be_set_to_null_where_null_means_something(tmp_path, monkeypatch):
    """Was: null meant "the preset's value", so a preset's non-null value could not be switched off."""
    preset = yaml.safe_load((config.PRESET_DIR / "synthetic.yaml").read_text())
    preset["incremental"]["grad_clip_norm"] = 1.0
    (tmp_path / "clipped.yaml").write_text(yaml.safe_dump(preset))
    monkeypatch.setattr(config_layers, "PRESET_DIR", tmp_path)
    assert build_config({"preset": "clipped"}).incremental.grad_clip_norm == 1.0
    cfg = build_config({"preset": "clipped", "incremental": {"grad_clip_norm": None}})
    assert cfg.incremental.grad_clip_norm is None and cfg.origins["incremental.grad_clip_norm"] == "params.yaml"
    assert build_config({"preset": "clipped"}, ["incremental.grad_clip_norm=null"]).incremental.grad_clip_norm is None
    # null where the key has no null meaning: one line naming the key and where it was set
    with pytest.raises(FSCILError, match=r"incremental\.lr must be a number, got null .*\(set by params\.yaml\)$"):
        build_config({"preset": "clipped", "incremental": {"lr": None}})


def test_an_omitted_key_takes_the_papers_value_never_a_switched_off_loss(tmp_path, monkeypatch):
    """Was: a custom preset without lambda3 or dr_scale silently got separation off and the DR loss x1."""
    preset = yaml.safe_load((config.PRESET_DIR / "synthetic.yaml").read_text())
    for section, key in (("incremental", "lambda2"), ("incremental", "lambda3"), ("incremental", "dr_scale"),
                         ("base", "dr_scale")):
        del preset[section][key]
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(preset))
    monkeypatch.setattr(config_layers, "PRESET_DIR", tmp_path)
    cfg = build_config({"preset": "mine", "variant": "mamba_fscil"})
    assert (cfg.incremental.lambda2, cfg.incremental.lambda3) == (1e-5, 1e-3)  # the authors' CIFAR-100 values
    assert cfg.incremental.dr_scale == cfg.base.dr_scale == 10.0
    assert cfg.origins["incremental.lambda3"] == "default"


def test_the_papers_method_refuses_a_switched_off_loss_naming_where_it_came_from():
    with pytest.raises(FSCILError, match=r"incremental\.lambda3 must be > 0 with variant mamba_fscil .*"
                                         r"\(set by params\.yaml\)"):
        build_config({"variant": "mamba_fscil", "incremental": {"lambda3": 0.0}})
    assert build_config({"variant": None, "incremental": {"lambda3": 0.0}}).incremental.lambda3 == 0.0


def test_a_preset_may_not_name_a_variant(tmp_path, monkeypatch):
    preset = yaml.safe_load((config.PRESET_DIR / "synthetic.yaml").read_text())
    (tmp_path / "named.yaml").write_text(yaml.safe_dump({**preset, "variant": "dual_ssm"}))
    monkeypatch.setattr(config_layers, "PRESET_DIR", tmp_path)
    with pytest.raises(FSCILError, match="preset named: a preset does not set variant"):
        build_config({"preset": "named"})


def test_a_preset_extends_another_key_by_key(tmp_path, monkeypatch):
    """`extends: <preset>`: the named preset with the extending file's values on top, sections and variant_params
    merged key by key; an unknown or circular parent is a one-line error."""
    for name in ("synthetic", "omniglot"):
        (tmp_path / f"{name}.yaml").write_text((config.PRESET_DIR / f"{name}.yaml").read_text())
    (tmp_path / "short.yaml").write_text(yaml.safe_dump({
        "extends": "synthetic", "base": {"epochs": 7},
        "variant_params": {"mamba_fscil_plus": {"incremental": {"lambda1": 3.0}}}}))
    monkeypatch.setattr(config_layers, "PRESET_DIR", tmp_path)
    full, short = build_config({"preset": "synthetic"}), build_config({"preset": "short"})
    assert short.base.epochs == 7 and short.base.lr == full.base.lr and short.model == full.model
    assert short.incremental == full.incremental and short.origins["base.epochs"] == "preset short"
    assert short.origins["base.lr"] == "preset synthetic"  # where each value came from, the parent named
    plus = build_config({"preset": "short", "variant": "mamba_fscil_plus"})
    assert plus.incremental.lambda1 == 3.0  # its own variant_params value, the parent's others kept
    assert plus.origins["incremental.lambda1"] == "preset short: variant_params.mamba_fscil_plus"
    assert plus.extract.memory == build_config({"variant": "mamba_fscil_plus"}).extract.memory == "sampled"
    (tmp_path / "loop.yaml").write_text("extends: loop2\n")
    (tmp_path / "loop2.yaml").write_text("extends: loop\n")
    with pytest.raises(FSCILError, match=r"^preset loop: extends itself \(loop -> loop2 -> loop\)$"):
        build_config({"preset": "loop"})
    (tmp_path / "orphan.yaml").write_text("extends: nope\n")
    with pytest.raises(FSCILError, match=r"^preset orphan: extends preset 'nope' does not exist"):
        build_config({"preset": "orphan"})


def test_overrides_win_over_the_params_file_and_name_unknown_keys(tmp_path):
    params = tmp_path / "p.yaml"
    params.write_text(yaml.safe_dump({"preset": "synthetic", "incremental": {"lr": 0.5}}))
    cfg = load_config(params, ["incremental.lr=0.2", "+model.dim=64", "incremental.steps=[5, 6]", "variant=null"])
    assert (cfg.incremental.lr, cfg.model.dim, cfg.incremental.steps, cfg.variant) == (0.2, 64, [5, 6], None)
    assert cfg.origins["incremental.lr"] == "-S" and cfg.origins["incremental.batch_size"] == "preset synthetic"
    with pytest.raises(FSCILError, match=r"-S: unknown key incremental\.lrr"):
        load_config(params, ["incremental.lrr=1"])
    with pytest.raises(FSCILError, match="expected section.key=value"):
        load_config(params, ["incremental.lr"])


def test_config_show_origin_names_every_layer(tmp_path):
    params = tmp_path / "p.yaml"
    params.write_text(yaml.safe_dump({**OMNIGLOT, "variant": "mamba_fscil_plus", "seed": 3,
                                      "base": {"epochs": 70}}))
    result = cli("config", "show", "--params", str(params), "--origin", "-S", "incremental.lr=0.05")
    assert result.exit_code == 0, result.output
    lines = {line.split(":")[0]: line for line in result.output.splitlines()}
    assert lines["base.epochs"].endswith(f"# {params}")
    assert lines["incremental.lr"].endswith("# -S")
    assert lines["incremental.freeze_base"].endswith("# variant mamba_fscil_plus")
    assert lines["model.out_norm"].endswith("# preset omniglot: variant_params.mamba_fscil_plus")
    assert lines["base.batch_size"].endswith("# preset omniglot")
    assert lines["base.momentum"].endswith("# default")
    assert lines["data.seed"].startswith("data.seed: 3") and "# seed" in lines["data.seed"]
    assert len(lines) > 100  # every key


def test_every_origin_is_a_layer_the_rule_lists():
    """`LAYERS` (the precedence rule the README points to) names every origin the layers give: none made elsewhere."""
    import re

    cfg = build_config({**OMNIGLOT, "variant": "mamba_fscil_plus", "seed": 3, "base": {"epochs": 70},
                        "variant_params": {"mamba_fscil_plus": {"incremental": {"lambda1": 7.0}}}},
                       ["incremental.lr=0.05"])
    forms = [re.escape(origin).replace("<name>", r"\S+").replace("<variant>", r"\S+") for origin, _ in config.LAYERS]
    layer = "|".join(forms)
    for key, origin in cfg.origins.items():  # data.seed follows the top-level seed: "seed (<its layer>)"
        assert re.fullmatch(rf"(?:{layer})|seed \((?:{layer})\)", origin), (key, origin)
    assert {o for o in cfg.origins.values() if not o.startswith("seed")} == {
        "default", "preset omniglot", "preset omniglot: variant_params.mamba_fscil_plus", "variant mamba_fscil_plus",
        "params.yaml: variant_params.mamba_fscil_plus", "params.yaml", "-S"}  # every layer, one per row of LAYERS


def test_fscil_list_names_every_preset_and_variant_on_one_line():
    result = cli("list")
    assert result.exit_code == 0
    blocks: dict[str, list[str]] = {}
    for line in result.output.splitlines():
        if not line.startswith(" "):
            header = line
        else:
            blocks.setdefault(header, []).append(line.split()[0])
    assert blocks["presets (pipeline/presets/):"] == config.available_presets()
    assert blocks["variants (pipeline/variants/):"] == config.available_variants()
    from pipeline.registry import all_registries

    for dotted, registry in all_registries().items():  # and every registry's entries, each on its line
        module, name = dotted.rsplit(".", 1)
        (header,) = [h for h in blocks if h.endswith(f" ({module.replace('.', '/')}.py {name}):")]
        assert header.startswith(registry.kind) and blocks[header] == list(registry)


@pytest.mark.skipif(not FSCIL.exists(), reason="the fscil console script is not installed here")
@pytest.mark.parametrize("content,needle", [
    (None, "is a directory, not a YAML file"),
    ("preset: synthetic\nmodel:\n  dim: [1\n", "not valid YAML (line 4"),
    ("preset: synthetic\nincremental: {lambda1: 5}\nvariant: dual_ssm\n", "conflicts with variant dual_ssm"),
])
def test_the_installed_entry_point_gives_one_line_errors(tmp_path, content, needle):
    """Through the console script users run (pyproject's [project.scripts]), not the test runner's app."""
    path = tmp_path / "params"
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    result = subprocess.run([str(FSCIL), "config", "show", "--params", str(path)], capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and needle in result.stderr, result.stderr
