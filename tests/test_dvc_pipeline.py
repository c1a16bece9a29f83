"""`dvc repro` on a tiny 8-session synthetic benchmark: the dvc.yaml wiring, metrics.json, and per-stage caching."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.pipeline_fixtures import TINY_PARAMS

REPO = Path(__file__).resolve().parents[1]
DVC = Path(sys.executable).with_name("dvc")
pytestmark = pytest.mark.skipif(not DVC.exists(), reason="dvc is not installed in this environment")


def _run(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{DVC.parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def test_dvc_repro_runs_every_session_and_caches_per_stage(tmp_path):
    for name in ("dvc.yaml", ".dvcignore"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "pipeline", tmp_path / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    params = {**TINY_PARAMS, "data": {**TINY_PARAMS["data"], "ways": 1, "sessions": 8}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    _run(["git", "init", "-q"], tmp_path)
    _run([str(DVC), "init", "-q"], tmp_path)
    _run([str(DVC), "repro"], tmp_path)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert list(metrics["sessions"]) == [f"s{i}" for i in range(9)]
    accs = list(metrics["sessions"].values())
    assert metrics["avg"] == pytest.approx(sum(accs) / 9, abs=1e-3) and metrics["pd"] == pytest.approx(
        accs[0] - accs[-1], abs=1e-3)
    for session in range(1, 9):
        m = json.loads((tmp_path / "data" / "sessions" / f"session_{session}" / "metrics.json").read_text())
        assert m["num_seen_classes"] == 8 + session
    # nothing changed: nothing runs; an incremental-only change re-runs the sessions and the report only
    assert "didn't change" in _run([str(DVC), "repro"], tmp_path)
    base_bytes = (tmp_path / "data" / "base" / "model.safetensors").read_bytes()
    params["incremental"] = {**params["incremental"], "lambda3": 0.0}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    status = _run([str(DVC), "status"], tmp_path)
    assert "incremental@1" in status and "base:" not in status and "extract:" not in status
    _run([str(DVC), "repro"], tmp_path)
    assert (tmp_path / "data" / "base" / "model.safetensors").read_bytes() == base_bytes
    assert json.loads((tmp_path / "metrics.json").read_text())["sessions"]["s0"] == metrics["sessions"]["s0"]
