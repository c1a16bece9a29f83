"""The device a training stage runs on, set up from the run's config: params `device` and `deterministic`
(`pipeline.device.resolve_device`) and, on CUDA, the selective scan params `scan` names."""

from __future__ import annotations

import torch

from pipeline.device import resolve_device
from pipeline.errors import FSCILError
from pipeline.ops.selective_scan import set_scan


def run_device(cfg) -> torch.device:
    """The torch device of `cfg`, CUDA set up for its `deterministic` and `scan` (the CPU always runs the PyTorch
    scan: nothing to set)."""
    device = resolve_device(cfg.device, cfg.deterministic)
    if device.type == "cuda":
        try:
            set_scan(cfg.scan)
        except ValueError as err:
            raise FSCILError(f"params: {err}") from None
    return device
