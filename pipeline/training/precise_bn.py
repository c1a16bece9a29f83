"""Exact BatchNorm statistics for the test-time input (option base.precise_bn).

During base training the running statistics follow augmented (cropped, resized, mixed) batches, but a test image
goes through the test transform. After training, every BatchNorm the base session trained gets the exact mean and
(unbiased) variance of its input over the base training images under the test transform, one layer at a time in
forward order, in eval mode, with the layers before it already recalibrated: the statistics each layer holds are
then exactly those of what it sees at test time. No weight changes; the result does not depend on the batch size or
the process count (every process computes the same sums over all images).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


class _Measured(Exception):
    """Raised by the hook once the layer being measured has seen its input: the rest of the forward is not needed."""


def forward_order(net: nn.Module, layers: list[_BatchNorm], sample: torch.Tensor) -> list[_BatchNorm]:
    """`layers` in the order one forward of `sample` calls them (a layer the forward never calls is left out)."""
    seen: list[_BatchNorm] = []
    hooks = [layer.register_forward_pre_hook(lambda mod, inp: seen.append(mod) if mod not in seen else None)
             for layer in layers]
    try:
        net(sample)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


class _Moments:
    """Forward pre-hook: per-channel count, sum and sum of squares (float64) of a BatchNorm's input, then stop."""

    def __init__(self):
        self.count, self.total, self.squares = 0, 0.0, 0.0

    def __call__(self, module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        x = inputs[0].detach().to(torch.float64)
        x = x.transpose(0, 1).reshape(x.shape[1], -1)  # (C, N * spatial)
        self.count += x.shape[1]
        self.total = self.total + x.sum(dim=1)
        self.squares = self.squares + (x * x).sum(dim=1)
        raise _Measured

    def mean_var(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean and the unbiased variance (what BatchNorm stores as running_var)."""
        if self.count < 2:
            raise ValueError("recalibrate_batchnorm: a layer saw fewer than 2 values per channel")
        mean = self.total / self.count
        var = (self.squares / self.count - mean * mean).clamp_min(0.0) * (self.count / (self.count - 1))
        return mean, var


@torch.no_grad()
def recalibrate_batchnorm(net: nn.Module, layers: list[_BatchNorm],
                          batches: Callable[[], Iterable[torch.Tensor]]) -> int:
    """Replace the running mean / var of `layers` (BatchNorms inside `net`) by the exact statistics of their inputs
    over every batch `batches()` yields, layer by layer in forward order (eval mode). Returns how many were set."""
    was_training = net.training
    net.eval()
    try:
        first = next(iter(batches()), None)
        if first is None:
            raise ValueError("recalibrate_batchnorm: no images")
        ordered = forward_order(net, layers, first)
        for layer in ordered:
            moments = _Moments()
            hook = layer.register_forward_pre_hook(moments)
            try:
                for x in batches():
                    try:
                        net(x)
                    except _Measured:
                        pass
            finally:
                hook.remove()
            mean, var = moments.mean_var()
            layer.running_mean.copy_(mean.to(layer.running_mean.dtype))
            layer.running_var.copy_(var.to(layer.running_var.dtype))
    finally:
        net.train(was_training)
    return len(ordered)
