"""pipeline/training/sgd.py: torch.optim.SGD's bytes without its compiler hooks (torch._dynamo stays unimported)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from pipeline.training.schedule import set_lr
from pipeline.training.sgd import SGD


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


@pytest.mark.parametrize("momentum, weight_decay", [(0.9, 5e-4), (0.0, 0.0), (0.9, 0.0), (0.0, 1e-3)])
def test_every_step_is_torch_sgds_to_the_bit(momentum, weight_decay):
    """Two groups at different lrs (the base session's backbone group, the sessions' base_lr_scale group), the lr
    changed between steps as the schedules do, a parameter without a gradient in some steps (frozen, then not),
    zero_grad both ways; parameters and momentum buffers equal bit for bit after every step."""
    ours, theirs = _net(0), _net(0)
    optimizers = []
    for net, kind in ((ours, SGD), (theirs, torch.optim.SGD)):
        groups = [{"params": list(net[0].parameters()) + list(net[1].parameters()), "initial_lr": 0.1},
                  {"params": list(net[4].parameters()), "initial_lr": 0.02}]
        optimizers.append(kind(groups, lr=0.1, momentum=momentum, weight_decay=weight_decay))
    x, y = torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(1)), torch.arange(8) % 5
    for step in range(6):
        for net, opt in zip((ours, theirs), optimizers, strict=True):
            set_lr(opt, 1.0 - step / 6)
            net[4].bias.requires_grad_(step % 3 != 1)  # no gradient in steps 1 and 4
            opt.zero_grad(set_to_none=step % 2 == 0)
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        for (name, a), b in zip(ours.named_parameters(), theirs.parameters(), strict=True):
            assert torch.equal(a, b), (step, name)
            mine, torch_state = optimizers[0].state.get(a, {}), optimizers[1].state.get(b, {})
            if momentum:
                assert torch.equal(mine["momentum_buffer"], torch_state["momentum_buffer"]), (step, name)
            else:
                assert mine.get("momentum_buffer") is None and torch_state.get("momentum_buffer") is None
    assert [g["lr"] for g in optimizers[0].param_groups] == [g["lr"] for g in optimizers[1].param_groups]


def test_a_training_step_leaves_the_compiler_unimported():
    """What it is for: torch.optim.SGD imports torch._dynamo (1.6 s a stage process on a CPU); ours does not."""
    code = ("import sys, torch\nfrom pipeline.training.sgd import SGD\nw = torch.nn.Parameter(torch.ones(3))\n"
            "opt = SGD([w], lr=0.1, momentum=0.9, weight_decay=1e-4)\n(w * w).sum().backward()\nopt.step()\n"
            "print('torch._dynamo' in sys.modules)\n"
            "torch.optim.SGD([w], lr=0.1)\nprint('torch._dynamo' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True"]  # and the control: torch's own does import it


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="must be >= 0"):
        SGD([nn.Parameter(torch.ones(1))], lr=-0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        SGD([], lr=0.1)
