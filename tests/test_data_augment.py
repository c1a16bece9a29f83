"""Batched augmentation, test transform and Mixup/CutMix on torch tensors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from pipeline.config.sections import BaseConfig
from pipeline.data.augment import crop_boxes, test_transform, train_augment
from pipeline.data.mixing import mixup_cutmix
from pipeline.data.presets import PRESETS, get_preset
from pipeline.errors import FSCILError
from pipeline.training.base_session import _base_batch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def images(n: int, size: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8))


def unnormalize(y: torch.Tensor, preset) -> torch.Tensor:
    """Back to [0, 255] (N, H, W, 3) for comparisons with the uint8 input."""
    mean = torch.tensor(preset.mean, device=y.device).view(1, 3, 1, 1)
    std = torch.tensor(preset.std, device=y.device).view(1, 3, 1, 1)
    return ((y * std + mean) * 255).permute(0, 2, 3, 1)


def plain(**kw):
    """A preset with every random transform switched off unless asked for."""
    base = dict(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), flip_prob=0.0, brightness=0.0, contrast=0.0,
                saturation=0.0)
    return replace(PRESETS["synthetic"], **{**base, **kw})


@pytest.mark.parametrize("device", DEVICES)
def test_train_augment_shape_range_and_determinism(device: str) -> None:
    preset = get_preset("cifar100")
    x = images(16, 32).to(device)
    out = train_augment(x, preset, torch.Generator(device).manual_seed(3))
    assert out.shape == (16, 3, 32, 32) and out.dtype == torch.float32 and out.device.type == device
    back = unnormalize(out, preset)
    assert back.min() >= -1e-3 and back.max() <= 255 + 1e-3
    again = train_augment(x, preset, torch.Generator(device).manual_seed(3))
    other = train_augment(x, preset, torch.Generator(device).manual_seed(4))
    assert torch.equal(out, again) and not torch.allclose(out, other)


def test_identity_and_flip_are_exact() -> None:
    x = images(4, 8)
    g = torch.Generator().manual_seed(0)
    same = unnormalize(train_augment(x, plain(input_size=8), g), plain())
    torch.testing.assert_close(same, x.float(), atol=1e-3, rtol=0)
    flipped = unnormalize(train_augment(x, plain(input_size=8, flip_prob=1.0), g), plain())
    torch.testing.assert_close(flipped, x.flip(2).float(), atol=1e-3, rtol=0)


def test_crops_are_windows_of_the_image() -> None:
    """Area 1/4, square ratio, output 4 x 4 on an 8 x 8 image: each output is exactly a 4 x 4 window."""
    x = images(64, 8, seed=1)
    preset = plain(input_size=4, crop_scale=(0.25, 0.25))
    out = unnormalize(train_augment(x, preset, torch.Generator().manual_seed(0)), preset)
    offsets = set()
    for k in range(len(x)):
        matches = [(i, j) for i in range(5) for j in range(5)
                   if torch.allclose(out[k], x[k, i : i + 4, j : j + 4].float(), atol=1e-3)]
        assert len(matches) == 1
        offsets.add(matches[0])
    assert len(offsets) > 10  # positions really are random


def test_crop_boxes_follow_torchvision_rules() -> None:
    g = torch.Generator().manual_seed(0)
    boxes = crop_boxes(200, 20, 30, (0.1, 0.5), (0.5, 2.0), g, torch.device("cpu"))
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 20).all() and (left + w <= 30).all()
    area = (h * w).float() / 600
    assert area.min() > 0.08 and area.max() < 0.56
    # no try can fit (area 1 at ratio >= 2 on a square): the whole width, height clamped to the ratio, centred
    fallback = crop_boxes(3, 8, 8, (1.0, 1.0), (2.0, 3.0), g, torch.device("cpu"))
    assert fallback.tolist() == [[2, 0, 4, 8]] * 3


def test_color_jitter_factors() -> None:
    x = torch.full((200, 4, 4, 3), 100, dtype=torch.uint8)
    bright = unnormalize(train_augment(x, plain(input_size=4, brightness=0.4), torch.Generator().manual_seed(0)),
                         plain())
    factor = bright[:, 0, 0, 0] / 100
    assert torch.allclose(bright, bright[:, :1, :1, :1].expand_as(bright), atol=1e-3)  # one factor per image
    assert factor.min() >= 0.6 - 1e-4 and factor.max() <= 1.4 + 1e-4 and factor.std() > 0.1
    # contrast and saturation leave a flat grey image unchanged
    flat = unnormalize(train_augment(x, plain(input_size=4, contrast=0.4, saturation=0.4),
                                     torch.Generator().manual_seed(0)), plain())
    torch.testing.assert_close(flat, x.float(), atol=1e-3, rtol=0)


def test_test_transform_by_hand() -> None:
    x = images(3, 16, seed=2)
    preset = replace(PRESETS["cub200"], image_size=16, input_size=12, test_resize=16)  # pure centre crop
    expected = (x[:, 2:14, 2:14].permute(0, 3, 1, 2).float() / 255
                - torch.tensor(preset.mean).view(1, 3, 1, 1)) / torch.tensor(preset.std).view(1, 3, 1, 1)
    torch.testing.assert_close(test_transform(x, preset), expected)
    # CIFAR: resize 32 -> 36 (bicubic), centre 32; a flat image stays flat
    cifar = get_preset("cifar100")
    flat = torch.full((2, 32, 32, 3), 77, dtype=torch.uint8)
    out = test_transform(flat, cifar)
    assert out.shape == (2, 3, 32, 32)
    want = (77 / 255 - torch.tensor(cifar.mean)) / torch.tensor(cifar.std)
    torch.testing.assert_close(out, want.view(1, 3, 1, 1).expand_as(out), atol=1e-5, rtol=0)
    assert test_transform(images(2, 84), get_preset("mini_imagenet")).shape == (2, 3, 84, 84)
    with pytest.raises(ValueError, match="expected uint8"):
        test_transform(flat.float(), cifar)


def test_presets() -> None:
    cub = get_preset("cub200")
    assert (cub.image_size, cub.input_size, cub.test_resize, cub.crop_scale) == (224, 224, 256, (0.08, 1.0))
    assert get_preset("cub200", 448).test_resize == 512 and get_preset("cifar100").crop_scale == (0.6, 1.0)
    assert get_preset("mini_imagenet").test_resize == 96
    with pytest.raises(FSCILError, match="unknown image preset 'imagenet'"):
        get_preset("imagenet")


# ---- Mixup / CutMix ------------------------------------------------------------------------------------
def indexed_batch(n: int = 8, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample i is the constant image i (so every pixel tells which sample it came from); label = i."""
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 3, size, size).clone()
    return x, torch.arange(n)


def test_mixup_mixes_pixels_and_targets_with_lam() -> None:
    x, y = indexed_batch()
    m = mixup_cutmix(x, y, 10, mixup_alpha=1.0, cutmix_alpha=0.0, prob=1.0, switch_prob=0.5,
                     generator=torch.Generator().manual_seed(0))
    assert m.kind == "mixup" and 0 < m.lam[0] < 1 and torch.all(m.lam == m.lam[0])
    torch.testing.assert_close(m.images, m.lam.view(-1, 1, 1, 1) * x + (1 - m.lam.view(-1, 1, 1, 1)) * x[m.partner])
    assert torch.equal(m.target_a, y) and torch.equal(m.target_b, y[m.partner])
    soft = m.soft_targets()
    torch.testing.assert_close(soft.sum(1), torch.ones(8))
    moved = m.partner != torch.arange(8)
    assert torch.allclose(soft[moved, y[moved]], m.lam[moved])


def test_cutmix_lam_is_the_kept_area() -> None:
    x, y = indexed_batch(size=20)
    m = mixup_cutmix(x, y, 8, mixup_alpha=1.0, cutmix_alpha=1.0, prob=1.0, switch_prob=1.0,
                     generator=torch.Generator().manual_seed(5))
    assert m.kind == "cutmix"
    for i in range(8):
        if m.partner[i] == i:
            continue
        kept = (m.images[i, 0] == i).float().mean()
        pasted = (m.images[i, 0] == m.partner[i]).float().mean()
        assert torch.isclose(kept, m.lam[i]) and torch.isclose(pasted, 1 - m.lam[i])
        assert m.target_b[i] == m.partner[i]


def test_no_mixing_counts_each_sample_once() -> None:
    x, y = indexed_batch()
    m = mixup_cutmix(x, y, 8, mixup_alpha=1.0, cutmix_alpha=1.0, prob=0.0, switch_prob=0.5,
                     generator=torch.Generator().manual_seed(0))
    assert m.kind == "none" and torch.equal(m.images, x) and torch.equal(m.target_b, y)
    loss_a, loss_b = torch.rand(8), torch.rand(8)
    assert torch.equal(m.combine(loss_a, loss_a), loss_a)  # lam = 1: L(y_a) once, nothing added
    mixed = mixup_cutmix(x, y, 8, 1.0, 0.0, 1.0, 0.5, torch.Generator().manual_seed(0))
    torch.testing.assert_close(mixed.combine(loss_a, loss_b), mixed.lam * loss_a + (1 - mixed.lam) * loss_b)


def test_mixing_is_deterministic_per_generator() -> None:
    x, y = indexed_batch()
    runs = [mixup_cutmix(x, y, 8, 0.8, 1.0, 1.0, 0.5, torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert torch.equal(runs[0].images, runs[1].images) and torch.equal(runs[0].partner, runs[1].partner)
    assert not torch.equal(runs[0].images, runs[2].images)


def test_the_last_unmixed_epochs_train_on_the_augmented_images_alone() -> None:
    """base.unmixed_epochs: before the last k epochs a batch is mixed (alpha 1, every batch); in them it is exactly
    train_augment's batch with its own targets and lam 1, from the same generator state."""
    preset = PRESETS["synthetic"]
    x = images(8, preset.input_size, seed=3)
    y = torch.arange(8)
    cfg = BaseConfig(epochs=10, mixup_alpha=1.0, unmixed_epochs=3)
    for epoch, mixed in ((0, True), (6, True), (7, False), (9, False)):
        xb, y_a, y_b, lam, _ = _base_batch(x, y, 8, preset, cfg, epoch, torch.Generator().manual_seed(epoch))
        plain_x = train_augment(x, preset, torch.Generator().manual_seed(epoch))
        if mixed:
            assert bool((lam < 1).any()) and not torch.equal(xb, plain_x)
        else:
            assert torch.equal(xb, plain_x) and torch.equal(lam, torch.ones(8))
            assert torch.equal(y_a, y) and torch.equal(y_b, y)
    never = BaseConfig(epochs=10, mixup_alpha=1.0)  # 0: mixed to the end, the previous behaviour
    assert bool((_base_batch(x, y, 8, preset, never, 9, torch.Generator().manual_seed(9))[3] < 1).any())


def test_the_last_unaugmented_epochs_train_on_the_test_view() -> None:
    """base.unaugmented_epochs: in the last k epochs a batch is exactly test_transform's view of the images, unmixed,
    with its own targets (even inside unmixed_epochs' range or with Mixup on); the epoch before is augmented and
    mixed."""
    preset = PRESETS["synthetic"]
    x = images(8, preset.input_size, seed=4)
    y = torch.arange(8)
    view = test_transform(x, preset)
    cfg = BaseConfig(epochs=10, mixup_alpha=1.0, unaugmented_epochs=2)
    for epoch in (8, 9):
        xb, y_a, y_b, lam, _ = _base_batch(x, y, 8, preset, cfg, epoch, torch.Generator().manual_seed(epoch))
        assert torch.equal(xb, view) and torch.equal(lam, torch.ones(8))
        assert torch.equal(y_a, y) and torch.equal(y_b, y)
    xb, _, _, lam, _ = _base_batch(x, y, 8, preset, cfg, 7, torch.Generator().manual_seed(7))
    assert bool((lam < 1).any()) and not torch.equal(xb, view)
    both = BaseConfig(epochs=10, mixup_alpha=1.0, unmixed_epochs=5, unaugmented_epochs=2)
    xb, _, _, lam, _ = _base_batch(x, y, 8, preset, both, 7, torch.Generator().manual_seed(7))  # unmixed, augmented
    assert torch.equal(xb, train_augment(x, preset, torch.Generator().manual_seed(7)))
    assert torch.equal(lam, torch.ones(8))
    assert torch.equal(_base_batch(x, y, 8, preset, both, 9, torch.Generator().manual_seed(9))[0], view)
