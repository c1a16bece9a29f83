"""The whole network: backbone f -> projector -> classifier (paper fig. "framework" (a)).

`forward_features` gives the backbone's spatial map (what the feature store caches), `forward_head` the rest, so
incremental sessions run the head alone on cached maps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pipeline.models.backbones import build_backbone
from pipeline.models.projector import Projector, ProjectorOutput
from pipeline.models.registry import HEADS


class FSCILModel(nn.Module):
    def __init__(self, backbone: nn.Module, projector: Projector, classifier: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.projector = projector
        self.classifier = classifier

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """x: (N, 3, S, S) -> backbone map (N, C, H, W)."""
        return self.backbone(x)

    def forward_head(self, f: torch.Tensor, num_seen: int, mode: str = "base") -> tuple[torch.Tensor, ProjectorOutput]:
        """f: (N, C, H, W) -> (logits over the first num_seen classes (N, num_seen), projector output)."""
        out = self.projector(f, mode=mode)
        return self.classifier(out.mu, num_seen), out

    def forward(self, x: torch.Tensor, num_seen: int, mode: str = "base") -> torch.Tensor:
        return self.forward_head(self.forward_features(x), num_seen, mode)[0]

    def freeze_base(self) -> None:
        """After the base session: backbone, p_iden and g_base get no gradient and no BatchNorm updates."""
        self.backbone.requires_grad_(False)
        self.projector.freeze_base()

    def train(self, mode: bool = True):
        super().train(mode)
        if not any(p.requires_grad for p in self.backbone.parameters()):
            self.backbone.eval()  # frozen backbone: BatchNorm statistics never move
        return self


def _timm_args(model_cfg, input_size: int) -> dict:
    return {"img_size": input_size, **({"timm_name": model_cfg.timm_name} if model_cfg.timm_name else {})}


# what each registered backbone takes from ModelConfig and the input size, besides its pretrained weights
BACKBONE_ARGS: dict[str, Callable[..., dict]] = {
    "resnet12": lambda cfg, size: {"widths": tuple(cfg.backbone_widths)} if cfg.backbone_widths else {},
    "resnet18": lambda cfg, size: {"stem": cfg.resnet18_stem},
    "vit_b16": _timm_args,
    "swin_t": _timm_args,
}


def build_backbone_from_config(model_cfg, input_size: int) -> nn.Module:
    kwargs = BACKBONE_ARGS[model_cfg.backbone](model_cfg, input_size)
    return build_backbone(model_cfg.backbone, pretrained=model_cfg.pretrained,
                          pretrained_sha256=model_cfg.pretrained_sha256, **kwargs)


def build_head(model_cfg, in_channels: int, feature_hw: tuple[int, int], num_classes: int
               ) -> tuple[Projector, nn.Module]:
    projector = Projector.from_config(model_cfg, in_channels, feature_hw)
    classifier = HEADS[model_cfg.classifier].classifier(model_cfg.dim, num_classes)
    return projector, classifier


def build_model(model_cfg, num_classes: int, input_size: int, seed: int = 0) -> FSCILModel:
    """Build the network from a ModelConfig; `seed` fixes every random initialisation."""
    torch.manual_seed(seed)
    backbone = build_backbone_from_config(model_cfg, input_size)
    projector, classifier = build_head(model_cfg, backbone.out_channels, backbone.feature_hw(input_size), num_classes)
    return FSCILModel(backbone, projector, classifier)
