"""The base loop reads its loss back every CHECK_EVERY steps (one wait for the device, not one per step): a base
step itself needs no value from the device, the Mixup/CutMix decisions come from a host generator, the epoch loss
is the mean of the per-step losses, and a non-finite loss is reported at the step where it first appeared."""

from __future__ import annotations

import math

import pytest
import torch

import pipeline.training.base_session as base_session
from pipeline.config import build_config
from pipeline.data.pack import ImagePack
from pipeline.errors import TrainingDiverged
from pipeline.models.registry import HEADS
from pipeline.training.distributed import ProcessGroup
from tests.pipeline_fixtures import TINY_PARAMS
from tests.test_session_readback import DeviceReads

MIXED = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "mix_prob": 1.0}


def test_read_losses_keeps_every_step_and_names_the_first_non_finite_one():
    pending = [torch.tensor([0.5, 3.0]), torch.tensor([0.25, 4.0])]  # (loss, images right) per step
    assert base_session.read_losses(pending, epoch=0, done=2) == [[0.5, 3.0], [0.25, 4.0]] and pending == []
    pending = [torch.tensor([1.0, 0.0]), torch.tensor([math.nan, 1.0]), torch.tensor([math.inf, 2.0])]
    with pytest.raises(TrainingDiverged, match=r"^base training: non-finite loss at epoch 3 step 19; nothing written"):
        base_session.read_losses(pending, epoch=2, done=20)  # steps 18, 19, 20: the first bad one is 19


def _run(paths, base: dict):
    cfg = build_config({**TINY_PARAMS, "device": "cpu", "base": {**TINY_PARAMS["base"], **base}})
    with ImagePack.open(paths.pack) as pack:
        return cfg, base_session.base_run(cfg, pack, torch.device("cpu"), ProcessGroup())


def _spread(run, n: int = 8) -> torch.Tensor:
    """n images of different classes where the pack has them (its base images are grouped by class)."""
    return torch.arange(n) * (len(run.images) // n)


def test_a_base_step_reads_nothing_back_from_the_device(tiny_run):
    """Forward, DR loss (+ the auxiliary CE), backward, SGD step and the global loss: no aten op that waits for the
    device (a scalar read, nonzero, a boolean-mask index)."""
    _, _, paths = tiny_run
    cfg, run = _run(paths, {**MIXED, "backbone_ce": 0.5})
    head = HEADS[cfg.model.classifier]
    idx = _spread(run)
    batch = base_session._base_batch(run.images[idx], run.targets[idx], run.num_base, run.preset, cfg.base, 0,
                                     torch.Generator().manual_seed(0), torch.Generator().manual_seed(1))
    assert not torch.equal(batch[1], batch[2]) and bool((batch[3] < 1).all())  # mixed
    base_session.base_step(cfg, run, head, batch)  # the first step builds the optimizer state
    with torch.no_grad():  # the logits this step sees (train-mode BatchNorm: batch statistics, as in the step)
        logits = run.net(batch[0])[0]
    with DeviceReads() as mode:
        loss, correct = base_session.base_step(cfg, run, head, batch)
    assert mode.seen == [] and loss.shape == () and bool(torch.isfinite(loss))
    # the training accuracy's count: images whose arg-max is the larger share of their mix
    dominant = torch.where(batch[3] >= 0.5, batch[1], batch[2])
    assert correct.item() == (logits.argmax(dim=1) == dominant).sum().item()


def test_the_mixing_draws_come_from_the_host_generator_alone(tiny_run):
    """Same host generator: the same mixing (lambda, partners) whatever the augmentation's generator; another host
    generator: another mixing. So on a GPU the decisions need no value from the device's generator."""
    _, _, paths = tiny_run
    cfg, run = _run(paths, MIXED)
    idx = _spread(run)

    def batch(aug_seed: int, host_seed: int):
        return base_session._base_batch(run.images[idx], run.targets[idx], run.num_base, run.preset, cfg.base, 0,
                                        torch.Generator().manual_seed(aug_seed),
                                        torch.Generator().manual_seed(host_seed))

    a, b, c = batch(0, 5), batch(1, 5), batch(0, 6)
    assert torch.equal(a[2], b[2]) and torch.equal(a[3], b[3])  # partners' targets and lambda
    assert not torch.equal(a[0], b[0])  # the augmentation did change
    assert not (torch.equal(a[2], c[2]) and torch.equal(a[3], c[3]))


def test_an_epoch_reads_back_every_check_every_steps_and_averages_the_steps(tiny_run, monkeypatch):
    _, _, paths = tiny_run
    cfg, run = _run(paths, {"batch_size": 4})
    steps = len(run.images) // 4
    monkeypatch.setattr(base_session, "CHECK_EVERY", 3)
    reads, steps_losses = [], []
    real_read, real_step = base_session.read_losses, base_session.base_step
    monkeypatch.setattr(base_session, "read_losses", lambda pending, *a: reads.append(len(pending)) or
                        real_read(pending, *a))
    monkeypatch.setattr(base_session, "base_step", lambda *a: steps_losses.append((out := real_step(*a)).tolist())
                        or out)
    mean, accuracy = base_session.train_epoch(cfg, run, 0, torch.device("cpu"), show_progress=False)
    assert reads == [3] * (steps // 3) + ([steps % 3] if steps % 3 else [])
    assert mean == round(sum(loss for loss, _ in steps_losses) / steps, 6)
    assert accuracy == round(100 * sum(right for _, right in steps_losses) / (4 * steps), 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_base_epoch_runs_under_sync_debug_mode(tiny_run):
    """On CUDA a whole epoch with Mixup/CutMix on waits for the device only at its read-backs."""
    _, _, paths = tiny_run
    cfg = build_config({**TINY_PARAMS, "device": "cuda", "base": {**TINY_PARAMS["base"], **MIXED}})
    with ImagePack.open(paths.pack) as pack:
        run = base_session.base_run(cfg, pack, torch.device("cuda"), ProcessGroup())
    base_session.train_epoch(cfg, run, 0, torch.device("cuda"), show_progress=False)
    reads = []
    real = base_session.read_losses

    def read_outside_debug(pending, *a):
        torch.cuda.set_sync_debug_mode("default")
        reads.append(len(pending))
        try:
            return real(pending, *a)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    base_session.read_losses = read_outside_debug
    torch.cuda.set_sync_debug_mode("error")
    try:
        base_session.train_epoch(cfg, run, 1, torch.device("cuda"), show_progress=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        base_session.read_losses = real
    assert reads
