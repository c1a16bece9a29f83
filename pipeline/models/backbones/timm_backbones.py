"""Transformer backbones from timm (the paper's ViT-B/16 and Swin-T rows), returning token maps as (N, C, H, W).

Built with `pretrained=False` always: weights come only from a local file (`pretrained=`), loaded
into the inner timm model, so a timm/open_clip-converted checkpoint loads by timm's own key names.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from pipeline.errors import FSCILError
from pipeline.models.backbones.base import Backbone, check_feature_hw, check_input_size, complement_prefixes
from pipeline.models.backbones.pretrained import load_optional_pretrained


def create_headless(owner: str, timm_name: str, kind: type[nn.Module], **kwargs: Any) -> nn.Module:
    """timm.create_model without weights, classifier or pooling; FSCILError on an unknown or wrong-kind name."""
    import timm  # lazy: timm (and the torchvision it imports) add seconds to every CLI start

    try:
        model = timm.create_model(timm_name, pretrained=False, num_classes=0, global_pool="", **kwargs)
    except RuntimeError as e:  # timm: "Unknown model (...)"
        raise FSCILError(f"{owner}: cannot build timm model {timm_name!r} ({e})") from e
    except TypeError as e:  # a keyword the timm model does not take
        raise FSCILError(f"{owner}: bad argument for timm model {timm_name!r} ({e})") from e
    if not isinstance(model, kind):
        raise FSCILError(f"{owner}: timm model {timm_name!r} is a {type(model).__name__}, expected a {kind.__name__}")
    return model


class TimmBackbone(Backbone):
    """Shared parts of the timm wrappers: the inner `model`, its fixed input size and the freezing rule."""

    owner = "timm"

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.out_channels = int(model.num_features)

    def _keep_trainable(self) -> tuple[str, ...]:
        """Names (relative to `model`) that stay trainable during base training."""
        raise NotImplementedError

    @property
    def frozen_prefixes(self) -> tuple[str, ...]:
        names = (name for name, _ in self.model.named_parameters())
        return tuple(f"model.{p}" for p in complement_prefixes(names, self._keep_trainable()))

    def _check_size(self, input_size: int) -> None:
        check_input_size(self.owner, input_size)
        patch_embed = self.model.patch_embed
        if patch_embed.strict_img_size and (input_size, input_size) != tuple(patch_embed.img_size):
            raise FSCILError(
                f"{self.owner}: input size {input_size} differs from the img_size {patch_embed.img_size[0]} "
                "the model was built for (set img_size)"
            )


class ViTBackbone(TimmBackbone):
    """timm VisionTransformer; the class (and register) tokens are dropped.

    x: (N, 3, S, S) -> (N, embed_dim, S // patch, S // patch); (768, 14, 14) for ViT-B/16 at 224
    """

    owner = "vit_b16"

    def _keep_trainable(self) -> tuple[str, ...]:
        # the reference fine-tunes only the last block (and the final norm after it)
        return (f"blocks.{len(self.model.blocks) - 1}", "norm")

    def feature_hw(self, input_size: int) -> tuple[int, int]:
        self._check_size(input_size)
        hw = self.model.patch_embed.dynamic_feat_size((input_size, input_size))
        return check_feature_hw(self.owner, input_size, (int(hw[0]), int(hw[1])))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (N, 3, S, S) -> (N, C, H, W)."""
        h, w = self.model.patch_embed.dynamic_feat_size(x.shape[-2:])
        tokens = self.model.forward_features(x)  # (N, P + H*W, C), P prefix tokens first
        tokens = tokens[:, self.model.num_prefix_tokens :]
        return tokens.reshape(x.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous()


class SwinBackbone(TimmBackbone):
    """timm SwinTransformer; its final NHWC map as NCHW.

    x: (N, 3, S, S) -> (N, C, ceil(S / 32), ceil(S / 32)) for patch 4; (768, 12, 12) for Swin-T at 384
    """

    owner = "swin_t"

    def _keep_trainable(self) -> tuple[str, ...]:
        # the reference fine-tunes only the last block of the last stage (and the final norm)
        last = len(self.model.layers) - 1
        return (f"layers.{last}.blocks.{len(self.model.layers[last].blocks) - 1}", "norm")

    def feature_hw(self, input_size: int) -> tuple[int, int]:
        self._check_size(input_size)
        patch = self.model.patch_embed.patch_size
        h, w = input_size // patch[0], input_size // patch[1]
        for stage in self.model.layers:
            if not isinstance(stage.downsample, nn.Identity):
                h, w = math.ceil(h / 2), math.ceil(w / 2)  # patch merging pads odd sides
        return check_feature_hw(self.owner, input_size, (h, w))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (N, 3, S, S) -> (N, C, H, W)."""
        return self.model.forward_features(x).permute(0, 3, 1, 2).contiguous()  # (N, H, W, C) -> (N, C, H, W)


def build_timm_backbone(
    wrapper: type[TimmBackbone],
    kind: type[nn.Module],
    timm_name: str,
    img_size: int,
    pretrained: str | None,
    pretrained_sha256: str | None,
    timm_kwargs: dict[str, Any],
) -> TimmBackbone:
    """Wrap a headless timm model of class `kind` in `wrapper`; local weights load into the inner timm model."""
    check_input_size(wrapper.owner, img_size)
    backbone = wrapper(create_headless(wrapper.owner, timm_name, kind, img_size=img_size, **timm_kwargs))
    load_optional_pretrained(backbone.model, wrapper.owner, pretrained, pretrained_sha256)
    return backbone


def vit_b16(
    timm_name: str = "vit_base_patch16_224",
    img_size: int = 224,
    pretrained: str | None = None,
    pretrained_sha256: str | None = None,
    **timm_kwargs: Any,
) -> TimmBackbone:
    """ViT-B/16 (or any timm VisionTransformer via `timm_name`, e.g. `vit_base_patch16_clip_224`)."""
    from timm.models.vision_transformer import VisionTransformer

    return build_timm_backbone(
        ViTBackbone, VisionTransformer, timm_name, img_size, pretrained, pretrained_sha256, timm_kwargs
    )


def swin_t(
    timm_name: str = "swin_tiny_patch4_window7_224",
    img_size: int = 384,
    pretrained: str | None = None,
    pretrained_sha256: str | None = None,
    **timm_kwargs: Any,
) -> TimmBackbone:
    """Swin-T (or any timm SwinTransformer via `timm_name`); the reference feeds 384 x 384 images."""
    from timm.models.swin_transformer import SwinTransformer

    return build_timm_backbone(
        SwinBackbone, SwinTransformer, timm_name, img_size, pretrained, pretrained_sha256, timm_kwargs
    )
