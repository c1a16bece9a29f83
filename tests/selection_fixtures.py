"""Shared by the `fscil select` tests: a tiny prepared pack whose base session the selection splits, and the
candidate sets that keep a whole selection to one tiny base model."""

from __future__ import annotations

from pathlib import Path

from stages.paths import StagePaths
from tests.pipeline_fixtures import run_stage, write_params

# of the 8 base classes: 4 pseudo-base + 2 pseudo sessions x 2 ways; one candidate per factor but two for
# freeze_base, so the whole selection trains one tiny base model and four candidates
TINY_SELECTION = {"sessions": 2, "protocols": 1, "freeze_base": [True, False], "suppression": ["z"], "k_paths": [4],
                  "inc_init": ["random"], "steps": [], "mixup_prob": [], "memory": [], "memory_k": [], "replay": [],
                  "copy": [], "base_copy": [], "lambda1": [10.0], "lambda2": [0.1], "lambda3": [0.1]}


def prepared_pack(root: Path) -> tuple[Path, StagePaths]:
    """(params.yaml, paths) of a prepared tiny pack under root, its selection section TINY_SELECTION."""
    # suppression pinned to z: the expected candidate orders in the tests do not follow the preset's value
    params = write_params(root / "params.yaml", selection=TINY_SELECTION, incremental={"suppression": "z"})
    run_stage("prepare", params, root / "data")
    return params, StagePaths(root / "data")
