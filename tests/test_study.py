"""Multi-seed studies: the mean +- std table against hand-computed values, and a tiny study end to end."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import pipeline.research.parallel as parallel
import pipeline.research.study as study
import pipeline.training.base_session as base_session
import pipeline.workdir as workdir
from pipeline.config import build_config
from pipeline.data.prepare import build_pack
from pipeline.errors import FSCILError, TrainingDiverged
from pipeline.models.fscil import build_model
from pipeline.research.seeds import standing_word, vs_own_cell
from pipeline.research.study import prototype_label, run_scores, study_table, table_markdown
from pipeline.training.base_model import MODEL_FILE, base_twin
from pipeline.training.base_session import derive_base_model, train_base
from pipeline.training.checkpoint import load_checkpoint
from tests.pipeline_fixtures import TINY_PARAMS


def _sessions() -> pd.DataFrame:
    rows = []
    # two variants x two seeds, three sessions; accuracies chosen so every score is easy to check by hand
    for variant, offset in (("a", 0.0), ("b", 10.0)):
        for seed, acc in ((0, [90.0, 80.0, 70.0]), (1, [80.0, 70.0, 60.0])):
            for session, value in enumerate(acc):
                rows.append({"variant": variant, "seed": seed, "session": session, "acc": value + offset,
                             "novel_acc": np.nan if session == 0 else 50.0 + seed,
                             "proto_backbone_acc": 85.0 - 5 * session, "proto_backbone_novel_acc": 40.0})
    return pd.DataFrame(rows)


def test_run_scores_and_table_are_means_and_stds_over_seeds():
    scores = run_scores(_sessions())
    a0 = scores[(scores.variant == "a") & (scores.seed == 0)].iloc[0]
    assert (a0.base, a0.final, a0.avg, a0.pd, a0.novel_s1) == (90.0, 70.0, 80.0, 20.0, 50.0)
    table = study_table(_sessions(), ["b", "a"], reference="a")
    proto = prototype_label("a")  # named after the variant whose backbones it is
    assert list(table.index) == ["b", "a", proto] == ["b", "a", "prototype (backbone NCM) of a"]
    assert table.loc["a", ("avg", "mean")] == pytest.approx(75.0)
    assert table.loc["a", ("avg", "std")] == pytest.approx(np.std([80.0, 70.0], ddof=1))
    assert table.loc["b", ("final", "mean")] == pytest.approx(75.0)
    # the prototype row: the reference variant's backbone NCM column (85, 80, 75 in every run)
    assert table.loc[proto, ("avg", "mean")] == pytest.approx(80.0)
    assert table.loc[proto, ("pd", "std")] == pytest.approx(0.0)
    md = table_markdown(table)
    # AVG minus the run's own class means (80 in every run): a 0 and -10, b +10 and 0; none for the prototype row
    assert table.loc["a", ("vs_proto", "mean")] == pytest.approx(-5.0)
    assert table.loc["b", ("vs_proto", "std")] == pytest.approx(np.std([10.0, 0.0], ddof=1))
    # paired by seed: a's differences 0 and -10 (SE 5: level, no seed above, one below), b's +10 and 0
    assert table.loc["a", ("vs_proto", "se")] == pytest.approx(5.0)
    assert ("| a | 2 | 0 | 85.00 ± 7.07 | 65.00 ± 7.07 | 75.00 ± 7.07 | 20.00 ± 0.00 | -5.00 ± 5.00 (0 up, 1 down): "
            "level | 50.50 ± 0.71 |" in md)
    assert ("| b | 2 | 0 | 95.00 ± 7.07 | 75.00 ± 7.07 | 85.00 ± 7.07 | 20.00 ± 0.00 | +5.00 ± 5.00 (1 up, 0 down): "
            "level |" in md)
    assert f"| {proto} | 2 | 0 | 85.00 ± 0.00 | 75.00 ± 0.00 | 80.00 ± 0.00 | 10.00 ± 0.00 | - |" in md
    assert "enters no mean and is counted under diverged" in md
    # a diverged run is counted in its row, never averaged; a row whose every run diverged still shows, with no mean
    diverged = study_table(_sessions(), ["b", "a", "c"], reference="a",
                           diverged={("a", 2): "session 1: non-finite loss", ("c", 0): "fit rose"})
    assert diverged.loc["a", ("diverged", "n")] == 1 and diverged.loc["a", ("seeds", "n")] == 2
    assert diverged.loc["a", ("avg", "mean")] == pytest.approx(75.0)
    assert diverged.loc["c", ("diverged", "n")] == 1 and diverged.loc["c", ("seeds", "n")] == 0
    assert "| a | 2 | 1 |" in table_markdown(diverged)


def test_standing_against_own_class_means_in_words():
    assert vs_own_cell(0.68, 0.22, 3, 0) == "+0.68 ± 0.22 (3 up, 0 down): above"
    assert vs_own_cell(-3.63, 1.06, 0, 3) == "-3.63 ± 1.06 (0 up, 3 down): below"
    assert vs_own_cell(-0.04, 0.29, 1, 2) == "-0.04 ± 0.29 (1 up, 2 down): level"
    assert vs_own_cell(0.01, float("nan"), 1, 0) == "+0.01 (1 up, 0 down): one seed"
    assert standing_word(2.0, 1.0) == "level" and standing_word(2.01, 1.0) == "above"


def _study_params() -> dict:
    """TINY_PARAMS for a study: the loss weights go to the row that trains with them (variant_params.mamba_fscil), not
    to params' own incremental section, where every row that fixes them (dual_ssm: 0) would refuse them."""
    params = {k: (dict(v) if isinstance(v, dict) else v) for k, v in TINY_PARAMS.items()}
    weights = {k: params["incremental"].pop(k) for k in ("lambda1", "lambda2", "lambda3")}
    params["variant_params"] = {"mamba_fscil": {"incremental": weights}}
    return params


def test_tiny_study_end_to_end(tmp_path, monkeypatch):
    params = _study_params()
    out = tmp_path / "ablation"
    said = []
    sessions = study.run_study(params, ["dual_ssm", "mamba_fscil"], [0, 1], out, log=said.append)
    assert not any("reusing" in line for line in said)
    assert [line.split(" runs,")[0] for line in said if line.startswith("[")] == ["[1/4", "[2/4", "[3/4", "[4/4"]
    assert all(" ETA " in line for line in said if line.startswith("["))
    runs = pd.read_csv(out / "runs.csv")
    assert sorted(zip(runs.variant, runs.seed, strict=True)) == [("dual_ssm", 0), ("dual_ssm", 1),
                                                                ("mamba_fscil", 0), ("mamba_fscil", 1)]
    assert set(sessions.groupby(["variant", "seed"]).size()) == {4}  # base + 3 sessions each
    table = pd.read_csv(out / "table.csv", header=[0, 1], index_col=0)
    mean = sessions[sessions.variant == "mamba_fscil"].groupby("seed")["acc"].mean().mean()
    assert table.loc["mamba_fscil", ("avg", "mean")] == pytest.approx(mean, abs=1e-3)
    assert (out / "accuracy.png").stat().st_size > 0 and (out / "table.md").is_file()
    # the projector's parameter count of the last session (the expanding baseline's grows), none for the NCM row
    count = int(sessions["projector_parameters"].dropna().iloc[-1])
    assert table.loc["mamba_fscil", ("params", "final")] == count
    md = (out / "table.md").read_text().splitlines()
    assert next(line for line in md if line.startswith("| mamba_fscil")).endswith(f"| {count:,} |")
    # the prototype row is the class means of mamba_fscil's backbones (the reference when present), and says so
    assert next(line for line in md if line.startswith(f"| {prototype_label('mamba_fscil')} |")).endswith("| - |")
    # both variants have the same model and base sections: one base model per seed serves both
    assert len(list((tmp_path / "ablation.work" / "bases").iterdir())) == 2

    def fail(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(study, "run_candidate", fail)
    said.clear()
    again = study.run_study(params, ["dual_ssm", "mamba_fscil"], [0, 1], out, log=said.append)
    pd.testing.assert_frame_equal(again, sessions)
    assert said[0] == f"study: reusing 4 of 4 runs stored in {tmp_path / 'ablation.work'}"
    # runs stored by other code are refused, unless the user asks to reuse them
    monkeypatch.setattr(workdir, "code_digest", lambda: "f" * 64)  # where run_once reads it
    with pytest.raises(FSCILError, match=r"ablation\.work: holds runs made by other code .*--reuse-stale"):
        study.run_study(params, ["dual_ssm", "mamba_fscil"], [0, 1], out)
    stale = study.run_study(params, ["dual_ssm", "mamba_fscil"], [0, 1], out, reuse_stale=True)
    pd.testing.assert_frame_equal(stale, sessions)


def test_variants_that_resolve_to_the_same_values_are_trained_once(tmp_path, monkeypatch):
    """arch_selective_ssm with lambda1 0 (selected for it) reads what dual_ssm reads: one training serves both names;
    a variant that reads other values (mamba_fscil, losses on) trains its own."""
    params = _study_params()
    params["variant_params"]["arch_selective_ssm"] = {"incremental": {"lambda1": 0.0}}
    real, trained = study.run_candidate, []
    monkeypatch.setattr(study, "run_candidate", lambda cfg, *args: trained.append(cfg.variant) or real(cfg, *args))
    out, said = tmp_path / "ablation", []
    sessions = study.run_study(params, ["dual_ssm", "arch_selective_ssm", "mamba_fscil"], [0], out, log=said.append)
    assert trained == ["dual_ssm", "mamba_fscil"]
    assert "arch_selective_ssm seed 0: the same run as dual_ssm (every value it reads is equal)" in said
    a, b = (sessions[sessions.variant == v].drop(columns="variant").reset_index(drop=True)
            for v in ("dual_ssm", "arch_selective_ssm"))
    pd.testing.assert_frame_equal(a, b)
    runs = pd.read_csv(out / "runs.csv")
    assert sorted(runs.variant) == ["arch_selective_ssm", "dual_ssm", "mamba_fscil"]
    # one stored record for the two names; a later study with lambda1 on trains arch_selective_ssm apart
    stored = json.loads((tmp_path / "ablation.work" / study.RUNS_FILE).read_text())
    assert sorted(r["variant"] for r in stored.values()) == ["dual_ssm", "mamba_fscil"]
    params["variant_params"]["arch_selective_ssm"]["incremental"]["lambda1"] = 10.0
    trained.clear()
    study.run_study(params, ["dual_ssm", "arch_selective_ssm"], [0], out)
    assert trained == ["arch_selective_ssm"]


def test_single_ssm_takes_dual_ssms_base_model_less_g_inc(tmp_path, monkeypatch):
    """The two projectors' base sessions train the same network (g_inc gets no gradient there), so a study trains
    dual_ssm's base model once and derives single_ssm's from it. Oracle: single_ssm's own base training gives exactly
    the derived model, tensor for tensor, with the same digest and test accuracy."""
    params = _study_params()
    single, dual = (build_config({**params, "variant": v}) for v in ("single_ssm", "dual_ssm"))
    assert base_twin(single).model == dual.model and base_twin(dual) is None
    # not where something after g_inc draws from the global generator: a linear head's init (its weights differ
    # between the two projectors, so a derived model would not be the trained one), timm's stochastic depth
    linear = [dataclasses.replace(c.model, classifier="linear") for c in (single, dual)]
    heads = [build_model(m, 10, 32, seed=0).classifier.fc.weight for m in linear]
    assert not torch.equal(*heads)
    for key, value in (("classifier", "linear"), ("backbone", "vit_b16")):
        assert base_twin(dataclasses.replace(single, model=dataclasses.replace(single.model, **{key: value}))) is None
    pack = tmp_path / "pack.h5"
    build_pack(single.data, pack)
    for cfg, out in ((single, "own"), (dual, "dual")):
        train_base(cfg, pack, tmp_path / out, tmp_path / f"{out}.resume", show_progress=False)
    derive_base_model(single, tmp_path / "dual", pack, tmp_path / "derived")
    own, own_meta = load_checkpoint(tmp_path / "own" / MODEL_FILE)
    derived, derived_meta = load_checkpoint(tmp_path / "derived" / MODEL_FILE)
    twin, _ = load_checkpoint(tmp_path / "dual" / MODEL_FILE)
    assert sorted(derived) == sorted(own) == sorted(k for k in twin if not k.startswith("projector.g_inc."))
    assert len(twin) > len(own)
    assert all(torch.equal(derived[k], own[k]) for k in own)
    assert derived_meta == own_meta
    metrics = [json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("own", "derived")]
    assert metrics[1]["acc"] == metrics[0]["acc"] and metrics[1]["per_class_acc"] == metrics[0]["per_class_acc"]
    assert (metrics[1]["projector"], metrics[1]["trained_as"]) == ("single_ssm", "dual_ssm")

    # a study trains one base model per seed for both; single_ssm's sessions start from the derived one
    real, trained = base_session.train_base, []
    monkeypatch.setattr(base_session, "train_base", lambda cfg, *a, **k: trained.append(cfg.model.projector) or real(
        cfg, *a, **k))
    sessions = study.run_study(params, ["single_ssm", "dual_ssm"], [0], tmp_path / "study")
    assert trained == ["dual_ssm"]
    first = sessions[sessions.session == 0].set_index("variant")
    assert first.loc["single_ssm", "acc"] == first.loc["dual_ssm", "acc"] == metrics[0]["acc"]
    assert len(list((tmp_path / "study.work" / "bases").iterdir())) == 2  # dual_ssm's and the derived one


def test_a_diverging_run_is_listed_not_averaged(tmp_path, monkeypatch):
    params = _study_params()
    real = study.run_candidate

    def run(cfg, *args):
        if cfg.variant == "mamba_fscil" and cfg.seed == 1:
            raise TrainingDiverged("session 1: non-finite loss at step 3; nothing written")
        return real(cfg, *args)

    monkeypatch.setattr(study, "run_candidate", run)
    out = tmp_path / "ablation"
    said = []
    sessions = study.run_study(params, ["dual_ssm", "mamba_fscil"], [0, 1], out, log=said.append)
    assert not any("reusing" in line for line in said)
    assert set(zip(sessions.variant, sessions.seed, strict=True)) == {("dual_ssm", 0), ("dual_ssm", 1),
                                                                     ("mamba_fscil", 0)}
    table = pd.read_csv(out / "table.csv", header=[0, 1], index_col=0)
    assert table.loc["mamba_fscil", ("seeds", "n")] == 1 and table.loc["mamba_fscil", ("diverged", "n")] == 1
    assert table.loc["dual_ssm", ("diverged", "n")] == 0
    assert "mamba_fscil seed 1 diverged: session 1: non-finite loss" in (out / "table.md").read_text()
    # a refusal recorded under older divergence rules is run again (the current rules may accept it); others are not
    runs_path = tmp_path / "ablation.work" / study.RUNS_FILE
    runs = json.loads(runs_path.read_text())
    refused = [r for r in runs.values() if "diverged" in r]
    assert len(refused) == 1 and refused[0]["divergence_rules"] == TrainingDiverged.RULES
    del refused[0]["divergence_rules"]
    runs_path.write_text(json.dumps(runs))
    again = []
    monkeypatch.setattr(study, "run_candidate", lambda cfg, *args: again.append((cfg.variant, cfg.seed)) or real(
        cfg, *args))
    sessions = study.run_study(params, ["dual_ssm", "mamba_fscil"], [0, 1], out)
    assert again == [("mamba_fscil", 1)] and len(set(zip(sessions.variant, sessions.seed, strict=True))) == 4


def test_a_study_whose_every_run_diverged_is_a_one_line_error_with_nothing_written(tmp_path, monkeypatch):
    def run(cfg, *args):
        raise TrainingDiverged(f"session 1: non-finite loss at step {cfg.seed + 3}; nothing written")

    monkeypatch.setattr(study, "run_candidate", run)
    out = tmp_path / "ablation"
    with pytest.raises(FSCILError, match=r"every run diverged \(first: dual_ssm seed 1, session 1: non-finite loss "
                                         r"at step 4; nothing written\); nothing written to"):
        study.run_study(_study_params(), ["dual_ssm"], [1, 2], out)
    assert not out.exists()


def test_run_key_covers_what_a_run_reads_and_not_the_selection_candidates():
    from pipeline.config import build_config

    def key(**extra):
        return study.run_key(build_config({**TINY_PARAMS, "variant": "linear_ce", "seed": 1, **extra}))

    plain = key()
    assert plain.startswith("s1/")
    assert key(selection={"lr": [0.1, 0.01], "lambda1": [3.0]}) == plain  # no run reads the candidates
    assert key(incremental={**TINY_PARAMS.get("incremental", {}), "lr": 0.0123}) != plain
    assert key(variant_params={"linear_ce": {"incremental": {"lr": 0.0123}}}) != plain  # its own selected values
    assert key(variant_params={"dual_ssm": {"incremental": {"lr": 0.0123}}}) == plain  # another row's
    assert key(seed=2) != plain
    # what a variant sets is in the key, its name is not: rows that resolve to the same values are one run
    no_loss = {"incremental": {k: v for k, v in TINY_PARAMS["incremental"].items() if not k.startswith("lambda")}}
    assert key(variant="dual_ssm", **no_loss) != plain
    same = {"variant_params": {"arch_selective_ssm": {"incremental": {"lambda1": 0.0}}}, **no_loss}
    assert key(variant="arch_selective_ssm", **same) == key(variant="dual_ssm", **no_loss)


def test_every_key_a_run_reads_is_in_its_digests():
    """No key is left out of the digests at any value (there were `added_field` exceptions at "neutral" values):
    the session, selection-candidate and base-model digests hash every field of their sections, so
    incremental.base_lr_scale 1.0 and 0.5 give different digests and study run keys. A key the run does not read
    is left out: with p_iden / g_base frozen, base_lr_scale has nothing to scale."""
    from pipeline.config import build_config
    from pipeline.config.sections import RUN_SECTION_TYPES
    from pipeline.research.selection import CANDIDATE_SECTIONS
    from pipeline.training.base_model import BASE_MODEL_SECTIONS, config_digest
    from pipeline.training.incremental_session import SECTIONS

    def cfg(scale, frozen=False):
        return build_config({**TINY_PARAMS, "incremental": {**TINY_PARAMS.get("incremental", {}),
                                                            "base_lr_scale": scale, "freeze_base": frozen}})

    hashed = cfg(1.0).to_dict(for_digest=True)
    later = {name: [f for f in dataclasses.fields(section) if f.metadata.get("added_later")]
             for name, section in RUN_SECTION_TYPES.items()}
    for name, section in RUN_SECTION_TYPES.items():
        # an `added_later` key is left out only at its default, the value every earlier run computed with
        assert set(hashed[name]) == {f.name for f in dataclasses.fields(section)} - {f.name for f in later[name]}, name
    assert [f.name for f in later["model"]] == ["num_classes"]
    room = build_config({**TINY_PARAMS, "model": {**TINY_PARAMS["model"], "num_classes": 16}})
    assert room.to_dict(for_digest=True)["model"]["num_classes"] == 16  # any other value is hashed
    assert config_digest(room, BASE_MODEL_SECTIONS) != config_digest(cfg(1.0), BASE_MODEL_SECTIONS)
    for sections in (SECTIONS, CANDIDATE_SECTIONS):
        assert config_digest(cfg(1.0), sections) != config_digest(cfg(0.5), sections)
    assert config_digest(cfg(1.0), BASE_MODEL_SECTIONS) == config_digest(cfg(0.5), BASE_MODEL_SECTIONS)
    assert study.run_key(cfg(1.0)) != study.run_key(cfg(0.5))
    assert config_digest(cfg(0.5, frozen=True), SECTIONS) == config_digest(cfg(1.0, frozen=True), SECTIONS)
    assert study.run_key(cfg(0.5, frozen=True)) == study.run_key(cfg(1.0, frozen=True)) != study.run_key(cfg(1.0))
    assert "base_lr_scale" in cfg(1.0, frozen=True).to_dict()["incremental"]  # params and reports still show it


def test_a_second_process_on_the_same_work_folder_stops_and_touches_nothing(tmp_path):
    """Two processes: one holds the study's work folder (as a running study does) with a scratch file in it; a study
    started on the same folder stops with one line and the first one's files stay."""
    import subprocess
    import sys

    from pipeline.atomic import mark_folder

    work = mark_folder(tmp_path / "ablation.work", "fscil study (work)")  # the other study's, as it made it
    (work / "sessions").mkdir(parents=True)
    (work / "sessions" / "in_progress").write_text("the other study's scratch")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pipeline.workdir import locked\n"
        f"with locked({str(work)!r}, 'fscil study'):\n    print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FSCILError, match=rf"in use by another fscil study or select \(pid {holder.pid}\)"):
            study.run_study(_study_params(), ["dual_ssm"], [0], tmp_path / "ablation")
        assert (work / "sessions" / "in_progress").read_text() == "the other study's scratch"
        assert not (tmp_path / "ablation").exists()
    finally:
        holder.kill()
        holder.wait()


def test_bad_arguments_make_no_folder(tmp_path):
    from tests.pipeline_fixtures import cli, write_params

    params = write_params(tmp_path / "params.yaml")
    out = tmp_path / "studies" / "x"
    result = cli("study", "--in-process", "--params", str(params), "--variants", "mamba_fscil,nope", "--out", str(out))
    assert result.exit_code == 2 and "variant 'nope' does not exist" in result.output
    assert not (tmp_path / "studies").exists()


def test_jobs_2_gives_the_table_of_jobs_1(tmp_path):
    """Two processes at once (one per base model: here one per seed), the same runs and the same table as one."""
    params = _study_params()
    one = study.run_study(params, ["dual_ssm", "mamba_fscil"], [0, 1], tmp_path / "one")
    said: list[str] = []
    two = study.run_study(params, ["dual_ssm", "mamba_fscil"], [0, 1], tmp_path / "two", jobs=2, log=said.append)
    assert "study: 4 runs in 2 groups (one per base model) over 2 processes" in said
    groups = [line for line in said if " groups, " in line]  # a line per finished group, with runs and an ETA
    assert [line.split(",")[0] for line in groups] == ["[1/2 groups", "[2/2 groups"] and " 4/4 runs, " in groups[-1]
    assert all(" ETA " in line for line in groups) and "[4/4 runs] " in "\n".join(said)
    pd.testing.assert_frame_equal(one, two)
    assert (tmp_path / "one" / "table.md").read_text() == (tmp_path / "two" / "table.md").read_text()
    assert not list((tmp_path / "two.work").glob("runs.part*.json"))


def test_study_workers_take_the_visible_gpus_round_robin(monkeypatch):
    """--jobs N on a machine with several GPUs: worker i sees only GPU i mod count (as the parent names them)."""
    import multiprocessing

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7,9")
    assert parallel.visible_gpus() == ["5", "7"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert parallel.visible_gpus() == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # restored after the test: pin_gpu sets it
    counter = multiprocessing.get_context("spawn").Value("i", 0)
    seen = []
    for _ in range(3):
        parallel.pin_gpu(counter, ["5", "7"])
        seen.append(os.environ["CUDA_VISIBLE_DEVICES"])
    assert seen == ["5", "7", "5"]
