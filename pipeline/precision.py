"""params `precision`: fp32 (the default: every step in float32) or bf16, the fast profile's arithmetic.

bf16 runs the forward passes of base training, extraction and the sessions' training steps under torch's autocast
to bfloat16 (matmuls and convolutions in bf16, reductions, norms and losses in float32; parameters, gradients and
optimizer state stay float32; the selective scan keeps its state in float32) and lays the backbone and its images out
channels_last. Evaluation and the stored maps stay float32. With `deterministic: false` (cuDNN autotuning, TF32:
`pipeline.device.configure_cuda`) it is the fast profile; results then differ from fp32 by bf16 rounding.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

PRECISIONS = ("fp32", "bf16")
# docs/gpu.md "Two profiles": name -> (params deterministic, params precision)
PROFILES = {"exact": (True, "fp32"), "fast": (False, "bf16")}


def autocast(device, precision: str) -> AbstractContextManager:
    """The forward-pass context of a training step (or of extraction) on `device` (a torch.device)."""
    import torch

    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def memory_format(module, precision: str):
    """The backbone laid out channels_last under bf16 (what bf16 convolutions are fast in); returns the module."""
    import torch

    return module.to(memory_format=torch.channels_last) if precision == "bf16" else module


def image_layout(x, precision: str):
    """A (N, C, H, W) image batch in the backbone's layout (`memory_format`)."""
    import torch

    return x.contiguous(memory_format=torch.channels_last) if precision == "bf16" else x
