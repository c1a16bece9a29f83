"""A grid the way researchers run one (README "Compare runs"): `dvc exp run --queue`, then `make queue J=2` (DVC's
`dvc queue start -j 2` with the environment on its workers' PATH: they call `dvc` by name), in a git repository
holding the pipeline at the tiny preset, with nothing activated (PATH has no environment). Each queued experiment
gives the numbers the same settings give run alone."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.config import session_map
from tests.pipeline_fixtures import TINY_PARAMS, project_copy, run_pipeline

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(not (BIN / "dvc").exists(), reason="dvc is not installed in this environment")
# what an unactivated shell has: no environment's bin on PATH
PLAIN_PATH = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p).resolve() != BIN.resolve())


def _run(cmd: list[str], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({"DVC_NO_ANALYTICS": "1", "PATH": PLAIN_PATH, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def tiny_repository(project: Path, params: dict) -> str:
    """`project` (the pipeline copied, the environment linked as a clone's .venv) with `params` as a committed git
    and DVC repository, branch main; returns the dvc command."""
    project_copy(project, ".gitignore", "Makefile")
    (project / ".venv").symlink_to(sys.prefix)  # a clone after `make install` (git-ignored, in no experiment's copy)
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    dvc = str(BIN / "dvc")
    _run(["git", "init", "-q", "-b", "main"], project)
    _run([dvc, "init", "-q"], project)
    _run(["git", "add", "-A"], project)
    _run(["git", "commit", "-qm", "the tiny pipeline"], project)
    return dvc


def _with(params: dict, change: dict) -> dict:
    """params with `-S`-style dotted keys set."""
    out = yaml.safe_load(yaml.safe_dump(params))
    for key, value in change.items():
        *sections, last = key.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[last] = value
    return out


def test_two_queued_experiments_run_side_by_side_and_each_gives_its_numbers_alone(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    # one intra-op thread each: two experiments at once on a small CPU (threads is a param: the runs alone use it too)
    params = {**TINY_PARAMS, "threads": 1, "sessions": session_map(3)}
    dvc = tiny_repository(project, params)

    grid = {"seed-1": {"seed": 1}, "lam5": {"incremental.lambda1": 5.0}}
    for name, change in grid.items():
        _run([dvc, "exp", "run", "--queue", "-n", name, *(f"-S{k}={v}" for k, v in change.items())], project)
    _run(["make", "-o", ".venv/bin/fscil", "queue", "J=2"], project)  # -o: the environment is installed
    deadline = time.monotonic() + 900
    while True:
        status = _run([dvc, "queue", "status"], project)
        states = {line.split()[1]: line.split()[-1] for line in status.splitlines()[1:] if len(line.split()) > 2}
        if all(name in states and states[name] in ("Success", "Failed") for name in grid):
            break
        assert time.monotonic() < deadline, status
        time.sleep(2)
    assert all(states[name] == "Success" for name in grid), (status, _run([dvc, "queue", "logs", "lam5"], project))

    rows = {r["Experiment"]: r for r in csv.DictReader(io.StringIO(_run([dvc, "exp", "show", "--csv"], project)))}
    threads = torch.get_num_threads()  # the runs alone set the params' thread count in this process
    for name, change in grid.items():
        queued = json.loads(_run(["git", "show", f"{rows[name]['rev']}:metrics.json"], project))
        alone = tmp_path / name
        alone.mkdir()
        alone_params = alone / "params.yaml"
        alone_params.write_text(yaml.safe_dump(_with(params, change)))
        try:
            run_pipeline(alone_params, alone / "data", alone / "metrics.json")
        finally:
            torch.set_num_threads(threads)
        assert queued == json.loads((alone / "metrics.json").read_text()), name
    assert rows["seed-1"]["avg"] != rows["lam5"]["avg"]  # two different runs, not one run twice
