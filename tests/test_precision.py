"""params `precision`: bf16 autocast in the training steps and extraction (the fast profile), fp32 untouched."""

from __future__ import annotations

import json

import pytest
import torch
import zarr

from pipeline.config import build_config
from pipeline.errors import FSCILError
from pipeline.models.fscil import build_head
from pipeline.precision import autocast
from pipeline.training.session_step import train_step
from tests.headroom import learned
from tests.pipeline_fixtures import NUM_SESSIONS, TINY_PARAMS, run_pipeline, write_params


def test_precision_is_validated_and_in_every_digest():
    assert build_config({}).precision == "fp32" and build_config({"precision": "bf16"}).precision == "bf16"
    with pytest.raises(FSCILError, match="precision must be one of fp32, bf16"):
        build_config({"precision": "fp16"})
    for device in ("cpu", "cuda"):  # it changes the numbers on any device
        assert build_config({"device": device, "precision": "bf16"}).to_dict(for_digest=True)["precision"] == "bf16"


def _step(precision: str):
    cfg = build_config({**TINY_PARAMS, "device": "cpu"})
    torch.manual_seed(0)
    projector, classifier = build_head(cfg.model, 16, (2, 2), 12)
    projector.set_sessions(1)
    projector.freeze_base()
    for p in projector.g_inc.parameters():  # a g_inc that contributes (a fresh one is zero-gated)
        p.data.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    trainable = [p for p in projector.parameters() if p.requires_grad] + list(classifier.parameters())
    opt = torch.optim.SGD(trainable, lr=0.1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, 2, 2, generator=gen)
    batch = (x, torch.randint(0, 10, (8,), generator=gen), torch.tensor([True, False] * 4))
    dtypes = []
    hook = projector.g_inc.in_proj.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    terms = train_step(projector, classifier, opt, trainable, batch, 10, "etf", cfg.incremental, None,
                       precision=precision)
    hook.remove()
    return terms, dtypes, trainable


def test_bf16_step_computes_in_bf16_and_keeps_float32_state():
    terms, dtypes, trainable = _step("bf16")
    assert dtypes == [torch.bfloat16]  # g_inc's projections ran in bf16
    assert terms.dtype == torch.float32 and bool(torch.isfinite(terms).all())
    assert all(p.dtype == torch.float32 and (p.grad is None or p.grad.dtype == torch.float32) for p in trainable)
    exact, dtypes, _ = _step("fp32")
    assert dtypes == [torch.float32]
    # the same step to bf16's rounding (8 bits of mantissa), not a different computation
    torch.testing.assert_close(terms, exact, rtol=0.05, atol=0.05)


def test_autocast_is_off_for_fp32():
    with autocast(torch.device("cpu"), "fp32"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast(torch.device("cpu"), "bf16"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


@pytest.mark.slow
def test_bf16_pipeline_runs_end_to_end_and_stores_float32_maps(tmp_path, tiny_run):
    """Every stage under precision bf16 on the tiny protocol: the store keeps float32 maps, every session writes
    finite metrics, and the base accuracy stays near the fp32 run's (same data, seed and schedule)."""
    params = write_params(tmp_path / "params.yaml", precision="bf16")
    run_pipeline(params, tmp_path / "data", tmp_path / "metrics.json")
    store = zarr.open_group(str(tmp_path / "data" / "features.zarr"), mode="r")
    assert store["test"]["maps"].dtype == "float32"
    metrics = json.loads((tmp_path / "data" / "report" / "details.json").read_text())
    exact = json.loads((tiny_run[0] / "data" / "report" / "details.json").read_text())
    assert len(metrics["sessions"]) == NUM_SESSIONS + 1
    assert all(0 <= v <= 100 for v in metrics["sessions"].values())
    learned("bf16.base_accuracy_off_float32", abs(metrics["base"] - exact["base"]), "<=", 25)
