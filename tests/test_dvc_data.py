"""The user's data under DVC (README "Your data", data/raw/README.md): a class-folder tree made here, `dvc add`ed
under data/raw/ and committed, runs as a temporary experiment (which DVC runs in a copy holding only what git and
DVC track); a changed image makes `dvc status` name prepare; a tree that is there but not tracked is missing in such
a copy, and the prepare stage says so in one line with the command that tracks it."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from pipeline.config import session_map
from tests.data_fixtures import write_image
from tests.pipeline_fixtures import TINY_PARAMS, project_copy
from tests.test_dvc_queue import BIN, PLAIN_PATH, _run

pytestmark = pytest.mark.skipif(not (BIN / "dvc").exists(), reason="dvc is not installed in this environment")
CLASSES = 8  # 4 base classes + 2 sessions x 2 ways; 12 images each, 3 of them test images


def _class_folder(root, seed: int = 0) -> None:
    """root/class_<k>/img_<i>.png: each class its own colour, with noise (learnable in a few steps)."""
    rng = np.random.default_rng(seed)
    for k in range(CLASSES):
        colour = rng.integers(0, 256, 3)
        for i in range(12):
            pixels = np.clip(colour + rng.normal(0, 20, (16, 16, 3)), 0, 255).astype(np.uint8)
            write_image(root / f"class_{k}" / f"img_{i:02d}.png", pixels)


def test_tracked_data_runs_in_a_temporary_experiment_and_a_changed_image_reruns_prepare(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    project_copy(project, ".gitignore")
    (project / ".venv").symlink_to(sys.prefix)
    _class_folder(project / "data" / "raw" / "imgs")
    params = {k: v for k, v in TINY_PARAMS.items() if k not in ("data", "variant_params")}
    params["data"] = {"dataset": "class_folder", "root": "data/raw/imgs", "ways": 2, "shots": 2, "sessions": 2,
                      "test_fraction": 0.25, "image_size": 16}
    params["base"] = {**params["base"], "batch_size": 12, "epochs": 4}
    params["sessions"] = session_map(2)
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    dvc = str(BIN / "dvc")
    _run(["git", "init", "-q", "-b", "main"], project)
    _run([dvc, "init", "-q"], project)
    _run([dvc, "add", "-q", "data/raw/imgs"], project)
    _run(["git", "add", "-A"], project)
    tracked = _run(["git", "ls-files", "data/raw"], project).split()
    assert tracked == ["data/raw/.gitignore", "data/raw/README.md", "data/raw/imgs.dvc"]  # the images stay out of git
    _run(["git", "commit", "-qm", "the tiny pipeline on a class-folder tree"], project)

    _run([dvc, "exp", "run", "--temp", "-q", "-n", "on-imgs"], project)
    rows = {r["Experiment"]: r for r in csv.DictReader(io.StringIO(_run([dvc, "exp", "show", "--csv"], project)))}
    assert 0 < float(rows["on-imgs"]["avg"]) <= 100  # it ran to its report
    assert rows["on-imgs"]["data/raw"].endswith(".dir")  # which data ran: the folder's hash

    _run([dvc, "exp", "apply", "on-imgs"], project)  # the run's outputs in the workspace: everything up to date
    assert "up to date" in _run([dvc, "status"], project)
    write_image(project / "data" / "raw" / "imgs" / "class_3" / "img_00.png", np.zeros((16, 16, 3), np.uint8))
    status = _run([dvc, "status"], project)
    assert "prepare:" in status and "data/raw" in status.split("prepare:")[1].split("\n\n")[0]
    assert not [line for line in status.splitlines() if line.rstrip(":") in ("base", "extract", "report")]

    # a tree in the workspace but not tracked: the temporary copy lacks it, and prepare says what to run
    _class_folder(project / "data" / "raw" / "other", seed=1)
    failed = subprocess.run([dvc, "exp", "run", "--temp", "-n", "on-other", "-S", "data.root=data/raw/other"],
                            cwd=project, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PATH": PLAIN_PATH, "DVC_NO_ANALYTICS": "1"})
    said = failed.stdout + failed.stderr
    assert failed.returncode != 0
    errors = [line for line in said.splitlines() if line.startswith("error: params: data.root")]
    assert errors == ["error: params: data.root data/raw/other: not found in this experiment's copy, which holds "
                      "only what git and DVC track: track it with `dvc add data/raw/other` and commit the .dvc "
                      "file"], said
