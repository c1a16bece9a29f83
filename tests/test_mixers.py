"""The projector family (paper table diff_archs): every registered branch (each selective-SSM branch and each token
mixer of pipeline/models/registry.py: a new one is tested here without being named) keeps the branch's invariants,
S4's parameters do not depend on the input while SS2D's do, and the suppression loss follows the appendix's rule."""


import pytest
import torch
import torch.nn.functional as F

from pipeline.config.sections import ModelConfig
from pipeline.errors import FSCILError
from pipeline.losses.registry import SUPPRESSION_TARGETS
from pipeline.models.mixers import S4Branch, TransformerBranch
from pipeline.models.projector import suppression_target
from pipeline.models.registry import MIXERS, PROJECTOR_KINDS, SSM_BRANCHES
from pipeline.models.ss2d import BranchDims, SS2DBranch
from pipeline.ops.cross_scan import cross_merge, cross_scan
from tests.headroom import TEST_SEED, learned
from tests.test_selective_scan import naive_scan

C, HW = 8, (2, 3)
L = HW[0] * HW[1]


def _dims(**widths) -> BranchDims:
    return BranchDims.from_config(ModelConfig(**{"dim": 16, "d_state": 4, "dt_rank": 3, "k_paths": 4, **widths}))


def _x(branch, f):
    """The mixer's input: p_mlp -> +pos -> in_proj (x half) -> depthwise conv -> SiLU, (N, D_inner, H, W)."""
    n = f.shape[0]
    tok = branch.p_mlp(f).flatten(2).transpose(1, 2) + branch.pos_embed
    return F.silu(branch.conv(branch.in_proj(tok).chunk(2, dim=-1)[0].transpose(1, 2).reshape(n, -1, *HW)))


def branches() -> dict:
    """Every registered branch class: the selective-SSM branches and the token mixers (read when the tests are
    collected: an entry registered before then is walked too)."""
    return {**{f"ssm:{n}": SSM_BRANCHES[n] for n in SSM_BRANCHES}, **{n: MIXERS[n] for n in MIXERS}}


BRANCHES = branches()


def test_the_registry_names_the_papers_projectors():
    assert {"ss2d", "mamba_1d"} <= set(SSM_BRANCHES) and {"s4", "mlp", "transformer", "gru", "lstm"} <= set(MIXERS)
    assert {name for name, kind in PROJECTOR_KINDS.items() if kind.dual} >= {
        "dual_ssm", "mlp", "s4", "transformer", "gru", "lstm", "expanding_mlp"}
    assert [name for name, kind in PROJECTOR_KINDS.items() if kind.expanding] == ["expanding_mlp"]
    assert {name for name, cls in BRANCHES.items() if cls.gated} >= {"ssm:ss2d", "ssm:mamba_1d", "s4"}
    assert not any(MIXERS[n].gated for n in ("mlp", "transformer", "gru", "lstm"))


@pytest.mark.parametrize("name", sorted(BRANCHES))
@pytest.mark.parametrize("k", [1, 4])
def test_every_mixer_shapes_finite_and_every_parameter_trains(name, k):
    torch.manual_seed(0)
    branch = BRANCHES[name](C, HW, _dims(k_paths=k))
    mu, aux = branch(torch.randn(5, C, *HW), return_aux=True)
    assert mu.shape == (5, 16) and torch.isfinite(mu).all() and aux.z.shape == (5, L, 16)
    if name == "ssm:mamba_1d":  # one block shared by the K orders returns the first order's parameters
        assert aux.B.shape[0] == 5 and aux.B.shape[2:] == (L, 4)
    elif branch.gated:
        assert aux.B.shape == aux.C.shape == (5, k, L, 4) and aux.delta.shape == (5, k, L, 16)
    else:
        assert aux.B is None and aux.C is None and aux.delta is None
    mu.pow(2).sum().backward()
    missing = [n for n, p in branch.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing


@pytest.mark.parametrize("name", sorted(BRANCHES))
def test_zero_gate_gives_zero_output_and_gradient_only_on_p_z(name):
    torch.manual_seed(0)
    branch = BRANCHES[name](C, HW, _dims(), zero_init_gate=True)
    mu = branch(torch.randn(5, C, *HW))
    assert torch.equal(mu, torch.zeros_like(mu))  # mu_inc = 0 when session 1 starts, for every mixer
    mu.sum().backward()
    trained = {n for n, p in branch.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert trained == {"in_proj.weight"}
    assert branch.in_proj.weight.grad[:16].abs().max() == 0  # of in_proj, only the p_z rows


@pytest.mark.parametrize("name", ["ssm:ss2d", *sorted(MIXERS)])  # the authors' 1-D block keeps its own scale
@pytest.mark.parametrize("k", [1, 2, 4])
def test_every_mixer_starts_at_the_scans_output_scale(name, k):
    # the first gradient of g_inc (gate at zero) is proportional to the mixer's output: all start at ~K x, as SS2D
    torch.manual_seed(TEST_SEED)
    branch = BRANCHES[name](32, HW, _dims(dim=64, d_state=8, dt_rank=8, k_paths=k))
    x = _x(branch, torch.randn(64, 32, *HW))
    y, _ = branch.mix(x, HW)
    ratio = (y.pow(2).mean() / x.pow(2).mean()).sqrt().item()
    learned(f"mixer_output_scale[{name},k={k}].ratio_over_k", ratio / k, ">=", 0.5)
    learned(f"mixer_output_scale[{name},k={k}].ratio_over_k", ratio / k, "<=", 2.0)


def test_s4_parameters_do_not_depend_on_the_input_while_ss2d_ones_do():
    torch.manual_seed(0)
    f1, f2 = torch.randn(3, C, *HW), 3 * torch.randn(3, C, *HW)
    s4, ss2d = S4Branch(C, HW, _dims()), SS2DBranch(C, HW, _dims())
    (_, a1), (_, a2) = s4(f1, return_aux=True), s4(f2, return_aux=True)
    for key in ("B", "C", "delta"):
        assert torch.equal(getattr(a1, key), getattr(a2, key)), key
        first = getattr(a1, key)
        assert torch.equal(first, first[:1, :, :1].expand_as(first)), key  # the same for every sample and token
    (_, b1), (_, b2) = ss2d(f1, return_aux=True), ss2d(f2, return_aux=True)
    assert all(not torch.allclose(getattr(b1, key), getattr(b2, key)) for key in ("B", "C", "delta"))
    # and no gradient from the input side reaches B, C or Delta: they are leaves
    assert {n for n, _ in s4.named_parameters()} >= {"B", "C", "dt_bias", "A_log", "D"}
    assert not any(n.startswith(("x_proj", "dt_proj")) for n, _ in s4.named_parameters())


def test_s4_equals_an_lti_scan_in_float64():
    """y = sum over paths of the float64 step-by-step oracle scan, B, C, Delta fixed over tokens and samples."""
    torch.manual_seed(0)
    branch = S4Branch(C, HW, _dims(k_paths=2)).double()
    x = _x(branch, torch.randn(4, C, *HW).double())
    y, _ = branch.mix(x, HW)
    di, n = 16, 4
    xs = cross_scan(x, 2)
    ys = []
    for k in range(2):
        delta = F.softplus(branch.dt_bias[k])[None, :, None].expand(4, di, L)
        bk = branch.B[k][None, :, None].expand(4, n, L)
        ck = branch.C[k][None, :, None].expand(4, n, L)
        ys.append(naive_scan(xs[:, k], delta, -torch.exp(branch.A_log[k * di:(k + 1) * di]), bk, ck,
                             branch.D[k * di:(k + 1) * di]))
    expected = cross_merge(torch.stack(ys, dim=1), *HW).transpose(1, 2)
    torch.testing.assert_close(y, expected)


def test_transformer_needs_heads_that_divide_the_width():
    with pytest.raises(ValueError, match="divisible by 8"):
        TransformerBranch(C, HW, _dims(dim=12))
    with pytest.raises(FSCILError, match="model.dim"):
        ModelConfig(projector="transformer", dim=12)


def test_suppression_acts_on_z_for_gating_designs_and_on_the_output_for_the_others():
    for kind in ("dual_ssm", "single_ssm", "s4"):
        assert [suppression_target(kind, t) for t in SUPPRESSION_TARGETS] == list(SUPPRESSION_TARGETS)
    for kind in ("mlp", "transformer", "gru", "lstm", "expanding_mlp"):
        assert {suppression_target(kind, t) for t in SUPPRESSION_TARGETS} == {"mu_inc"}


def test_expanding_baseline_grows_one_frozen_branch_per_session():
    from pipeline.models.projector import Projector

    torch.manual_seed(0)
    proj = Projector("expanding_mlp", C, HW, _dims())
    f = torch.randn(4, C, *HW)
    sizes = []
    for session in (1, 2, 3):
        proj.set_sessions(session)
        with torch.no_grad():
            before = proj(f, mode="incremental").mu_inc.clone()
            newest = proj.g_inc.branches[-1]
            assert torch.equal(newest(f), torch.zeros(4, 16))  # a new branch starts shut: mu_inc unchanged
            newest.in_proj.weight.normal_()  # stands for this session's training
        assert len(proj.g_inc.branches) == session
        trainable = {n.split(".")[2] for n, p in proj.g_inc.named_parameters(prefix="g_inc") if p.requires_grad}
        assert trainable == {str(session - 1)}  # only the newest branch trains
        out = proj.session_outputs(f)
        with torch.no_grad():
            parts = [b(f) for b in proj.g_inc.branches]
        torch.testing.assert_close(out.mu_inc, sum(parts))
        assert session == 1 or not torch.equal(out.mu_inc, before)
        sizes.append(sum(p.numel() for p in proj.g_inc.parameters()))
    assert sizes[1] - sizes[0] == sizes[2] - sizes[1] == sizes[0]  # parameters grow linearly with sessions
    proj.set_sessions(1)
    assert len(proj.g_inc.branches) == 1


def test_expanding_baseline_through_three_sessions(tmp_path, monkeypatch):
    """A tiny pipeline with expanding_mlp: session s stores s g_inc branches; a branch never changes after its
    own session (bit for bit), and the suppression acts on the newest branch's output."""
    import pipeline.training.session_step as session_step

    used = []
    targets = dict(session_step.SUPPRESSION_TARGETS)

    def recorded(name):
        def target(aux, mu_inc):
            used.append((name, aux.mu_newest is not None))
            return targets[name](aux, mu_inc)
        return target

    monkeypatch.setattr(session_step, "SUPPRESSION_TARGETS", {name: recorded(name) for name in targets})
    from pipeline.training.checkpoint import load_checkpoint, unprefixed
    from stages.paths import StagePaths
    from tests.pipeline_fixtures import NUM_SESSIONS, run_pipeline, write_params

    params = write_params(tmp_path / "params.yaml", model={"projector": "expanding_mlp"},
                          incremental={"lambda2": 0.0, "lambda3": 0.0, "inc_init": "random", "suppression": "z"})
    run_pipeline(params, tmp_path / "data", tmp_path / "metrics.json")
    paths = StagePaths(tmp_path / "data")
    states = [unprefixed(load_checkpoint(paths.session(s) / "state.safetensors")[0], "adapting")
              for s in range(1, NUM_SESSIONS + 1)]
    for s, state in enumerate(states, start=1):
        assert {k.split(".")[1] for k in state} == {str(i) for i in range(s)}
    for branch in range(NUM_SESSIONS):
        keys = [k for k in states[branch] if k.startswith(f"branches.{branch}.")]
        gate = states[branch][f"branches.{branch}.in_proj.weight"][16:]
        assert gate.abs().sum() > 0  # it trained in its own session (it started at zero)
        for later in states[branch + 1:]:
            assert all(torch.equal(states[branch][k], later[k]) for k in keys)  # and never after
    assert used and set(used) == {("mu_inc", True)}  # configured z: the appendix's rule says g_inc's output
