"""SGD with momentum and weight decay (the optimizer of eq. optim_base and eq. optim_inc), as torch.optim.SGD
computes it, without torch.optim.Optimizer's compiler hooks.

torch.optim.Optimizer's constructor and every `step` import torch._dynamo (the compiler) to wrap themselves: 1.6 s of
every base and session process on a CPU, more than a tenth of a default session stage, for a compiler this project
never runs. `SGD` keeps what our code reads of torch's optimizer (`param_groups` with their "lr" and "initial_lr",
`state[p]["momentum_buffer"]`, `zero_grad`, `step`) and computes each step with torch's own functional update,
`torch.optim.sgd.sgd`, with torch's choice of kernel (a loop over the tensors on a CPU, the multi-tensor kernels on a
GPU): the same bytes as torch.optim.SGD (tests/test_sgd.py), ~40 lines.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch
from torch.optim.sgd import sgd


class SGD:
    """torch.optim.SGD(params, lr, momentum, weight_decay) with dampening 0, no Nesterov, not maximising.
    `params`: tensors, or groups (dicts with "params" and any of lr / momentum / weight_decay / initial_lr)."""

    def __init__(self, params: Iterable, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: lr {lr}, momentum {momentum} and weight_decay {weight_decay} must be >= 0")
        groups = list(params)
        if not groups:
            raise ValueError("SGD got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}
        self.param_groups = [{**defaults, **group, "params": list(group["params"])} for group in groups]
        self.state: defaultdict[torch.Tensor, dict] = defaultdict(dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient (torch.optim.SGD.step)."""
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            momentum = group["momentum"]
            buffers = [self.state[p].get("momentum_buffer") for p in params] if momentum != 0 else []
            sgd(params, [p.grad for p in params], buffers, weight_decay=group["weight_decay"], momentum=momentum,
                lr=group["lr"], dampening=0.0, nesterov=False, maximize=False,
                has_sparse_grad=any(p.grad.is_sparse for p in params))
            if momentum != 0:  # the buffers sgd() made on the first step
                for p, buf in zip(params, buffers, strict=True):
                    self.state[p]["momentum_buffer"] = buf
