"""The authors' base training (docs/research/authors-code.md), each against a value computed by hand: BatchNorm
statistics per device group (base.device_batch), Mixup partners within a group, the passes of base.repeat with the
last batch kept, and every preset's lr at its schedule's boundaries."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pipeline.config import build_config
from pipeline.data.mixing import group_permutation, mixup_cutmix
from pipeline.training.base_session import base_plan
from pipeline.training.distributed import DeviceBatchNorm2d, convert_device_batchnorm
from pipeline.training.registry import BASE_SCHEDULES


def test_device_batchnorm_is_plain_batchnorm_on_each_group_and_keeps_the_first_groups_statistics():
    gen = torch.Generator().manual_seed(0)
    x = (2.0 + 3.0 * torch.randn(6, 3, 4, 5, generator=gen)).requires_grad_()
    upstream = torch.randn(6, 3, 4, 5, generator=gen)
    plain = nn.BatchNorm2d(3)
    with torch.no_grad():
        plain.weight.copy_(torch.tensor([0.5, 1.5, 2.0]))
        plain.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    device = convert_device_batchnorm(nn.Sequential(_copy(plain)), groups=3)[0]
    assert isinstance(device, DeviceBatchNorm2d) and device.groups == 3
    out = device(x)
    (out * upstream).sum().backward()
    grad_x, grad_w = x.grad.clone(), device.weight.grad.clone()
    # by hand: plain BatchNorm on each pair of rows, a fresh copy each (the first one's running statistics kept)
    x.grad = None
    refs = [_copy(plain) for _ in range(3)]
    want = torch.cat([bn(x[2 * g:2 * g + 2]) for g, bn in enumerate(refs)])
    (want * upstream).sum().backward()
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(grad_x, x.grad)
    torch.testing.assert_close(grad_w, sum(bn.weight.grad for bn in refs))
    torch.testing.assert_close(device.running_mean, refs[0].running_mean)
    torch.testing.assert_close(device.running_var, refs[0].running_var)  # unbiased over 2 x 4 x 5 values
    mean0 = x[:2].detach().mean(dim=(0, 2, 3))
    torch.testing.assert_close(device.running_mean, 0.1 * mean0)
    # not the global statistics: one group of 6 rows differs
    assert not torch.allclose(out, _copy(plain)(x))
    device.eval()
    torch.testing.assert_close(device(x), refs[0].eval()(x))


def _copy(bn: nn.BatchNorm2d) -> nn.BatchNorm2d:
    new = nn.BatchNorm2d(bn.num_features)
    new.load_state_dict(bn.state_dict())
    return new


def test_mixup_partners_stay_in_their_device_group_with_one_permutation():
    perm = group_permutation(12, 3, torch.Generator().manual_seed(1))
    assert torch.equal(perm // 4, torch.arange(12) // 4)  # each row's partner in its own block of 4
    assert torch.equal(perm[0:4] - 0, perm[4:8] - 4) and torch.equal(perm[0:4], perm[8:12] - 8)
    x = torch.arange(12.0).view(12, 1, 1, 1).expand(12, 3, 2, 2).contiguous()
    y = torch.arange(12)
    mixed = mixup_cutmix(x, y, 12, 1.0, 0.0, 1.0, 0.5, torch.Generator().manual_seed(0), groups=3)
    assert mixed.kind == "mixup" and torch.equal(mixed.target_b // 4, y // 4)
    with pytest.raises(ValueError, match="does not split into 5 device groups"):
        mixup_cutmix(x, y, 12, 1.0, 0.0, 1.0, 0.5, torch.Generator(), groups=5)


def _lrs(preset: str, steps: list[int]) -> tuple[object, list[float]]:
    cfg = build_config({"preset": preset, "variant": "mamba_fscil", "data": {"source": "synthetic"}})
    images = cfg.data.generated_counts()[0] * cfg.data.protocol_shape()[0]  # the benchmark's base training images
    plan = base_plan(cfg.base, images)

    def at(step: int) -> float:
        epoch = step // plan.steps * cfg.base.repeat + step % plan.steps * cfg.base.repeat // plan.steps
        return cfg.base.lr * BASE_SCHEDULES[cfg.base.schedule](cfg.base, step, plan.total_steps, epoch)

    return plan, [at(s) for s in steps]


def test_cifar100_base_lr_by_hand():
    """30,000 images x 4 a pass, 235 iterations of 512 (the last of 192), 50 passes: 11,750; mmcv's cosine to 0.01x
    over 11,740, warm-up factor from 0.1 over 100, 10 cool-down iterations at 0.1 x 0.01 x 0.25."""
    steps = [0, 50, 99, 100, 5870, 11740, 11741, 11749]
    plan, lrs = _lrs("cifar100", steps)
    assert (plan.steps, plan.total_steps, plan.rows - 234 * 512) == (235, 11750, 192)

    def cos(it):
        return 0.25 * (0.01 + 0.5 * 0.99 * (math.cos(math.pi * it / 11740) + 1))

    want = [cos(0) * 0.1, cos(50) * (1 - 0.5 * 0.9), cos(99) * (1 - 0.01 * 0.9), cos(100), cos(5870), 0.0025,
            2.5e-4, 2.5e-4]
    assert lrs == pytest.approx(want, rel=1e-12)
    assert lrs[0] == pytest.approx(0.025) and lrs[4] == pytest.approx(0.25 * 0.505, rel=1e-3)


def test_mini_imagenet_base_lr_by_hand():
    """30,000 images x 10 a pass, 586 iterations (the last of 480), 50 passes: 29,300; lr 0.25 x 0.25 at each of
    epochs 200, 300, 350, 400, 450 (passes 20, 30, 35, 40, 45), warm-up factor from 0.25 over 3,000 iterations."""
    per = 586
    steps = [0, 1500, 2999, 3000, 20 * per - 1, 20 * per, 30 * per, 35 * per, 40 * per, 45 * per, 50 * per - 1]
    plan, lrs = _lrs("mini_imagenet", steps)
    assert (plan.steps, plan.total_steps, plan.rows - 585 * 512) == (per, 29300, 480)
    want = [0.25 * 0.25, 0.25 * (1 - 0.5 * 0.75), 0.25 * (1 - 0.75 / 3000), 0.25, 0.25, 0.25 ** 2, 0.25 ** 3,
            0.25 ** 4, 0.25 ** 5, 0.25 ** 6, 0.25 ** 6]
    assert lrs == pytest.approx(want, rel=1e-12)


def test_cub200_base_lr_by_hand():
    """3,000 images x 4 a pass, 24 iterations (the last of 224), 20 passes: 480 (ours with drop_last: 400); cosine
    to 0.1x over 470, warm-up factor from 0.1 over 100, 10 cool-down iterations at 0.1 x 0.1 x 0.2."""
    steps = [0, 99, 100, 235, 470, 471, 479]
    plan, lrs = _lrs("cub200", steps)
    assert (plan.steps, plan.total_steps, plan.rows - 23 * 512) == (24, 480, 224)

    def cos(it):
        return 0.2 * (0.1 + 0.5 * 0.9 * (math.cos(math.pi * it / 470) + 1))

    want = [cos(0) * 0.1, cos(99) * (1 - 0.01 * 0.9), cos(100), cos(235), 0.02, 0.002, 0.002]
    assert lrs == pytest.approx(want, rel=1e-12)
    ours = build_config({"preset": "cub200", "variant": "mamba_fscil", "data": {"source": "synthetic"},
                         "base": {"drop_last": True, "repeat": 1}})
    assert base_plan(ours.base, 3000).total_steps == 400  # 5 a epoch: 15 % of the images dropped


def test_passes_pad_to_whole_device_groups_like_their_sampler():
    cfg = build_config({"preset": "synthetic", "base": {"epochs": 6, "batch_size": 16, "device_batch": 4,
                                                         "repeat": 3, "drop_last": False, "checkpoint_every": 3}})
    plan = base_plan(cfg.base, 21)  # 63 rows a pass, padded to 64: 4 batches of 16
    assert plan == (2, 4, 64, 4, 64)
    dropped = build_config({"preset": "synthetic", "base": {"epochs": 6, "batch_size": 16, "repeat": 3,
                                                            "checkpoint_every": 3}})
    assert base_plan(dropped.base, 21) == (2, 3, 63, 1, 48)


def test_the_authors_mixed_loss_counts_the_first_targets_loss_twice_on_a_mixed_batch_only():
    """base.mix_loss lam_weighted_plus_a against the formula by hand (their classifier's mixed branch, then its
    plain branch on the same features): lam L(a) + (1 - lam) L(b) + L(a) on a Mixup / CutMix batch, L(a) once on an
    unmixed one; DR x 10 per sample, class-balanced weights of each target when asked; the paper's form has no
    third term."""
    from pipeline.config.sections import BaseConfig
    from pipeline.losses.classification import class_balance_weights
    from pipeline.models.registry import HEADS
    from pipeline.training.base_session import base_loss

    gen = torch.Generator().manual_seed(0)
    cos = torch.rand(6, 5, generator=gen, dtype=torch.float64) * 2 - 1
    y_a, y_b = torch.tensor([0, 1, 2, 3, 4, 0]), torch.tensor([1, 1, 0, 2, 4, 3])
    lam = torch.full((6,), 0.3, dtype=torch.float64)
    dr = lambda i, y: 10 * 0.5 * (cos[i, y[i]] - 1) ** 2  # noqa: E731
    l_a, l_b = sum(dr(i, y_a) for i in range(6)) / 6, sum(dr(i, y_b) for i in range(6)) / 6
    paper, authors = BaseConfig(dr_scale=10.0), BaseConfig(dr_scale=10.0, mix_loss="lam_weighted_plus_a")
    one, zero = True, False
    got = base_loss(HEADS["etf"], authors, cos, None, y_a, y_b, lam, mixed=one)
    assert torch.allclose(got, 0.3 * l_a + 0.7 * l_b + l_a, rtol=1e-12, atol=0)
    assert torch.allclose(base_loss(HEADS["etf"], paper, cos, None, y_a, y_b, lam, mixed=one), 0.3 * l_a + 0.7 * l_b,
                          rtol=1e-12, atol=0)
    unmixed = torch.ones(6, dtype=torch.float64)
    assert torch.allclose(base_loss(HEADS["etf"], authors, cos, None, y_a, y_a, unmixed, mixed=zero), l_a,
                          rtol=1e-12, atol=0)
    # with the authors' with_len weights (miniImageNet's DR weighting): each target's own weights, the third term
    # weighted as the first
    w_a, w_b = class_balance_weights(y_a, 5).double(), class_balance_weights(y_b, 5).double()
    wa = sum(w_a[i] * dr(i, y_a) for i in range(6)) / 6
    wb = sum(w_b[i] * dr(i, y_b) for i in range(6)) / 6
    got = base_loss(HEADS["etf"], authors, cos, None, y_a, y_b, lam, one, (w_a, w_b))
    assert torch.allclose(got, 0.3 * wa + 0.7 * wb + wa, rtol=1e-12, atol=0)


def test_the_cifar100_preset_sets_the_authors_mixed_loss_and_no_other_preset_mixes_without_it():
    from pipeline.config import available_presets

    assert build_config({"preset": "cifar100", "data": {"source": "synthetic"}}).base.mix_loss == "lam_weighted_plus_a"
    for preset in available_presets():
        paper = preset in ("cifar100", "mini_imagenet", "cub200")
        cfg = build_config({"preset": preset, "data": {"source": "synthetic"} if paper else {"root": "x"}})
        if preset not in ("cifar100",):
            assert cfg.base.mix_loss == "lam_weighted", preset  # the paper's form: CPU presets; mini, CUB never mix
        if preset in ("mini_imagenet", "cub200"):
            assert cfg.base.mixup_alpha == cfg.base.cutmix_alpha == 0.0, preset
