"""The session loop reads its loss terms back every CHECK_EVERY steps (one wait for the device, not one per step):
the history is the per-step values, and a non-finite loss is reported at the step where it first appeared."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline.config import build_config
from pipeline.errors import TrainingDiverged
from pipeline.models.fscil import build_head
from pipeline.training.session_step import SessionDraws, read_back, train_step
from tests.pipeline_fixtures import TINY_PARAMS


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


class DeviceReads(TorchDispatchMode):
    """Records the aten ops, forward and backward, that need a value on the host: a scalar read (`.item()`,
    `bool(t)`, `float(t)`), nonzero, masked_select, and indexing with a boolean mask (its shape depends on data)."""

    READS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2"}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        indices = args[1] if name.startswith("index") and len(args) > 1 and isinstance(args[1], list | tuple) else ()
        if name in self.READS or any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def test_device_reads_sees_what_waits_for_the_device():
    x, mask = torch.randn(4, 3, requires_grad=True), torch.tensor([True, False, True, False])
    with DeviceReads() as mode:
        x[mask].sum().backward()
        bool(mask.any())
    assert "index" in mode.seen and "_local_scalar_dense" in mode.seen


HOST_READS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__float__", "__int__", "__index__")


def test_a_training_step_reads_nothing_back_from_the_device(monkeypatch):
    """train_step with every term on (suppression, separation, feature mixup, gradient clipping): no call that waits
    for the device (`.item()`, `.cpu()`, `.tolist()`, `bool(t)`, boolean-mask indexing via nonzero, ...). Checked
    by patching those methods to record their callers; on CUDA the same holds under torch's sync debug mode."""
    cfg = build_config({**TINY_PARAMS, "incremental": {**TINY_PARAMS["incremental"], "grad_clip_norm": 1.0},
                        "device": "cpu"})
    projector, classifier = build_head(cfg.model, 16, (2, 2), 12)
    projector.set_sessions(1)
    projector.freeze_base()
    trainable = [p for p in projector.parameters() if p.requires_grad] + list(classifier.parameters())
    opt = torch.optim.SGD(trainable, lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, 2, 2, generator=gen)
    y = torch.randint(0, 10, (8,), generator=gen)
    is_base = torch.tensor([True, False] * 4)
    frozen = projector.frozen_outputs(x, 8)
    args = (projector, classifier, opt, trainable, (x, y, is_base), 10, "etf", cfg.incremental,
            torch.randperm(8, generator=gen), frozen)
    train_step(*args)  # the first step builds the optimizer state
    with DeviceReads() as mode:
        train_step(*args)
    assert mode.seen == []
    reads = []
    for name in HOST_READS:
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _n=name, _r=real, **k: reads.append(_n) or
                            _r(self, *a, **k))
    monkeypatch.setattr(torch, "nonzero", lambda *a, **k: reads.append("torch.nonzero"))
    terms = train_step(*args)
    monkeypatch.undo()
    assert reads == []
    assert terms.shape == (4,) and bool(torch.isfinite(terms).all()) and float(terms[2]) != 0 and float(terms[3]) != 0
    if torch.cuda.is_available():
        moved = [t.cuda() if isinstance(t, torch.Tensor) else t for t in (x, y, is_base)]
        projector.cuda()
        classifier.cuda()
        cuda_args = (projector, classifier, opt, trainable, tuple(moved), 10, "etf", cfg.incremental,
                     args[8].cuda(), projector.frozen_outputs(moved[0], 8))
        train_step(*cuda_args)
        torch.cuda.set_sync_debug_mode("error")
        try:
            train_step(*cuda_args)
        finally:
            torch.cuda.set_sync_debug_mode("default")


def test_session_draws_follow_the_order_the_steps_made_them_in():
    """Drawn ahead, the draws are the ones the old in-loop code made from the same generator: an epoch's permutation,
    then per step a uniform against mixup_prob and, when it mixes, the partner permutation."""
    steps, rows, batch, prob = 7, 10, 4, 0.5
    draws = SessionDraws(torch.Generator().manual_seed(3), rows, steps, batch, prob, "cpu")
    gen = torch.Generator().manual_seed(3)
    for step in range(steps):
        if step % (rows // batch) == 0:
            order = torch.randperm(rows, generator=gen)
        idx, perm, lent = draws.step(step)
        assert torch.equal(idx, order[(step % 2) * batch:(step % 2 + 1) * batch]) and lent is None
        if float(torch.rand((), generator=gen)) < prob:
            assert torch.equal(perm, torch.randperm(batch, generator=gen))
        else:
            assert perm is None
    assert any(draws.mixed) and not all(draws.mixed)
