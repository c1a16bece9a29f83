"""stages/run, what dvc.yaml's stages run: `python -m stages.<stage>` with the active environment's Python (the one
beside its `fscil`), else the project's .venv, else one line saying what to do (so `dvc repro` from a shell that did
not activate anything works or says why not)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BARE_PATH = os.pathsep.join(p for p in ("/usr/bin", "/bin") if Path(p).is_dir())


def _project(root: Path) -> Path:
    (root / "stages").mkdir(parents=True)
    shutil.copy(REPO / "stages" / "run", root / "stages" / "run")
    return root / "stages" / "run"


def _fake_env(folder: Path, tag: str, fscil: bool = True) -> None:
    """A bin folder with a python that says who it is (and an fscil beside it)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("python", *(["fscil"] if fscil else [])):
        (folder / name).write_text(f'#!/bin/sh\necho "{tag} {name} $*"\n')
        (folder / name).chmod(0o755)


def _launch(launcher: Path, path: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(launcher), "report", "--quiet"], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": path, "HOME": str(cwd)})


def test_launcher_prefers_path_then_venv_then_says_what_to_do(tmp_path):
    launcher = _project(tmp_path / "proj")
    # nothing installed: one line naming the command to run, exit 127 (what a shell gives for a missing command)
    missing = _launch(launcher, BARE_PATH, tmp_path)
    assert missing.returncode == 127 and missing.stdout == ""
    assert missing.stderr.count("\n") == 1 and "make repro" in missing.stderr and "make install" in missing.stderr

    # the project's .venv, found from any working directory without activating it
    _fake_env(tmp_path / "proj" / ".venv" / "bin", "venv", fscil=False)
    venv = _launch(launcher, BARE_PATH, tmp_path)
    assert venv.returncode == 0 and venv.stdout == "venv python -m stages.launch report --quiet\n"

    # an activated environment (fscil on PATH) wins over .venv: the Python beside it
    _fake_env(tmp_path / "active", "active")
    active = _launch(launcher, f"{tmp_path / 'active'}{os.pathsep}{BARE_PATH}", tmp_path)
    assert active.returncode == 0 and active.stdout == "active python -m stages.launch report --quiet\n"


def test_every_dvc_stage_runs_through_the_launcher():
    import yaml

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    cmds = [s["do"]["cmd"] if "foreach" in s else s["cmd"] for s in stages.values()]
    assert cmds and all(cmd.startswith("stages/run ") for cmd in cmds)
    assert os.access(REPO / "stages" / "run", os.X_OK)
