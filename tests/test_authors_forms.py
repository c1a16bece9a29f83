"""The authors' forms of the session objective and schedule (docs/research/authors-code.md), each against a value
computed by hand: the non-squared suppression, the separation's |I - S| mean on the low-rank dt of the first order,
the channel-flipped Z, the class-balanced DR loss, the loss groups with their MIN gate, mmcv's session schedule; and
the paper presets set them (`fscil config show --origin`)."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.config import build_config
from pipeline.data.mixing import mixup_draws
from pipeline.losses.class_sensitive import separation_loss, suppression_loss
from pipeline.losses.classification import class_balance_weights, dot_regression_loss, mixed_loss, target_weights
from pipeline.models.mamba1d import cross_merge_channel_flip
from pipeline.models.ss2d import BranchAux
from pipeline.ops.cross_scan import cross_scan
from pipeline.training.registry import SCHEDULES
from pipeline.training.schedule import mmcv_cosine_cooldown
from pipeline.training.session_step import SessionDraws, session_batch
from tests.pipeline_fixtures import cli

# N=3, L=2, D'=2; sample 0 is base, samples 1 and 2 are novel
Z = torch.tensor([[[1.0, 2.0], [0.0, 1.0]], [[2.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]])
IS_BASE = torch.tensor([True, False, False])


def test_norm_per_element_is_the_groups_frobenius_norm_over_its_element_count_not_squared():
    base = math.sqrt(1 + 4 + 0 + 1) / 4  # ||Z_base||_F / (1 x 2 x 2)
    novel = math.sqrt(4 + 1 + 1 + 1 + 1) / 8  # ||Z_novel||_F / (2 x 2 x 2)
    got = suppression_loss(Z, IS_BASE, 100.0, 0.5, form="norm_per_element")
    assert got.item() == pytest.approx(100 * base - 0.5 * novel, rel=1e-6)
    # scaling Z by 10 scales the authors' form by 10, the paper's squared form by 100
    assert suppression_loss(10 * Z, IS_BASE, 1.0, 0.0, form="norm_per_element").item() == pytest.approx(10 * base)
    squared = suppression_loss(Z, IS_BASE, 1.0, 0.0).item()
    assert suppression_loss(10 * Z, IS_BASE, 1.0, 0.0).item() == pytest.approx(100 * squared)


def test_norm_per_element_has_a_zero_gradient_at_a_zero_gate():
    """g_inc's gate starts at zero, so Z = 0 on the first step: the gradient must be 0, not NaN."""
    z = torch.zeros(4, 3, 2, requires_grad=True)
    loss = suppression_loss(z, torch.tensor([True, True, False, False]), 100.0, 1.0, form="norm_per_element")
    (grad,) = torch.autograd.grad(loss, z)
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))


def _params(n_paths: int = 2):
    """N=2 (base, novel), K=n_paths, L=2: B means (1, 0) vs (1, 1) on path 0; path 1 makes them opposite."""
    b = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]])[:, None]  # (2, 1, L, 2)
    b = torch.cat([b, torch.stack([b[0], -b[0]])], dim=1)[:, :n_paths]  # path 1: base (1, 0), novel (-1, 0)
    dt_low = torch.tensor([[[3.0, 0.0], [3.0, 0.0]], [[0.0, 5.0], [0.0, 5.0]]])[:, None].repeat(1, n_paths, 1, 1)
    delta = torch.ones(2, n_paths, 2, 3)  # identical means: |cos| = 1
    return BranchAux(z=torch.zeros(()), B=b, dt_low=dt_low, delta=delta)


def test_confusion_mean_on_dt_low_of_the_first_order_by_hand():
    is_base = torch.tensor([True, False])
    # path 0 alone: B |cos| = 1/sqrt(2); dt_low orthogonal: 0; |I - S| averages 2 x |cos| over 4 entries
    got = separation_loss(_params(), is_base, form="confusion_mean", delta="dt_low", paths="first")
    assert got.item() == pytest.approx(0.5 / math.sqrt(2), abs=1e-6)
    # the paper's form reads Delta (identical means: 1) and both paths (B means (1, 0) vs (0, 0.5): cos 0)
    assert separation_loss(_params(), is_base).item() == pytest.approx(0.0 + 1.0, abs=1e-6)
    # the authors' form on both paths and on Delta: (0 + 1) / 2
    got = separation_loss(_params(), is_base, form="confusion_mean")
    assert got.item() == pytest.approx(0.5, abs=1e-6)


def test_channel_flip_merge_is_twice_z_plus_twice_z_reversed_in_tokens_and_channels():
    """By hand on the 4 orders: the reversed row-major order flipped on channels stays reversed in tokens; the
    reversed column-major order mapped back to row-major is reversed in tokens too; the other two give z."""
    torch.manual_seed(0)
    for h, w in ((2, 2), (3, 3), (2, 3)):
        z = torch.randn(2, 3, h * w)  # (N, D, L) row-major
        got = cross_merge_channel_flip(cross_scan(z.view(2, 3, h, w), 4), h, w)
        torch.testing.assert_close(got, 2 * z + 2 * z.flip(1).flip(2))


def test_class_balanced_dr_weights_and_mixed_loss_by_hand():
    labels = torch.tensor([0, 0, 0, 1])
    # batch 4, 2 classes present: gamma 2; class 0 has 3 samples, class 1 one
    torch.testing.assert_close(class_balance_weights(labels, 5), torch.tensor([2 / 3, 2 / 3, 2 / 3, 2.0]))
    logits = torch.tensor([[0.5, 0.1], [0.2, 0.0], [1.0, 0.3], [0.1, -0.5]])
    per = 0.5 * (torch.tensor([0.5, 0.2, 1.0, -0.5]) - 1) ** 2
    want = 10 * (per * torch.tensor([2 / 3, 2 / 3, 2 / 3, 2.0])).mean()
    got = mixed_loss(dot_regression_loss, logits, labels, labels, torch.ones(4), scale=10.0,
                     weights=target_weights("class_balanced", labels, labels, 5))
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    # the authors' with_len: 0.5 mean((f . r w - r)^2) with r = sqrt(weight) equals the weighted DR loss
    r = torch.tensor([2 / 3, 2 / 3, 2 / 3, 2.0]).sqrt()
    cos_y = torch.tensor([0.5, 0.2, 1.0, -0.5])
    assert (10 * 0.5 * ((r * cos_y - r) ** 2).mean()).item() == pytest.approx(want.item(), rel=1e-6)


def test_loss_groups_gate_a_term_off_when_one_group_lacks_its_rows():
    """Rows r in group r % 2. Base rows only in group 0: the base suppression and the separation are off; the
    novel term runs, the mean over the groups of each group's value."""
    torch.manual_seed(0)
    z = torch.randn(8, 3, 2)
    is_base = torch.tensor([True, False, True, False, False, False, False, False])  # group 1 has no base row
    got = suppression_loss(z, is_base, 100.0, 1.0, form="norm_per_element", groups=2)
    g0, g1 = z[0::2], z[1::2]
    novel = (g0[2:].norm() / g0[2:].numel() + g1.norm() / g1.numel()) / 2
    assert got.item() == pytest.approx(-novel.item(), rel=1e-6)
    params = BranchAux(z=torch.zeros(()), B=torch.randn(8, 1, 3, 4))
    assert separation_loss(params, is_base, groups=2).item() == 0.0
    # with one group the same batch runs both terms
    assert separation_loss(params, is_base).item() > 0
    # every group holds both: the mean of the groups' own values
    is_base = torch.tensor([True, True, False, False, False, False, True, False])
    want = sum(suppression_loss(z[g::2], is_base[g::2], 100.0, 1.0, "norm_per_element").item() for g in (0, 1)) / 2
    got = suppression_loss(z, is_base, 100.0, 1.0, form="norm_per_element", groups=2)
    assert got.item() == pytest.approx(want, rel=1e-6)
    per_group = [separation_loss(BranchAux(z=params.z, B=params.B[g::2]), is_base[g::2], "confusion_mean").item()
                 for g in (0, 1)]
    got = separation_loss(params, is_base, "confusion_mean", groups=2)
    assert got.item() == pytest.approx(sum(per_group) / 2, rel=1e-6)


def test_grouped_feature_mixup_partners_stay_in_their_group_with_one_permutation():
    perm = mixup_draws(16, 1.0, torch.Generator().manual_seed(3), groups=8)
    rows = torch.arange(16)
    assert torch.equal(perm % 8, rows % 8)  # each row's partner is in its own group
    assert torch.equal(perm[0::8] // 8, perm[1::8] // 8)  # every group mixes its rows the same way
    assert sorted(perm.tolist()) == rows.tolist()


def test_a_session_smaller_than_a_batch_is_padded_to_whole_groups_with_its_first_rows():
    """45 rows (20 base means + 25 shots) and 8 loss groups: the authors' sampler padded each epoch to 48 rows by
    repeating the permutation's first 3, so each of their 8 GPUs held 6; one batch an epoch, a fresh permutation."""
    assert (session_batch(45, 64, 8), session_batch(85, 64, 8), session_batch(45, 64, 1), session_batch(3, 64, 8)) == (
        48, 64, 45, 8)
    draws = SessionDraws(torch.Generator().manual_seed(0), 45, 3, 48, 1.0, "cpu", None, 8)
    gen = torch.Generator().manual_seed(0)
    for step in range(3):
        order = torch.randperm(45, generator=gen)
        idx, perm, _ = draws.step(step)
        assert torch.equal(idx, torch.cat([order, order[:3]]))
        assert torch.equal(perm % 8, torch.arange(48) % 8)  # mixup partners within each group of 6
        mixup_draws(48, 1.0, gen, 8)  # the same generator's draws for the partners
    assert not torch.equal(draws.step(0)[0], draws.step(1)[0])
    tiny = SessionDraws(torch.Generator().manual_seed(1), 3, 1, 8, 0.0, "cpu", None, 8)
    assert sorted(torch.bincount(tiny.step(0)[0], minlength=3).tolist()) == [2, 3, 3]  # 3 rows over 8: cycled


def test_mmcv_session_schedule_at_its_boundaries_by_hand():
    """The authors' session loop at CIFAR-100's 200 steps, lr 0.25: iteration = step + 1, warm-up factors 0.28,
    0.46, 0.64, 0.82 multiplying the cosine, the cosine's floor 0.01 at iteration 195, 5 cool-down steps at 0.1 x."""
    lr = 0.25

    def cos_value(it):
        return 0.01 + 0.5 * 0.99 * (math.cos(math.pi * it / 195) + 1)

    from types import SimpleNamespace
    inc = SimpleNamespace(warmup_steps=5, warmup_ratio=0.1, min_lr_ratio=0.01, cooldown_steps=5, cooldown_ratio=0.1)
    lrs = [lr * SCHEDULES["mmcv_cosine_cooldown"](inc, s, 200) for s in range(200)]
    assert lrs[0] == pytest.approx(lr * 0.28 * cos_value(1), rel=1e-12) and lrs[0] == pytest.approx(0.0700, abs=5e-5)
    for step, factor in ((1, 0.46), (2, 0.64), (3, 0.82)):
        assert lrs[step] == pytest.approx(lr * factor * cos_value(step + 1), rel=1e-12)
    assert lrs[4] == pytest.approx(lr * cos_value(5), rel=1e-12)  # iteration 5: no warm-up factor
    assert lrs[194] == pytest.approx(lr * 0.01, rel=1e-12)  # iteration 195: the floor
    assert lrs[195:] == pytest.approx([lr * 0.01 * 0.1] * 5, rel=1e-12)  # 2.5e-4
    # ours: from step 0 at 0.1 x, to the peak at step 5, to the floor at the last step
    ours = SimpleNamespace(**vars(inc))
    assert SCHEDULES["warmup_cosine"](ours, 0, 200) == pytest.approx(0.1)
    assert SCHEDULES["warmup_cosine"](ours, 199, 200) == pytest.approx(0.01, rel=0.01)  # 194/195 of the way
    assert mmcv_cosine_cooldown(0, 10, 0, 0.1, 0.0, 0, 0.1) == pytest.approx(1.0)


PAPER_FORMS = {
    "cifar100": {"model.ssm_branch": "mamba_1d", "incremental.suppression": "z_channel_flip",
                 "incremental.separation_paths": "first", "incremental.dr_weighting": "class_balanced"},
    "mini_imagenet": {"model.ssm_branch": "mamba_1d", "incremental.suppression": "z_channel_flip",
                      "incremental.dr_weighting": "class_balanced"},
    "cub200": {"model.ssm_branch": "ss2d", "model.out_norm": "true", "model.inc_mlp_layers": "3",
               "incremental.freeze_base": "false", "incremental.base_lr_scale": "0.2",
               "incremental.lambda3_base": "0.001", "incremental.dr_weighting": "uniform"},
}
COMMON = {"incremental.schedule": "mmcv_cosine_cooldown", "incremental.suppression_form": "norm_per_element",
          "incremental.separation_form": "confusion_mean", "incremental.separation_delta": "dt_low",
          "incremental.loss_groups": "8"}


@pytest.mark.parametrize("preset", sorted(PAPER_FORMS))
def test_config_show_origin_shows_the_authors_forms_on_each_paper_preset(preset):
    result = cli("config", "show", "--origin", "-S", f"preset={preset}", "-S", "variant=mamba_fscil",
                 "-S", "data.source=synthetic")
    assert result.exit_code == 0, result.output
    lines = {line.split(":")[0]: line for line in result.output.splitlines()}
    for key, value in {**COMMON, **PAPER_FORMS[preset]}.items():
        assert lines[key].startswith(f"{key}: {value}") and lines[key].endswith(f"# preset {preset}"), lines[key]
    # the CPU presets keep the paper's text
    cfg = build_config({"preset": "synthetic_quick", "variant": "mamba_fscil"})
    inc = cfg.incremental
    assert (inc.suppression_form, inc.separation_form, inc.separation_delta, inc.separation_paths, inc.loss_groups,
            inc.dr_weighting, inc.schedule, cfg.model.ssm_branch) == (
        "squared_mean", "abs_cos", "delta", "all", 1, "uniform", "warmup_cosine", "ss2d")


def test_cub_forms_a_three_layer_p_mlp_for_g_inc_and_a_separation_on_g_base():
    from pipeline.models.classifier import ETFClassifier
    from pipeline.models.projector import Projector
    from pipeline.models.ss2d import BranchDims
    from pipeline.training.session_step import incremental_loss

    dims = BranchDims(dim=8, d_state=4, dt_rank=3, k_paths=4, expand=1, d_conv=None, mlp_layers=2, out_norm=True)
    torch.manual_seed(0)
    proj = Projector("dual_ssm", 6, (2, 2), dims, inc_mlp_layers=3)
    hidden = 12  # 2C
    extra = hidden * hidden + hidden + 2 * hidden * 2 * 2  # the repeated conv1x1 and LayerNorm
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(proj.g_inc) == count(proj.g_base) + extra
    assert len(proj.g_inc.p_mlp.net) == len(proj.g_base.p_mlp.net) + 3
    # lambda3_base adds lambda3_base x the separation of g_base's own parameters (here with lambda3 = 0)
    cfg = build_config({"preset": "cub200", "data": {"source": "synthetic"},
                        "model": {"dim": 8, "d_state": 4, "dt_rank": 3},
                        "incremental": {"lambda1": 1.0, "lambda2": 0.0, "lambda3": 0.0, "lambda3_base": 0.5,
                                        "loss_groups": 2}})
    with torch.no_grad():
        proj.g_inc.in_proj.weight.normal_()
    x, y = torch.randn(8, 6, 2, 2), torch.tensor([0, 1, 120, 121, 2, 3, 122, 123])
    is_base = y < 100
    etf = ETFClassifier(8, 8)
    _, _, sep = incremental_loss(proj, etf, x, y % 8, is_base, 8, "etf", cfg.incremental, None)
    with torch.no_grad():
        aux_base = proj.g_base(x, return_aux=True)[1]
    inc = cfg.incremental
    want = 0.5 * separation_loss(aux_base, is_base, inc.separation_form, inc.separation_delta, inc.separation_paths,
                                 inc.loss_groups)
    assert sep.item() == pytest.approx(want.item(), rel=1e-5) and want.item() > 0
    # it trains g_base: refused while the base parts are frozen
    with pytest.raises(Exception, match="lambda3_base needs freeze_base false"):
        build_config({"preset": "cub200", "data": {"source": "synthetic"},
                      "incremental": {"freeze_base": True}})
