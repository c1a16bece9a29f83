""".ci/gpu-paper-scale, the prepared run of a lent GPU machine, at tiny sizes on the CPU: it times every paper
preset's stages on data of its benchmark's shape (each with its own base schedule: miniImageNet's lr steps at
epochs 200-450 once stopped a run cut to a few epochs) and leaves the tables where the device tool fetches them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from tests.pipeline_fixtures import TINY_MODEL

REPO = Path(__file__).resolve().parents[1]


# preset: (sessions, base epochs, a pass of base.repeat epochs)
PRESETS = {"cifar100": (8, 200, 4), "mini_imagenet": (8, 500, 10), "cub200": (10, 80, 4)}
TINY = [f"model.{k}={v}" for k, v in TINY_MODEL.items() if k not in ("backbone_widths", "dim")] + [
    "model.backbone_widths=[8,8,16,16]", "model.dim=256", "data.train_per_class=2", "data.test_per_class=1",
    "data.novel_pool_per_class=5", "base.batch_size=64", "incremental.steps=[1]", "device=cpu"]


def _script(out: Path, presets: str, profiles: str, steps: str, extra: list[str]) -> str:
    """The script's run.log; its exit status must be 0 (a failed step is logged, the script goes on)."""
    env = {**os.environ, "OUT": str(out), "PACKS": str(out.parent / "packs"), "PRESETS": presets,
           "PROFILES": profiles, "EPOCHS": "1", "STEPS": steps, "PYTHON": sys.executable,
           "EXTRA": " ".join(f"-S {value}" for value in extra)}
    done = subprocess.run(["bash", str(REPO / ".ci" / "gpu-paper-scale")], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return (out / "run.log").read_text()


def test_the_config_check_resolves_every_preset_and_profile_first(tmp_path):
    log = _script(tmp_path / "out", " ".join(PRESETS), "exact fast", "check", TINY)
    assert "FAILED" not in log, log
    # what the check is for: a preset that refuses the run's settings is named in seconds, and not timed
    log = _script(tmp_path / "bad", "mini_imagenet", "fast", "check speed", [*TINY, "base.epochs=8"])
    assert "check: mini_imagenet fast FAILED" in log and "step_epochs" in log
    assert "speed: mini_imagenet fast skipped" in log and not (tmp_path / "bad" / "speed").exists()
    log = _script(tmp_path / "other", "cub200", "fast", "check", [*TINY, "base.epochs=8"])
    assert "FAILED" not in log, log


def test_the_gpu_script_times_the_paper_presets_end_to_end(tmp_path):
    """CIFAR-100 and miniImageNet (its lr steps), exact profile, their first pass; CUB-200's 224-px run costs
    minutes on this CPU, its config is resolved by the check above."""
    timed = ("cifar100", "mini_imagenet")
    log = _script(tmp_path / "out", " ".join(timed), "exact", "speed", TINY)
    assert "FAILED" not in log, log
    for preset in timed:
        sessions, epochs, repeat = PRESETS[preset]
        table = pd.read_csv(tmp_path / "out" / "speed" / f"{preset}-exact" / "speed.csv").set_index("stage")
        assert len(table) == 1 + 1 + 1 + sessions + 1 + 3, preset
        assert table.loc["base", "epochs"] == repeat and table.epochs.iloc[-1] == epochs, preset
    assert "no CUDA" in (tmp_path / "out" / "device.txt").read_text()
