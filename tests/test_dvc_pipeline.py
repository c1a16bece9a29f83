"""`dvc repro` on tiny synthetic benchmarks: sessions from params, metrics.json, and exact per-stage re-runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.config import session_map
from tests.pipeline_fixtures import TINY_PARAMS, project_copy

DVC = Path(sys.executable).with_name("dvc")
pytestmark = pytest.mark.skipif(not DVC.exists(), reason="dvc is not installed in this environment")


def _env(project: Path) -> dict[str, str]:
    # the copied project's code, not the installed checkout's, runs the stages (an edited preset must be seen)
    return {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{DVC.parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(project)}


def _run(cmd: list[str], cwd: Path) -> str:
    result = subprocess.run(cmd, cwd=cwd, env=_env(cwd), capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def _ran(output: str) -> set[str]:
    return {line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")}


def test_dvc_repro_runs_the_sessions_params_list_and_reruns_exactly_the_readers(tmp_path):
    """A 10-session protocol through an unedited dvc.yaml (the sessions come from params.yaml); nothing changed:
    nothing runs; a preset value of the incremental section re-runs exactly config, the sessions and the report."""
    project_copy(tmp_path)
    params = {**TINY_PARAMS, "data": {**TINY_PARAMS["data"], "base_classes": 6, "ways": 1, "sessions": 10},
              "sessions": session_map(10)}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    _run(["git", "init", "-q"], tmp_path)
    _run([str(DVC), "init", "-q"], tmp_path)
    first = _ran(_run([str(DVC), "repro"], tmp_path))
    sessions = {f"incremental@{n}" for n in range(1, 11)}
    assert first == {"config", "prepare", "base", "extract", "report"} | sessions
    metrics = json.loads((tmp_path / "data" / "report" / "details.json").read_text())
    assert list(metrics["sessions"]) == [f"s{i}" for i in range(11)]
    accs = list(metrics["sessions"].values())
    assert metrics["avg"] == pytest.approx(sum(accs) / 11, abs=1e-3) and metrics["pd"] == pytest.approx(
        accs[0] - accs[-1], abs=1e-3)
    for session in range(1, 11):
        m = json.loads((tmp_path / "data" / "sessions" / f"session_{session}" / "metrics.json").read_text())
        assert m["num_seen_classes"] == 6 + session
    assert _ran(_run([str(DVC), "repro"], tmp_path)) == set()  # nothing changed: nothing runs

    # a preset value only the incremental stages read (TINY_PARAMS leaves incremental.dr_scale to the preset)
    base_bytes = (tmp_path / "data" / "base" / "model.safetensors").read_bytes()
    preset = tmp_path / "pipeline" / "presets" / "synthetic.yaml"
    text = preset.read_text()
    assert "  dr_scale: 10.0\n" in text.split("\nincremental:")[1].split("selection:")[0]
    head, tail = text.split("\nincremental:")
    preset.write_text(head + "\nincremental:" + tail.replace("  dr_scale: 10.0\n", "  dr_scale: 5.0\n", 1))
    assert _ran(_run([str(DVC), "repro"], tmp_path)) == {"config", "report"} | sessions
    assert (tmp_path / "data" / "base" / "model.safetensors").read_bytes() == base_bytes
    assert json.loads((tmp_path / "metrics.json").read_text())["base"] == metrics["sessions"]["s0"]

    # a base-section value in params.yaml: base and everything after it, not prepare
    params["base"] = {**params["base"], "lr": 0.05}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert _ran(_run([str(DVC), "repro"], tmp_path)) == {"config", "base", "extract", "report"} | sessions

    # the device (recorded as resolved) and `deterministic`: every stage that computes is out of date, prepare and
    # the report are not (checked with `dvc status` after the config stage alone: this machine may have no GPU)
    run_yaml = tmp_path / "data" / "config" / "run.yaml"
    assert yaml.safe_load(run_yaml.read_text())["device"] == "cpu"
    computing = {"base", "extract"} | sessions
    for change in ({"device": "cuda"}, {"deterministic": False}):
        (tmp_path / "params.yaml").write_text(yaml.safe_dump({**params, **change}))
        assert _ran(_run([str(DVC), "repro", "config"], tmp_path)) == {"config"}
        status = json.loads(_run([str(DVC), "status", "--json"], tmp_path).splitlines()[-1])
        assert set(status) == computing, change


def test_dvc_repro_stops_on_a_session_list_that_does_not_match_the_data(tmp_path):
    project_copy(tmp_path)
    params = {**TINY_PARAMS, "data": {**TINY_PARAMS["data"], "sessions": 3}, "sessions": session_map(4)}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    _run(["git", "init", "-q"], tmp_path)
    _run([str(DVC), "init", "-q"], tmp_path)
    result = subprocess.run([str(DVC), "repro"], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "sessions lists 4" in errors[0] and "has 3" in errors[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "data" / "pack.h5").exists()


def test_dvc_reruns_exactly_what_a_code_change_touches(tmp_path):
    """Each stage depends on the code it runs (stages/dvc_deps.py): after one edit of each kind, `dvc status` lists
    exactly the stages that run that code. A help text, `fscil predict`, a selection grid or the Triton kernel: none;
    the session code: the sessions; the backbone: base training and everything that runs the network."""
    project_copy(tmp_path)
    params = {**TINY_PARAMS, "sessions": session_map(3)}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    _run(["git", "init", "-q"], tmp_path)
    _run([str(DVC), "init", "-q"], tmp_path)
    _run([str(DVC), "repro", "-q"], tmp_path)
    sessions = {f"incremental@{n}" for n in range(1, 4)}
    expected = {
        "stages/cli.py": set(),
        "stages/cli_tools.py": set(),
        "pipeline/research/selection_config.py": set(),
        "pipeline/ops/selective_scan_triton.py": set(),
        "pipeline/training/session_step.py": sessions,
        "pipeline/models/backbones/resnet12.py": {"base", "extract"} | sessions,
    }
    for path, stages in expected.items():
        file = tmp_path / path
        original = file.read_text()
        file.write_text(original + "# an edit\n")
        status = json.loads(_run([str(DVC), "status", "--json"], tmp_path).splitlines()[-1] or "{}")
        file.write_text(original)
        assert set(status) == stages, path
    assert json.loads(_run([str(DVC), "status", "--json"], tmp_path).splitlines()[-1] or "{}") == {}
