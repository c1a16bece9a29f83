import os

import pytest
import torch

os.environ.setdefault("DVC_NO_ANALYTICS", "1")


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    yield
