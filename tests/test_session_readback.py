"""The session loop reads its loss terms back every CHECK_EVERY steps (one wait for the device, not one per step):
the history is the per-step values, and a non-finite loss is reported at the step where it first appeared."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.errors import TrainingDiverged
from pipeline.training.incremental_session import read_back


def test_read_back_keeps_every_step_and_names_the_first_non_finite_one():
    history = {"loss": [1.0], "cls": [1.0], "supp": [0.0], "sep": [0.0]}
    rows = [torch.tensor([0.5 + i, 0.25, 0.125, 0.0625]) for i in range(3)]
    pending = list(rows)
    read_back(pending, history, session=2, done=4)
    assert pending == [] and history["loss"] == [1.0, 0.5, 1.5, 2.5] and history["sep"][1:] == [0.0625] * 3
    pending = [torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([math.nan, 1.0, 0.0, 0.0]),
               torch.tensor([math.inf, 1.0, 0.0, 0.0])]
    with pytest.raises(TrainingDiverged, match=r"^session 2: non-finite loss at step 39; nothing written"):
        read_back(pending, history, session=2, done=40)  # steps 38, 39, 40: the first bad one is 39
