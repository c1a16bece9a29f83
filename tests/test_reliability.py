"""Determinism, atomic outputs under SIGKILL, resumable base training, safe checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline.config import load_config, session_map
from pipeline.errors import FSCILError
from pipeline.training.base_resume import RESUME_FILE
from pipeline.training.base_session import train_base
from pipeline.training.checkpoint import load_checkpoint, save_checkpoint
from stages.paths import StagePaths
from tests.headroom import learned
from tests.pipeline_fixtures import cli, run_pipeline, run_stage, write_params

REPO = Path(__file__).resolve().parents[1]


def _same_tensors(a: Path, b: Path) -> None:
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys()
    for key in ta:
        assert torch.equal(ta[key], tb[key]), key


def test_same_params_and_seed_give_identical_metrics(tiny_run, tmp_path):
    root, params, paths = tiny_run
    run_pipeline(params, tmp_path / "data", tmp_path / "metrics.json")
    assert (tmp_path / "metrics.json").read_text() == (root / "metrics.json").read_text()
    _same_tensors(tmp_path / "data" / "base" / "model.safetensors", paths.base / "model.safetensors")
    for s in (1, 2, 3):
        a = json.loads((tmp_path / "data" / "sessions" / f"session_{s}" / "metrics.json").read_text())
        b = json.loads(paths.session(s).joinpath("metrics.json").read_text())
        assert a["history"] == b["history"] and a["per_class_acc"] == b["per_class_acc"]


def test_prepare_is_byte_identical_across_runs(tiny_run, tmp_path):
    root, params, paths = tiny_run
    run_stage("prepare", params, tmp_path)
    assert (tmp_path / "pack.h5").read_bytes() == paths.pack.read_bytes()


def test_another_seed_gives_another_model(tiny_run, tmp_path):
    _, _, paths = tiny_run
    params = write_params(tmp_path / "params.yaml", seed=1, data={"seed": 0})
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(paths.pack, data / "pack.h5")
    run_stage("base", params, data)
    a, b = load_file(str(data / "base" / "model.safetensors")), load_file(str(paths.base / "model.safetensors"))
    assert not torch.equal(a["projector.g_base.in_proj.weight"], b["projector.g_base.in_proj.weight"])


def test_resumed_base_training_reaches_the_same_weights(tiny_run, tmp_path):
    _, params, paths = tiny_run
    cfg = load_config(params)
    ckpt_dir, out = tmp_path / "base.resume", tmp_path / "base"
    assert train_base(cfg, paths.pack, out, ckpt_dir, stop_after_epoch=1, show_progress=False) == {}
    assert not out.exists() and (ckpt_dir / RESUME_FILE).is_file()
    _, meta = load_checkpoint(ckpt_dir / RESUME_FILE)
    assert meta["epoch"] == 1
    result = train_base(cfg, paths.pack, out, ckpt_dir, show_progress=False)
    _same_tensors(out / "model.safetensors", paths.base / "model.safetensors")
    reference = json.loads((paths.base / "metrics.json").read_text())
    assert result["train_loss"] == reference["train_loss"] and result["acc"] == reference["acc"]


def test_an_epoch_limit_cuts_the_configured_schedule_short(tiny_run, tmp_path):
    """`fscil speed --base-epochs`: the first epoch of the configured 3-epoch schedule (its lr by step), finished and
    written like a whole training: the weights of the uninterrupted run after its epoch 1 (its resume point); not
    the 1-epoch schedule's, whose cosine decays three times faster."""
    _, params, paths = tiny_run
    cfg = load_config(params)
    result = train_base(cfg, paths.pack, tmp_path / "cut", tmp_path / "cut.resume", epoch_limit=1, show_progress=False)
    reference = json.loads((paths.base / "metrics.json").read_text())
    assert reference["epochs"] == 3 and result["epochs"] == 1 and result["steps"] == reference["steps"] // 3
    assert result["train_loss"] == reference["train_loss"][:1]
    assert json.loads((tmp_path / "cut" / "metrics.json").read_text())["epochs"] == 1
    assert result["seconds_per_epoch"] > 0 and "seconds_per_epoch" not in reference  # a run time, kept out of files
    assert train_base(cfg, paths.pack, None, tmp_path / "full.resume", stop_after_epoch=1, show_progress=False) == {}
    after_one, _ = load_checkpoint(tmp_path / "full.resume" / RESUME_FILE)
    cut = load_file(str(tmp_path / "cut" / "model.safetensors"))
    assert all(torch.equal(cut[k], after_one[f"model.{k}"]) for k in cut)
    shorter = load_config(write_params(tmp_path / "short.yaml", base={"epochs": 1}))
    train_base(shorter, paths.pack, tmp_path / "short", tmp_path / "short.resume", show_progress=False)
    other = load_file(str(tmp_path / "short" / "model.safetensors"))
    assert not torch.equal(other["projector.g_base.in_proj.weight"], cut["projector.g_base.in_proj.weight"])


def test_sigkill_leaves_nothing_a_later_stage_accepts_and_rerun_matches(tiny_run, tmp_path):
    _, _, paths = tiny_run
    params = write_params(tmp_path / "params.yaml", base={"epochs": 12})
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(paths.pack, data / "pack.h5")
    # the killed process pins the CPU kernels as this process did (tests/conftest.py): the rerun below is in-process
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "stages.cli", "stage", "base", "--params", str(params), "--data-dir", str(data), "-q"]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    resume = data / "base.resume" / RESUME_FILE
    deadline = time.time() + 120
    while not resume.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the stage finished before it could be killed"
    assert not (data / "base").exists()
    # extract refuses to run on what is left
    result = cli("stage", "extract", "--params", str(params), "--data-dir", str(data), "-q")
    assert result.exit_code == 2 and "checkpoint not found" in result.output
    assert not (data / "features.zarr").exists()
    # the rerun resumes and ends exactly where an uninterrupted run ends
    run_stage("base", params, data)
    assert not list(data.glob(".base.tmp-*")) and not (data / "base.resume").exists()
    reference = tmp_path / "reference"
    reference.mkdir()
    shutil.copy(paths.pack, reference / "pack.h5")
    run_stage("base", params, reference)
    _same_tensors(data / "base" / "model.safetensors", reference / "base" / "model.safetensors")


def test_checkpoints_are_safetensors_and_refuse_foreign_metadata(tiny_run, tmp_path):
    root, params, paths = tiny_run
    ckpt = paths.base / "model.safetensors"
    assert ckpt.read_bytes()[8:9] == b"{"  # a safetensors JSON header, no pickle
    with pytest.raises(FSCILError, match="config does not match"):
        load_checkpoint(ckpt, {"config": "another"})
    # a base checkpoint trained with other model params is refused by the next stage
    other = write_params(tmp_path / "params.yaml", model={"dim": 24})
    result = cli("stage", "extract", "--params", str(other), "--data-dir", str(paths.data_dir), "-q")
    assert result.exit_code == 2 and "made with other params (model.dim: 16 there, 24 now)" in result.output
    assert "run `fscil stage base` with these params first" in result.output and result.output.count("\n") == 1
    # and one trained on another data pack
    data = tmp_path / "data"
    shutil.copytree(paths.data_dir, data, ignore=shutil.ignore_patterns("features.zarr", "sessions", "report"))
    tensors, meta = load_checkpoint(data / "base" / "model.safetensors")
    save_checkpoint(data / "base" / "model.safetensors", tensors, {**meta, "data": "0" * 64})
    result = cli("stage", "extract", "--params", str(params), "--data-dir", str(data), "-q")
    assert result.exit_code == 2 and "data does not match" in result.output
    assert not (data / "features.zarr").exists()


def test_incremental_refuses_a_store_from_another_checkpoint(tiny_run, tmp_path):
    _, params, paths = tiny_run
    data = tmp_path / "data"
    shutil.copytree(paths.data_dir, data, ignore=shutil.ignore_patterns("sessions", "report"))
    tensors, meta = load_checkpoint(data / "base" / "model.safetensors")
    tensors["projector.g_base.D"] = tensors["projector.g_base.D"] + 1  # "retrained" base model
    save_checkpoint(data / "base" / "model.safetensors", tensors, meta)
    result = cli("stage", "incremental", "--session", "1", "--params", str(params), "--data-dir", str(data), "-q")
    assert result.exit_code == 2 and "another base checkpoint" in result.output
    assert not (data / "sessions" / "session_1").exists()


def test_stage_paths_are_the_dvc_layout():
    paths = StagePaths()
    dvc = (REPO / "dvc.yaml").read_text()
    for path in (paths.pack, paths.base, paths.features, paths.report, paths.run_config):
        assert str(path) in dvc
    # the sessions: dvc.yaml's template and params.yaml's list (what each session starts from) name StagePaths'
    assert str(paths.session(1)).replace("_1", "_${key}") in dvc
    assert session_map(3) == {"1": str(paths.features), "2": str(paths.session(1)), "3": str(paths.session(2))}


@pytest.mark.parametrize("clip", [None, 1e-3])
def test_gradient_clipping_bounds_the_first_update(tiny_run, tmp_path, clip):
    _, _, paths = tiny_run
    data = tmp_path / "data"
    shutil.copytree(paths.data_dir, data, ignore=shutil.ignore_patterns("sessions", "report", "pack.h5"))
    params = write_params(tmp_path / "params.yaml", incremental={
        "steps": [1], "warmup_steps": 0, "lr": 1.0, "weight_decay": 0.0, "grad_clip_norm": clip})
    run_stage("incremental", params, data, "--session", "1")
    base, _ = load_checkpoint(data / "base" / "model.safetensors")
    after, _ = load_checkpoint(data / "sessions" / "session_1" / "state.safetensors")
    step = torch.cat([(after[k] - base["projector.g_inc." + k[len("adapting."):]]).flatten()
                      for k in after if k.startswith("adapting.")]).norm().item()
    if clip is None:
        learned("tiny_run.session1.unclipped_first_step", step, ">", 1e-2)  # far larger than the clip below
    else:
        assert step == pytest.approx(clip, rel=1e-3)  # lr 1 x gradient clipped to norm 1e-3


def test_base_lr_scale_scales_exactly_the_first_update_of_the_base_parts(tiny_run, tmp_path):
    """incremental.base_lr_scale with freeze_base false: one SGD step from the same start moves p_iden and g_base by
    scale x the step at scale 1, and g_inc by the same step either way."""
    _, _, paths = tiny_run
    steps = {}
    for scale in (1.0, 0.25):
        data = tmp_path / f"data_{scale}"
        shutil.copytree(paths.data_dir, data, ignore=shutil.ignore_patterns("sessions", "report", "pack.h5"))
        params = write_params(tmp_path / f"params_{scale}.yaml", incremental={
            "steps": [1], "warmup_steps": 0, "lr": 0.5, "weight_decay": 0.0, "freeze_base": False,
            "base_lr_scale": scale})
        run_stage("incremental", params, data, "--session", "1")
        base, _ = load_checkpoint(data / "base" / "model.safetensors")
        after, _ = load_checkpoint(data / "sessions" / "session_1" / "state.safetensors")
        steps[scale] = {
            part: torch.cat([(after[k] - base[origin(k)]).flatten() for k in after if k.startswith(part)])
            for part, origin in (("projector.", lambda k: k),
                                 ("adapting.", lambda k: "projector.g_inc." + k[len("adapting."):]))}
    assert {k.split(".")[1] for k in after if k.startswith("projector.")} <= {"p_iden", "g_base"}
    learned("tiny_run.session1.base_parts_first_step", steps[1.0]["projector."].norm(), ">", 1e-3)  # they train
    # atol: float32 rounding of weights near 1
    torch.testing.assert_close(steps[0.25]["projector."], 0.25 * steps[1.0]["projector."], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(steps[0.25]["adapting."], steps[1.0]["adapting."], rtol=1e-4, atol=1e-6)
