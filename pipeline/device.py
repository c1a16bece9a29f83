"""Which torch device a run uses (params `device`), and how CUDA computes on it (params `deterministic`; the scan,
params `scan`, is set by `pipeline.training.runtime.run_device`)."""

from __future__ import annotations

import os

import torch

from pipeline.errors import FSCILError


def resolved_device_name(name: str) -> str:
    """params `device` as this machine resolves it, without setting anything up: "auto" -> "cuda" or "cpu" (what
    data/config/run.yaml records, so that a run moved between a CPU and a GPU re-runs the stages that compute)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def resolve_device(name: str, deterministic: bool = True, source: str = "params: device") -> torch.device:
    """"auto" picks CUDA when there is one (this process's local rank under torchrun), else the CPU. A CUDA device
    is also set up for `deterministic` (`configure_cuda`); the CPU needs nothing (its results depend on the thread
    count alone, params `threads`)."""
    name = resolved_device_name(name)
    if name == "cuda":
        name = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise FSCILError(f"{source} {name} asked for but no CUDA device is available")
        count = torch.cuda.device_count()
        if torch.device(name).index >= count:
            raise FSCILError(f"{source} {name} asked for but this machine has {count} CUDA device(s) "
                             f"(under torchrun: --nproc-per-node {count} at most)")
        configure_cuda(deterministic)
    return torch.device(name)


def configure_cuda(deterministic: bool) -> None:
    """deterministic: reruns give the same bits and CUDA computes in full float32 like the CPU: torch's deterministic
    algorithms (cuBLAS with a fixed workspace, no cuDNN autotuning), no TF32, and the selective scan's CUDA kernel
    for forward passes only (its backward sums some gradients with atomics: `pipeline.ops.selective_scan`).
    Otherwise the faster settings: the kernel in training too, cuDNN autotuning and TF32 matmuls and convolutions;
    reruns then differ by rounding."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what cuBLAS needs to be deterministic
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.allow_tf32 = not deterministic
    torch.backends.cuda.matmul.allow_tf32 = not deterministic
