"""The authors' 1-D selective-SSM branch (model.ssm_branch mamba_1d): against an independent float64 reference that
runs each token order through the one parameter set by hand (causal conv1d, x_proj, dt_proj, a sequential scan,
the gate, back to row-major order), its gradients included; its parameter count at the CIFAR-100 preset equals the
authors' neck (6,590,720)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.config import build_config
from pipeline.models.mamba1d import SharedMamba1DBranch
from pipeline.models.projector import Projector
from pipeline.models.ss2d import BranchDims

DIMS = BranchDims(dim=8, d_state=4, dt_rank=3, k_paths=4, expand=1, d_conv=4, mlp_layers=2, out_norm=False)


def token_orders(h: int, w: int) -> list[torch.Tensor]:
    """The 4 orders as row-major token indices: row-major, reversed, column-major, reversed."""
    row = torch.arange(h * w)
    col = torch.tensor([r * w + c for c in range(w) for r in range(h)])
    return [row, row.flip(0), col, col.flip(0)]


def reference(branch: SharedMamba1DBranch, f: torch.Tensor) -> torch.Tensor:
    """mu of the branch in float64, every order by hand with the branch's single parameter set."""
    p = {k: v.double() for k, v in branch.named_parameters()}
    n, _, h, w = f.shape
    tokens = branch.p_mlp(f).double().flatten(2).transpose(1, 2) + p["pos_embed"]  # p_mlp: not under test
    x, z = (tokens @ p["in_proj.weight"].T).chunk(2, dim=-1)
    a = -torch.exp(p["A_log"])  # (D, n)
    r, ns = DIMS.dt_rank, DIMS.d_state
    out = torch.zeros_like(x)
    for idx in token_orders(h, w):
        seq = x[:, idx]  # (N, L, D)
        padded = F.pad(seq, (0, 0, 3, 0))  # 3 zeros before the first token: causal
        wconv = p["conv.weight"][:, 0]  # (D, 4)
        conv = sum(padded[:, k:k + seq.shape[1]] * wconv[:, k] for k in range(4)) + p["conv.bias"]
        u = F.silu(conv)
        dt_low, bb, cc = torch.split(u @ p["x_proj.weight"].T, [r, ns, ns], dim=-1)
        dt = F.softplus(dt_low @ p["dt_proj.weight"].T + p["dt_proj.bias"])  # (N, L, D)
        state = torch.zeros(n, u.shape[-1], ns, dtype=torch.float64)
        ys = []
        for t in range(seq.shape[1]):
            state = torch.exp(dt[:, t, :, None] * a) * state + dt[:, t, :, None] * bb[:, t, None, :] * u[:, t, :, None]
            ys.append((state * cc[:, t, None, :]).sum(-1) + p["D"] * u[:, t])
        y = torch.stack(ys, dim=1) * F.silu(z[:, idx])
        out = out.index_add(1, idx, y)
    return out.mean(dim=1)


def test_the_four_orders_run_through_one_parameter_set_as_the_reference_does():
    torch.manual_seed(0)
    branch = SharedMamba1DBranch(6, (2, 3), DIMS)
    shapes = {k: tuple(v.shape) for k, v in branch.named_parameters() if not k.startswith("p_mlp")}
    assert shapes == {"pos_embed": (1, 6, 8), "in_proj.weight": (16, 8), "conv.weight": (8, 1, 4), "conv.bias": (8,),
                      "x_proj.weight": (3 + 8, 8), "dt_proj.weight": (8, 3), "dt_proj.bias": (8,),
                      "A_log": (8, 4), "D": (8,)}  # no K axis anywhere
    f = torch.randn(3, 6, 2, 3)
    mu = branch(f)
    want = reference(branch, f)
    torch.testing.assert_close(mu.double(), want, rtol=1e-5, atol=1e-6)
    # every parameter's gradient is the sum over the four orders (the reference's autograd)
    mu.square().sum().backward()
    got = {k: v.grad.double() for k, v in branch.named_parameters()}
    ref_params = dict(branch.named_parameters())
    for v in ref_params.values():
        v.grad = None
    reference(branch, f).square().sum().backward()
    for key, value in branch.named_parameters():
        torch.testing.assert_close(got[key], value.grad.double(), rtol=1e-4, atol=1e-6, msg=key)


def test_aux_holds_each_orders_parameters_and_the_gate():
    torch.manual_seed(1)
    branch = SharedMamba1DBranch(6, (2, 2), DIMS)
    mu, aux = branch(torch.randn(2, 6, 2, 2), return_aux=True)
    assert aux.B.shape == aux.C.shape == (2, 4, 4, 4) and aux.dt_low.shape == (2, 4, 4, 3)
    assert aux.delta.shape == (2, 4, 4, 8) and aux.z.shape == aux.z_channel_flip.shape == (2, 4, 8)
    # the reversed order is not the first one reversed: the causal conv sees other neighbours
    assert not torch.allclose(aux.B[:, 0], aux.B[:, 1].flip(1))


def test_the_cifar100_presets_branches_have_the_authors_parameter_count():
    """The authors' CIFAR-100 neck (version='ssm', 640 -> 640 on 2 x 2 maps, d_state = dt_rank = 256, two branches
    with their p_mlp and positional embeddings, no residual projection): 6,590,720 parameters."""
    cfg = build_config({"preset": "cifar100", "variant": "mamba_fscil", "data": {"source": "synthetic"}})
    projector = Projector.from_config(cfg.model, 640, (2, 2))
    assert type(projector.g_base) is SharedMamba1DBranch and type(projector.g_inc) is SharedMamba1DBranch
    assert sum(p.numel() for p in projector.parameters()) == 6_590_720
