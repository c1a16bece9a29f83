"""Process-count invariance: everything the method computes depends on the global batch only.

Under `torchrun` every process reads the same global batch order and draws the same augmentation randoms (both
seeded by the step), then keeps its own contiguous slice. Losses are sums over the local slice divided by the
global sample count, times the world size (DDP averages gradients over processes). BatchNorm statistics are
reduced over the global batch with `GlobalBatchNorm2d`, which works on gloo (CPU) and NCCL alike, unlike
torch's SyncBatchNorm (GPU only).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


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
            raise ValueError(f"global batch {global_batch} is not divisible by {self.world_size} processes")
        per = global_batch // self.world_size
        return slice(self.rank * per, (self.rank + 1) * per)


def init_process_group(device: torch.device) -> ProcessGroup:
    """Join the torchrun group when launched by torchrun (WORLD_SIZE > 1); otherwise a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return ProcessGroup()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return ProcessGroup(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def all_reduce_sum(t: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    if group.world_size > 1:
        t = t.clone()
        dist.all_reduce(t)
    return t


def barrier(group: ProcessGroup) -> None:
    if group.world_size > 1:
        dist.barrier()


class GlobalBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics are those of the global batch (all processes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        from torch.distributed.nn.functional import all_reduce  # differentiable all-reduce

        c = x.shape[1]
        count = torch.tensor([x.numel() / c], dtype=x.dtype, device=x.device)
        stats = torch.cat([x.sum(dim=(0, 2, 3)), (x * x).sum(dim=(0, 2, 3)), count])
        stats = all_reduce(stats)
        n = stats[-1]
        mean = stats[:c] / n
        var = stats[c:2 * c] / n - mean * mean
        if self.track_running_stats:
            with torch.no_grad():
                m = self.momentum if self.momentum is not None else 0.1
                self.running_mean.mul_(1 - m).add_(m * mean.detach())
                self.running_var.mul_(1 - m).add_(m * var.detach() * n / max(float(n) - 1, 1.0))
                self.num_batches_tracked += 1
        x_hat = (x - mean[None, :, None, None]) * torch.rsqrt(var[None, :, None, None] + self.eps)
        return x_hat * self.weight[None, :, None, None] + self.bias[None, :, None, None] if self.affine else x_hat


def convert_global_batchnorm(module: nn.Module) -> nn.Module:
    """Swap every BatchNorm2d for a GlobalBatchNorm2d sharing its parameters and buffers."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d) and not isinstance(child, GlobalBatchNorm2d):
            new = GlobalBatchNorm2d(child.num_features, child.eps, child.momentum, child.affine,
                                    child.track_running_stats).to(child.weight.device if child.affine else "cpu")
            new.load_state_dict(child.state_dict())
            new.requires_grad_(any(p.requires_grad for p in child.parameters()))
            setattr(module, name, new)
        else:
            convert_global_batchnorm(child)
    return module


def cleanup(group: ProcessGroup) -> None:
    if group.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()




def resolve_device(name: str) -> torch.device:
    """"auto" picks CUDA when there is one (this process's local rank under torchrun), else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    if name.startswith("cuda") and not torch.cuda.is_available():
        from pipeline.errors import FSCILError

        raise FSCILError(f"params: device {name} asked for but no CUDA device is available")
    return torch.device(name)
