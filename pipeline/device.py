"""Which torch device a run uses (params `device`)."""

from __future__ import annotations

import os

import torch

from pipeline.errors import FSCILError


def resolve_device(name: str) -> torch.device:
    """"auto" picks CUDA when there is one (this process's local rank under torchrun), else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise FSCILError(f"params: device {name} asked for but no CUDA device is available")
    return torch.device(name)
