"""Invariants of the SS2D branch and the projector kinds: shapes, finiteness, gradients, freezing, zero-init."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from pipeline.config.sections import ModelConfig
from pipeline.models.mixers import MLPBranch, ssm_mixer_parameters
from pipeline.models.projector import PROJECTOR_KINDS, Projector
from pipeline.models.ss2d import BranchDims, SS2DBranch, mamba_dt_bias
from pipeline.ops.cross_scan import cross_merge, cross_scan
from pipeline.ops.selective_scan import selective_scan
from tests.headroom import TEST_SEED, learned


def _dims(**widths) -> BranchDims:
    """Branch widths as a params model section would give them (ModelConfig's defaults for the rest)."""
    return BranchDims.from_config(ModelConfig(**widths))


DIMS = _dims(dim=16, d_state=4, dt_rank=3, k_paths=4)
C, HW = 8, (2, 3)


def _maps(n=5):
    return torch.randn(n, C, *HW)


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("expand,out_norm,mlp_layers", [(1, False, 2), (2, True, 3)])
def test_ss2d_shapes_aux_and_gradients(k, expand, out_norm, mlp_layers):
    dims = _dims(dim=16, d_state=4, dt_rank=3, k_paths=k, expand=expand, out_norm=out_norm,
                      mlp_layers=mlp_layers)
    branch = SS2DBranch(C, HW, dims)
    mu, aux = branch(_maps(), return_aux=True)
    L, di = HW[0] * HW[1], dims.d_inner
    assert mu.shape == (5, 16) and torch.isfinite(mu).all()
    assert aux.z.shape == (5, L, di)
    assert aux.B.shape == aux.C.shape == (5, k, L, 4)
    assert aux.delta.shape == (5, k, L, di) and (aux.delta > 0).all()
    mu.pow(2).sum().backward()
    for name, p in branch.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_ss2d_matches_a_direct_composition():
    """The branch equals p_mlp -> +pos -> in_proj -> conv/SiLU -> per-path scan -> merge -> gate -> pool."""
    branch = SS2DBranch(C, HW, DIMS).double()
    f = _maps().double()
    n, (h, w) = f.shape[0], HW
    tok = branch.p_mlp(f).flatten(2).transpose(1, 2) + branch.pos_embed
    x, z = branch.in_proj(tok).chunk(2, dim=-1)
    x = F.silu(branch.conv(x.transpose(1, 2).reshape(n, -1, h, w)))
    xs = cross_scan(x, 4)
    ys = []
    for k in range(4):
        proj = xs[:, k].transpose(1, 2) @ branch.x_proj_weight[k].T  # (N, L, R + 2n)
        dt, b, c = proj.split([3, 4, 4], dim=-1)
        delta = (dt @ branch.dt_proj_weight[k].T).transpose(1, 2)
        di = DIMS.d_inner
        ys.append(selective_scan(xs[:, k], delta, -torch.exp(branch.A_log[k * di:(k + 1) * di]),
                                 b.transpose(1, 2), c.transpose(1, 2), branch.D[k * di:(k + 1) * di],
                                 delta_bias=branch.dt_proj_bias[k], delta_softplus=True))
    y = cross_merge(torch.stack(ys, 1), h, w).transpose(1, 2)
    expected = (y * F.silu(z)).mean(1)
    torch.testing.assert_close(branch(f), expected, rtol=1e-9, atol=1e-9)


def test_mamba_initialisation():
    branch = SS2DBranch(C, HW, DIMS)
    di = DIMS.d_inner
    assert torch.allclose(branch.A_log, torch.log(torch.arange(1, 5.0)).repeat(4 * di, 1))
    assert torch.equal(branch.D, torch.ones(4 * di))
    dt = F.softplus(branch.dt_proj_bias)
    assert dt.min() >= 1e-4 - 1e-7 and dt.max() <= 0.1 + 1e-6
    assert branch.dt_proj_weight.abs().max() <= 3 ** -0.5
    learned("ss2d_init.pos_embed_std_error", abs(branch.pos_embed.std().item() - 0.02), "<", 0.01)
    dt = F.softplus(mamba_dt_bias(10000, torch.Generator().manual_seed(TEST_SEED)))
    # dt = exp(U(log 1e-3, log 1e-1)): log-uniform, so its median is 1e-2
    learned("ss2d_init.dt_median_log10_error", abs(dt.median().log10().item() + 2), "<", 0.05)


def test_zero_initialised_gate_gives_zero_output():
    branch = SS2DBranch(C, HW, DIMS, zero_init_gate=True)
    mu, aux = branch(_maps(), return_aux=True)
    assert torch.equal(mu, torch.zeros_like(mu)) and torch.equal(aux.z, torch.zeros_like(aux.z))


def test_mlp_branch_has_gate_but_no_ssm_parameters():
    branch = MLPBranch(C, HW, DIMS)
    f = _maps()
    mu, aux = branch(f, return_aux=True)
    assert mu.shape == (5, 16) and aux.B is None and aux.delta is None
    # a plain token MLP in place of the scan (the paper's baseline), then the same gate
    tok = branch.p_mlp(f).flatten(2).transpose(1, 2) + branch.pos_embed
    x, z = branch.in_proj(tok).chunk(2, dim=-1)
    x = F.silu(branch.conv(x.transpose(1, 2).reshape(5, -1, *HW))).flatten(2).transpose(1, 2)
    torch.testing.assert_close(mu, (branch.mlp(x) * F.silu(z)).mean(1))


@pytest.mark.parametrize("dims", [DIMS, _dims(dim=128, d_state=16, dt_rank=16), _dims()])
def test_mlp_baseline_matches_the_ssm_mixer_budget(dims):
    ssm, mlp = SS2DBranch(C, HW, dims), MLPBranch(C, HW, dims)
    mixer = sum(p.numel() for n, p in ssm.named_parameters() if n.split(".")[0] in
                ("x_proj_weight", "dt_proj_weight", "dt_proj_bias", "A_log", "D"))
    assert mixer == ssm_mixer_parameters(dims)
    budget = sum(p.numel() for p in mlp.mlp.parameters())
    h = mlp.mlp[0].out_features
    step = 2 * h + 2 * dims.d_inner + 3  # what one more hidden unit costs: the nearest width is within half of it
    assert abs(budget - mixer) <= step / 2 + 1, (budget, mixer)
    # the branches around the mixer are identical, so whole branches differ by the same small amount
    rest = lambda b, skip: sum(p.numel() for n, p in b.named_parameters() if not n.startswith(skip))  # noqa: E731
    assert rest(ssm, ("x_proj", "dt_proj", "A_log", "D")) == rest(mlp, "mlp.")


@pytest.mark.parametrize("kind", sorted(PROJECTOR_KINDS))
def test_projector_modes_and_zero_mu_inc_at_session_start(kind):
    proj = Projector(kind, C, HW, DIMS)
    f = _maps()
    base = proj(f, mode="base")
    torch.testing.assert_close(base.mu, base.mu_iden + base.mu_base)
    torch.testing.assert_close(base.mu_iden, proj.p_iden(f.mean((2, 3))))
    inc = proj.session_outputs(f)
    if kind == "single_ssm":
        assert proj.g_inc is None and inc.mu_inc is None
        assert inc.aux.z.shape == (f.shape[0], HW[0] * HW[1], DIMS.d_inner)  # g_base's Z: the adapting branch
    else:
        assert torch.equal(inc.mu_inc, torch.zeros_like(inc.mu_inc))  # session 1 starts exactly at the base model
        torch.testing.assert_close(inc.mu, base.mu)


@pytest.mark.parametrize("kind", sorted(PROJECTOR_KINDS))
def test_freezing_after_base_session(kind):
    proj = Projector(kind, C, HW, DIMS)
    with torch.no_grad():
        if proj.g_inc is not None:  # leave the zero-init so g_inc's x path gets gradient too
            newest = proj.g_inc.branches[-1] if kind == "expanding_mlp" else proj.g_inc
            newest.in_proj.weight.normal_()
    proj.freeze_base()
    proj.train()
    frozen = {n for m in proj.frozen_after_base() for n, _ in m.named_parameters(prefix=_prefix(proj, m))}
    out = proj(_maps(), mode="incremental")
    out.mu.pow(2).sum().backward()
    for name, p in proj.named_parameters():
        if name in frozen:
            assert p.grad is None and not p.requires_grad, name
        else:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert all(not m.training for m in proj.frozen_after_base())
    expected = {"p_iden", "g_base"} if kind != "single_ssm" else {"p_iden"}
    assert {n.split(".")[0] for n in frozen} == expected


def _prefix(proj, module):
    return next(n for n, m in proj.named_children() if m is module)


def test_identity_p_iden_when_widths_match():
    proj = Projector("dual_ssm", 16, HW, DIMS)
    f = torch.randn(2, 16, *HW)
    torch.testing.assert_close(proj(f).mu_iden, f.mean((2, 3)))


@pytest.mark.parametrize("kind", ["dual_ssm", "single_ssm", "mlp"])
def test_linear_p_iden_starts_as_the_identity_and_trains_in_the_base_session(kind):
    # model.iden_linear: a Linear p_iden at C == D' starting from I, with no random draw of its own, so the model
    # it builds computes exactly what the identity model of the same seed computes until training moves it
    f = torch.randn(4, 16, *HW)
    torch.manual_seed(3)
    plain = Projector(kind, 16, HW, DIMS)
    torch.manual_seed(3)
    linear = Projector(kind, 16, HW, DIMS, iden_linear=True)
    assert isinstance(plain.p_iden, torch.nn.Identity) and torch.equal(linear.p_iden.weight, torch.eye(16))
    for mode in ("base", "incremental"):
        assert torch.equal(linear(f, mode).mu, plain(f, mode).mu)
    linear(f, "base").mu.pow(3).sum().backward()
    assert linear.p_iden.weight.grad is not None and linear.p_iden.weight.grad.abs().sum() > 0
    assert linear.p_iden in linear.frozen_after_base()  # frozen with g_base after the base session
    # from a params model section; C != D' keeps the (random) Linear either way
    cfg = ModelConfig(projector=kind, dim=16, d_state=4, dt_rank=3, iden_linear=True)
    assert isinstance(Projector.from_config(cfg, 16, HW).p_iden, torch.nn.Linear)
    assert isinstance(Projector.from_config(dataclasses.replace(cfg, iden_linear=False), 16, HW).p_iden,
                      torch.nn.Identity)
    torch.manual_seed(3)
    wide = Projector(kind, C, HW, DIMS, iden_linear=True)
    torch.manual_seed(3)
    assert torch.equal(wide.p_iden.weight, Projector(kind, C, HW, DIMS).p_iden.weight)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_mlp_baseline_starts_at_the_ssm_output_scale(k):
    # with g_inc's gate at zero the first gradient reaches only p_z and is proportional to the mixer's output y;
    # PyTorch's default init gave the MLP y ~ 0.6 x against the scan's K x, and its g_inc stayed shut for sessions
    dims = _dims(dim=64, d_state=8, dt_rank=8, k_paths=k)
    grads = {}
    for name, cls in (("mlp", MLPBranch), ("ssm", SS2DBranch)):
        torch.manual_seed(TEST_SEED)
        branch = cls(32, HW, dims, zero_init_gate=True)
        f = torch.randn(64, 32, *HW)
        x = F.silu(branch.conv(branch.in_proj(branch.p_mlp(f).flatten(2).transpose(1, 2) + branch.pos_embed)
                               .chunk(2, dim=-1)[0].transpose(1, 2).reshape(64, -1, *HW)))
        y, _ = branch.mix(x, HW)
        ratio = (y.pow(2).mean() / x.pow(2).mean()).sqrt().item()
        learned(f"output_scale[{name},k={k}].ratio_over_k", ratio / k, ">=", 0.5)
        learned(f"output_scale[{name},k={k}].ratio_over_k", ratio / k, "<=", 2.0)
        branch(f).sum().backward()
        grads[name] = branch.in_proj.weight.grad[dims.d_inner:].norm().item()  # p_z: the only non-zero gradient
        assert branch.in_proj.weight.grad[:dims.d_inner].abs().max() == 0
    learned(f"first_grad[k={k}].mlp_over_ssm", grads["mlp"] / grads["ssm"], ">=", 0.4)
    learned(f"first_grad[k={k}].mlp_over_ssm", grads["mlp"] / grads["ssm"], "<=", 2.5)
