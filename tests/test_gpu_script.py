""".ci/gpu-paper-scale, the prepared run of a lent GPU machine, at tiny sizes on the CPU: it times the CIFAR-100
preset's every stage on data of its shape and leaves the tables where the device tool fetches them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from tests.pipeline_fixtures import TINY_MODEL

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_script_times_a_paper_preset_end_to_end(tmp_path):
    tiny = [f"model.{k}={v}" for k, v in TINY_MODEL.items() if k not in ("backbone_widths", "dim")]
    tiny += ["model.backbone_widths=[8,8,16,16]", "model.dim=128", "data.train_per_class=9", "data.test_per_class=2",
             "data.novel_pool_per_class=5", "base.batch_size=256", "incremental.steps=[1]", "device=cpu"]
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PACKS": str(tmp_path / "packs"), "PRESETS": "cifar100",
           "PROFILES": "exact", "EPOCHS": "1",
           "STEPS": "speed", "PYTHON": sys.executable, "EXTRA": " ".join(f"-S {value}" for value in tiny)}
    done = subprocess.run(["bash", str(REPO / ".ci" / "gpu-paper-scale")], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    table = pd.read_csv(tmp_path / "out" / "speed" / "cifar100-exact" / "speed.csv")
    assert len(table) == 1 + 1 + 1 + 8 + 1 + 2 and table.set_index("stage").loc["base", "epochs"] == 1
    assert "no CUDA" in (tmp_path / "out" / "device.txt").read_text()
    assert "FAILED" not in (tmp_path / "out" / "run.log").read_text()
