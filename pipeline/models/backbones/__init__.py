"""Backbones: images (N, 3, S, S) -> unpooled maps (N, C, H, W), chosen by name.

Example (a slim CPU config): `build_backbone("resnet12", widths=(16, 32, 64, 128))` has `out_channels` 128
and `feature_hw(32) == (2, 2)`; `freeze_for_base_training()` freezes what the reference freezes during base
training (nothing for ResNet-12).
"""

from __future__ import annotations

import inspect
from typing import Any

from pipeline.errors import FSCILError
from pipeline.models.backbones.base import Backbone
from pipeline.models.backbones.pretrained import load_pretrained
from pipeline.models.backbones.resnet12 import ResNet12, resnet12
from pipeline.models.backbones.resnet18 import ResNet18, resnet18
from pipeline.models.backbones.timm_backbones import SwinBackbone, ViTBackbone, swin_t, vit_b16
from pipeline.models.registry import BACKBONES


def build_backbone(name: str, **kwargs: Any) -> Backbone:
    """Build the backbone registered as `name` with its constructor's keyword arguments."""
    constructor = BACKBONES.get_checked(name)
    params = inspect.signature(constructor).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(kwargs) - set(params))
        if unknown:
            raise FSCILError(f"backbone {name}: unknown argument {unknown[0]!r} (valid: {', '.join(params)})")
    return constructor(**kwargs)


__all__ = [
    "BACKBONES",
    "Backbone",
    "ResNet12",
    "ResNet18",
    "SwinBackbone",
    "ViTBackbone",
    "build_backbone",
    "load_pretrained",
    "resnet12",
    "resnet18",
    "swin_t",
    "vit_b16",
]
