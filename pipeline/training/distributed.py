"""Process-count invariance: everything the method computes depends on the global batch only.

Under `torchrun` every process reads the same global batch order and draws the same augmentation and Mixup/CutMix
randoms (all seeded by the step), then keeps its own contiguous slice `ProcessGroup.local_slice`. Slices are
equal, so the mean of the local mean losses is the global mean loss, and DDP's gradient average is its gradient.
BatchNorm statistics are reduced over the global batch with `GlobalBatchNorm2d`, which works on gloo (CPU) and
NCCL alike, unlike torch's SyncBatchNorm (CUDA only); or, with base.device_batch, over each group of that many
consecutive rows (`DeviceBatchNorm2d`: the authors' per-GPU statistics), which a process's slice holds whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from pipeline.errors import FSCILError


@dataclass(frozen=True)
class ProcessGroup:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def local_slice(self, global_batch: int) -> slice:
        if global_batch % self.world_size:
            raise FSCILError(f"params: the global batch size {global_batch} is not divisible by the "
                             f"{self.world_size} processes")
        per = global_batch // self.world_size
        return slice(self.rank * per, (self.rank + 1) * per)

    def bounds(self, n: int) -> list[int]:
        """Where each process's contiguous part of n rows starts (and the end): sizes differ by at most one."""
        return [n * r // self.world_size for r in range(self.world_size + 1)]

    def local_part(self, n: int) -> slice:
        """This process's part of n rows (`bounds`), for work that needs no equal slices (extraction)."""
        bounds = self.bounds(n)
        return slice(bounds[self.rank], bounds[self.rank + 1])


def is_launch_main() -> bool:
    """Whether this process writes a stage's output: rank 0 under torchrun (RANK), or a single process."""
    return int(os.environ.get("RANK", "0")) == 0


def init_process_group(device: torch.device) -> ProcessGroup:
    """Join the torchrun group when launched by torchrun (WORLD_SIZE > 1); otherwise a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return ProcessGroup()
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL (and its barrier) must know this process's GPU
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return ProcessGroup(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def all_reduce_sum(t: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    if group.world_size > 1:
        t = t.clone()
        dist.all_reduce(t)
    return t


def gather_rows(local: torch.Tensor, n: int, group: ProcessGroup) -> torch.Tensor:
    """The n rows every process holds a `local_part` of, in order, on every process (padded to equal sizes for the
    all-gather, the padding dropped)."""
    if group.world_size == 1:
        return local
    bounds = group.bounds(n)
    size = max(b - a for a, b in zip(bounds, bounds[1:], strict=False))
    padded = local.new_zeros((size, *local.shape[1:]))
    padded[:len(local)] = local
    parts = [torch.empty_like(padded) for _ in range(group.world_size)]
    dist.all_gather(parts, padded)
    return torch.cat([part[:b - a] for part, a, b in zip(parts, bounds, bounds[1:], strict=False)])


def barrier(group: ProcessGroup) -> None:
    if group.world_size > 1:
        dist.barrier()


class _DifferentiableAllReduce(torch.autograd.Function):
    """Sum over processes; the gradient of a sum that every process uses is the sum of their gradients."""

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> torch.Tensor:
        t = t.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(t)
        return t

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad)
        return grad


class GlobalBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose batch statistics are those of the global batch (all processes), in forward and backward.

    Each process contributes (count, mean, M2) of its slice, gathered with one differentiable all-reduce and merged
    with Chan et al.'s parallel formula (no E[x^2] - E[x]^2 cancellation); slices may differ in size. Running stats
    are updated as torch does (unbiased variance). Eval mode and a single process are plain BatchNorm2d.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        if not (batch_stats and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        self._check_input_dim(x)
        world, rank = dist.get_world_size(), dist.get_rank()
        xs = x.to(torch.promote_types(x.dtype, torch.float32))  # statistics in at least float32
        c = x.shape[1]
        count = x.numel() // c
        var_local, mean_local = torch.var_mean(xs, dim=(0, 2, 3), correction=0)  # (C,), (C,)
        row = torch.cat([xs.new_full((1,), float(count)), mean_local, var_local * count])  # (1 + 2C,)
        # an all-gather through the differentiable all-reduce: every process fills its own row
        rows = torch.stack([row if r == rank else torch.zeros_like(row) for r in range(world)])
        rows = _DifferentiableAllReduce.apply(rows)  # (W, 1 + 2C)
        counts, means, m2s = rows[:, :1], rows[:, 1:1 + c], rows[:, 1 + c:]
        n = counts.sum()
        mean = (counts * means).sum(0) / n
        var = (m2s + counts * (means - mean) ** 2).sum(0) / n  # biased: what normalises the batch
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(mean.detach().to(self.running_mean.dtype), alpha=factor)
                unbiased = (var.detach() * n / (n - 1)).to(self.running_var.dtype)
                self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
        scale = torch.rsqrt(var + self.eps)
        if self.affine:
            scale = scale * self.weight
        out = (xs - mean[None, :, None, None]) * scale[None, :, None, None]
        if self.affine:
            out = out + self.bias[None, :, None, None]
        return out.to(x.dtype)


class DeviceBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose batch statistics are those of each group of consecutive rows of its input (base.device_batch:
    the authors' plain BatchNorm on each of 8 GPUs, statistics over a GPU's 64 images), in forward and backward.

    `groups` is how many device groups this process's rows hold (its slice of the global batch is whole groups, so
    1 or 2 processes compute the same). The running statistics follow the first group of the process, as the
    authors' rank 0 kept and saved them (no buffer broadcast); under DDP rank 0's are broadcast, so every process
    holds those of global group 0. Unbiased variance, as torch. Eval mode and one group are plain BatchNorm2d.
    """

    groups: int = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.groups == 1:
            return super().forward(x)
        self._check_input_dim(x)
        n, c, h, w = x.shape
        if n % self.groups:
            raise ValueError(f"a batch of {n} rows does not split into {self.groups} device groups")
        xs = x.to(torch.promote_types(x.dtype, torch.float32)).reshape(self.groups, n // self.groups, c, h, w)
        var, mean = torch.var_mean(xs, dim=(1, 3, 4), correction=0)  # (G, C) each
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            count = (n // self.groups) * h * w
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(mean[0].to(self.running_mean.dtype), alpha=factor)
                unbiased = (var[0] * count / max(count - 1, 1)).to(self.running_var.dtype)
                self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
        scale = torch.rsqrt(var + self.eps)  # (G, C)
        if self.affine:
            scale = scale * self.weight
        out = (xs - mean[:, None, :, None, None]) * scale[:, None, :, None, None]
        if self.affine:
            out = out + self.bias[None, None, :, None, None]
        return out.reshape(n, c, h, w).to(x.dtype)


def _convert_batchnorm(module: nn.Module, kind: type[nn.BatchNorm2d], keep: tuple[type, ...]) -> nn.Module:
    """Swap every nn.BatchNorm2d (`module` itself included) for a `kind` holding the *same* parameter and buffer
    tensors, so requires_grad, optimizer references and the train/eval state carry over. Returns the converted
    module (a new object only when `module` itself is a BatchNorm2d). BatchNorm kinds other than 2d (and `keep`)
    are refused rather than left per-process."""
    if type(module) is nn.BatchNorm2d:
        new = kind(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                   device="meta")
        for name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            setattr(new, name, tensor)  # parameters stay parameters, buffers stay buffers
        new.train(module.training)
        return new
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, keep):
        raise TypeError(f"convert to {kind.__name__}: {type(module).__name__} has no such version")
    for name, child in module.named_children():
        converted = _convert_batchnorm(child, kind, keep)
        if converted is not child:
            setattr(module, name, converted)
    return module


def convert_global_batchnorm(module: nn.Module) -> nn.Module:
    """Every nn.BatchNorm2d of `module` as a GlobalBatchNorm2d (`_convert_batchnorm`)."""
    return _convert_batchnorm(module, GlobalBatchNorm2d, (GlobalBatchNorm2d, nn.SyncBatchNorm))


def convert_device_batchnorm(module: nn.Module, groups: int) -> nn.Module:
    """Every nn.BatchNorm2d of `module` as a DeviceBatchNorm2d over `groups` groups of this process's rows."""
    module = _convert_batchnorm(module, DeviceBatchNorm2d, (DeviceBatchNorm2d,))
    for m in module.modules():
        if isinstance(m, DeviceBatchNorm2d):
            m.groups = groups
    return module


def cleanup(group: ProcessGroup) -> None:
    if group.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()
