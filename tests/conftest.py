import os

import pytest
import torch

from stages.paths import StagePaths
from tests.pipeline_fixtures import run_pipeline, write_params

os.environ.setdefault("DVC_NO_ANALYTICS", "1")


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One complete tiny pipeline run (prepare .. report), shared by the stage and reliability tests."""
    root = tmp_path_factory.mktemp("run")
    params = write_params(root / "params.yaml")
    run_pipeline(params, root / "data", root / "metrics.json")
    return root, params, StagePaths(root / "data")
