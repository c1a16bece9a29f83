"""Every projector kind learns novel classes in session 1 on real images (issue: the MLP baseline stayed at 0 %).

A small Omniglot protocol (20 base classes, one 5-way 5-shot session, CPU widths, a short base schedule) through
the pipeline's own training code; after session 1 the novel classes must be recognised far above chance
(1 / 25 seen classes = 4 %). Uses the shared Omniglot zip (tests only); skipped where it is absent, failed
when it is absent under CI.
"""

from __future__ import annotations

import pytest

from pipeline.config import build_config
from pipeline.data.prepare import build_pack
from pipeline.research.selection import run_candidate
from tests.data_fixtures import OMNIGLOT_SMALL1, omniglot_small1
from tests.headroom import TEST_SEED, learned
from tests.pipeline_fixtures import TEST_DEVICE

PARAMS = {"preset": "omniglot", "device": TEST_DEVICE, "threads": 2, "seed": TEST_SEED,
          "data": {"root": str(OMNIGLOT_SMALL1), "base_classes": 20, "ways": 5, "shots": 5, "sessions": 1},
          "base": {"epochs": 40, "batch_size": 64, "warmup_steps": 10}}


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    omniglot_small1()
    path = tmp_path_factory.mktemp("omniglot") / "pack.h5"
    build_pack(build_config(PARAMS).data, path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["mlp_baseline", "single_ssm", "dual_ssm", "mamba_fscil"])
def test_novel_classes_are_learned_in_session_one(pack, tmp_path, variant):
    cfg = build_config({**PARAMS, "variant": variant})
    result = run_candidate(cfg, pack, tmp_path / "bases", tmp_path / "sessions")
    base, session1 = result["table"]
    learned(f"omniglot[{variant}].base_accuracy", base["acc"], ">", 70.0)  # the base model itself is sound
    # ten times chance (4 %); the four variants x three seeds x two kernel paths measured 60-96
    learned(f"omniglot[{variant}].session1_novel_accuracy", session1["novel_acc"], ">=", 40.0)
    # and learning the novel classes did not wipe out the base classes
    learned(f"omniglot[{variant}].session1_base_accuracy_drop", base["acc"] - session1["base_acc"], "<=", 15.0)
