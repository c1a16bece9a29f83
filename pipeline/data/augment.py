"""Batched image transforms on torch tensors, on whatever device the batch lives on.

Input everywhere: uint8 (N, H, W, 3) as read from the pack. Output: float32 (N, 3, S, S), normalised
with the preset's mean/std, on the input's device. Training randomness comes only from an explicit
`torch.Generator` (numbers are drawn on the generator's device, then moved), so the same generator
state gives the same batch.

train_augment = RandomResizedCrop (torchvision's sampling rule: 10 tries, then the whole image clamped
to the ratio range) + horizontal flip, both folded into one affine sampling grid, then ColorJitter
(brightness, contrast, saturation, applied in that fixed order rather than torchvision's random order).
The crop is resampled with grid_sample, without antialiasing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from pipeline.data.presets import ImagePreset

if TYPE_CHECKING:
    import numpy as np

    from pipeline.data.pack import ImagePack

_GRAY = (0.299, 0.587, 0.114)  # ITU-R 601 luma, as torchvision's rgb_to_grayscale
_TRIES = 10


def _to_float(x: torch.Tensor) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> float32 (N, 3, H, W) in [0, 1]."""
    if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"expected uint8 (N, H, W, 3) images, got {x.dtype} {tuple(x.shape)}")
    return x.permute(0, 3, 1, 2).float().div_(255.0)


def normalize(x: torch.Tensor, preset: ImagePreset) -> torch.Tensor:
    mean = torch.tensor(preset.mean, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(preset.std, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


def _rand(n: int, generator: torch.Generator, device: torch.device, *shape: int) -> torch.Tensor:
    return torch.rand(n, *shape, generator=generator, device=generator.device).to(device)


def crop_boxes(n: int, height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float],
               generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """(n, 4) integer crop boxes (top, left, h, w) drawn like torchvision's RandomResizedCrop.get_params."""
    area = height * width
    u = _rand(n, generator, device, _TRIES, 4)  # area, log-ratio, top, left
    target = area * (scale[0] + (scale[1] - scale[0]) * u[..., 0])
    log_r = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * u[..., 1]
    aspect = torch.exp(log_r)
    w = torch.round(torch.sqrt(target * aspect))
    h = torch.round(torch.sqrt(target / aspect))
    ok = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = torch.argmax(ok.int(), dim=1)  # first successful try
    pick = torch.arange(n, device=device)
    w, h, u = w[pick, first], h[pick, first], u[pick, first]
    top = torch.floor(u[:, 2] * (height - h + 1)).clamp(max=height - h)
    left = torch.floor(u[:, 3] * (width - w + 1)).clamp(max=width - w)
    # fallback when no try fits: the whole image, clamped to the ratio range, centred
    in_ratio = width / height
    if in_ratio < ratio[0]:
        fw, fh = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        fw, fh = int(round(height * ratio[1])), height
    else:
        fw, fh = width, height
    fallback = torch.tensor([(height - fh) // 2, (width - fw) // 2, fh, fw], dtype=w.dtype, device=device)
    boxes = torch.stack([top, left, h, w], dim=1)
    return torch.where(ok.any(dim=1, keepdim=True), boxes, fallback).long()


def crop_boxes_within(extents: torch.Tensor, scale: tuple[float, float], ratio: tuple[float, float],
                      generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """`crop_boxes` drawn in each image's own extent (h, w) at the top-left of its canvas: (n, 4) (top, left, h, w).
    The same draws and rule as `crop_boxes`, per image (the shorter_side view, whole images of several aspects)."""
    n = len(extents)
    height, width = extents[:, 0].to(device, torch.float32), extents[:, 1].to(device, torch.float32)
    u = _rand(n, generator, device, _TRIES, 4)  # area, log-ratio, top, left
    target = (height * width)[:, None] * (scale[0] + (scale[1] - scale[0]) * u[..., 0])
    log_r = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * u[..., 1]
    aspect = torch.exp(log_r)
    w = torch.round(torch.sqrt(target * aspect))
    h = torch.round(torch.sqrt(target / aspect))
    ok = (w > 0) & (w <= width[:, None]) & (h > 0) & (h <= height[:, None])
    first = torch.argmax(ok.int(), dim=1)
    pick = torch.arange(n, device=device)
    w, h, u = w[pick, first], h[pick, first], u[pick, first]
    top = torch.minimum(torch.floor(u[:, 2] * (height - h + 1)), height - h)
    left = torch.minimum(torch.floor(u[:, 3] * (width - w + 1)), width - w)
    # fallback: the whole extent clamped to the ratio range, centred
    in_ratio = width / height
    fw = torch.where(in_ratio > ratio[1], torch.round(height * ratio[1]), width)
    fh = torch.where(in_ratio < ratio[0], torch.round(width / ratio[0]), height)
    fallback = torch.stack([torch.div(height - fh, 2, rounding_mode="floor"),
                            torch.div(width - fw, 2, rounding_mode="floor"), fh, fw], dim=1)
    return torch.where(ok.any(dim=1, keepdim=True), torch.stack([top, left, h, w], dim=1), fallback).long()


def resized_crop(x: torch.Tensor, boxes: torch.Tensor, size: int, flip: torch.Tensor | None = None,
                 mode: str = "bilinear") -> torch.Tensor:
    """Crop boxes (top, left, h, w) of float (N, 3, H, W) images, resampled to size x size, optionally flipped."""
    n, _, height, width = x.shape
    b = boxes.to(x.dtype)
    top, left, h, w = b.unbind(1)
    sign = torch.ones(n, dtype=x.dtype, device=x.device) if flip is None else 1.0 - 2.0 * flip.to(x.dtype)
    theta = torch.zeros(n, 2, 3, dtype=x.dtype, device=x.device)
    # align_corners=False: normalised coordinate of pixel edge e is 2e/W - 1
    theta[:, 0, 0] = sign * w / width
    theta[:, 0, 2] = 2 * (left + w / 2) / width - 1
    theta[:, 1, 1] = h / height
    theta[:, 1, 2] = 2 * (top + h / 2) / height - 1
    grid = F.affine_grid(theta, [n, 3, size, size], align_corners=False)
    return F.grid_sample(x, grid, mode=mode, padding_mode="border", align_corners=False)


def _gray(x: torch.Tensor) -> torch.Tensor:
    r, g, b = x.unbind(1)
    return (_GRAY[0] * r + _GRAY[1] * g + _GRAY[2] * b).unsqueeze(1)


def color_jitter(x: torch.Tensor, brightness: float, contrast: float, saturation: float,
                 generator: torch.Generator) -> torch.Tensor:
    """Per-sample factors U(1-s, 1+s) (clipped at 0) for brightness, contrast, saturation, in that order."""
    n = x.shape[0]
    u = _rand(n, generator, x.device, 3).to(x.dtype)

    def factor(strength: float, col: int) -> torch.Tensor:
        lo, hi = max(0.0, 1.0 - strength), 1.0 + strength
        return (lo + (hi - lo) * u[:, col]).view(n, 1, 1, 1)

    if brightness > 0:
        x = (x * factor(brightness, 0)).clamp_(0, 1)
    if contrast > 0:
        c = factor(contrast, 1)
        x = (c * x + (1 - c) * _gray(x).mean(dim=(2, 3), keepdim=True)).clamp_(0, 1)
    if saturation > 0:
        s = factor(saturation, 2)
        x = (s * x + (1 - s) * _gray(x)).clamp_(0, 1)
    return x


def train_augment(x: torch.Tensor, preset: ImagePreset, generator: torch.Generator,
                  extents: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> normalised float32 (N, 3, input_size, input_size): crop, flip, colour jitter.
    extents: (N, 2) each image's (h, w) at the top-left of its canvas (the shorter_side view; None: the whole x)."""
    img = _to_float(x)
    n, _, height, width = img.shape
    if extents is None:
        boxes = crop_boxes(n, height, width, preset.crop_scale, preset.crop_ratio, generator, img.device)
    else:
        boxes = crop_boxes_within(extents, preset.crop_scale, preset.crop_ratio, generator, img.device)
    flip = _rand(n, generator, img.device) < preset.flip_prob
    img = resized_crop(img, boxes, preset.input_size, flip, preset.interpolation).clamp_(0, 1)
    img = color_jitter(img, preset.brightness, preset.contrast, preset.saturation, generator)
    return normalize(img, preset)


def test_transform(x: torch.Tensor, preset: ImagePreset, extents: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> normalised float32 (N, 3, input_size, input_size): resize to test_resize, centre crop.
    With extents (the shorter_side view: images already at test_resize on their canvas) the centre crop of each
    image's extent, torchvision's CenterCrop rounding."""
    if extents is not None:
        s = preset.input_size
        tops = [int(round((int(h) - s) / 2)) for h, _ in extents.tolist()]
        lefts = [int(round((int(w) - s) / 2)) for _, w in extents.tolist()]
        crops = torch.stack([x[i, t:t + s, left:left + s] for i, (t, left) in enumerate(zip(tops, lefts, strict=True))])
        return normalize(_to_float(crops), preset)
    img = _to_float(x)
    height, width = img.shape[-2:]
    if min(height, width) != preset.test_resize:
        scale = preset.test_resize / min(height, width)
        img = F.interpolate(img, size=(round(height * scale), round(width * scale)), mode=preset.interpolation,
                            align_corners=False, antialias=True).clamp_(0, 1)
        height, width = img.shape[-2:]
    s = preset.input_size
    top, left = int(round((height - s) / 2)), int(round((width - s) / 2))
    return normalize(img[:, :, top : top + s, left : left + s], preset)


test_transform.__test__ = False  # not a pytest test, despite the name


def pack_batch(pack: ImagePack, ids: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Images `ids` of a pack as uint8 (N, H, W, 3) on `device` and their extents on their canvas (the shorter_side
    view) or None: what `train_augment` and `test_transform` take."""
    extents = pack.read_extents(ids)
    return (torch.from_numpy(pack.read_images(ids)).to(device),
            None if extents is None else torch.from_numpy(extents).to(device))
