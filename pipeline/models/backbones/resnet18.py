"""ResNet-18 (torchvision layout), the CUB-200 backbone, with an ImageNet or a CIFAR stem.

Parameter names match torchvision's `resnet18().state_dict()` (conv1, bn1, layer1.0.conv1, ...,
layerK.0.downsample.0/1), so an ImageNet checkpoint from torchvision or timm loads by name with
its `fc.*` ignored. Output: 512 x 7 x 7 at 224 (ImageNet stem), 512 x 4 x 4 at 32 (CIFAR stem).
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.errors import FSCILError
from pipeline.models.backbones.base import Backbone, check_feature_hw, check_input_size, kaiming_init_
from pipeline.models.backbones.pretrained import load_optional_pretrained

STEMS = ("imagenet", "cifar")
STAGE_STRIDES = (1, 2, 2, 2)
BLOCKS_PER_STAGE = 2


def conv_out(side: int, kernel: int, stride: int, padding: int) -> int:
    """Output side of a convolution or pooling window (floor mode)."""
    return (side + 2 * padding - kernel) // stride + 1


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN with ReLU and an identity (or 1x1 conv-BN) shortcut.

    x: (N, C_in, H, W) -> (N, C_out, H / stride, W / stride)
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(Backbone):
    """ResNet-18 returning the last stage's map (no pooling, no fc).

    x: (N, 3, S, S) -> (N, 8 * base_width, H, W); (H, W) = (7, 7) at S = 224 (imagenet), (4, 4) at S = 32 (cifar)
    """

    def __init__(self, stem: str = "imagenet", base_width: int = 64, in_channels: int = 3) -> None:
        super().__init__()
        if stem not in STEMS:
            raise FSCILError(f"resnet18: stem must be one of {', '.join(STEMS)}, got {stem!r}")
        if isinstance(base_width, bool) or not isinstance(base_width, int) or base_width < 1:
            raise FSCILError(f"resnet18: base_width must be a positive integer, got {base_width!r}")
        self.stem = stem
        widths = tuple(base_width * 2**i for i in range(4))
        self.out_channels = widths[-1]
        if stem == "imagenet":
            self.conv1 = nn.Conv2d(in_channels, widths[0], kernel_size=7, stride=2, padding=3, bias=False)
            self.maxpool: nn.Module = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        else:
            # 32x32 images: a 3x3 stride-1 stem and no max-pool keep a 4x4 final map
            self.conv1 = nn.Conv2d(in_channels, widths[0], kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        channels = (widths[0], *widths)
        self.layer1 = self._stage(channels[0], channels[1], STAGE_STRIDES[0])
        self.layer2 = self._stage(channels[1], channels[2], STAGE_STRIDES[1])
        self.layer3 = self._stage(channels[2], channels[3], STAGE_STRIDES[2])
        self.layer4 = self._stage(channels[3], channels[4], STAGE_STRIDES[3])
        self.reset_parameters()

    @staticmethod
    def _stage(in_channels: int, out_channels: int, stride: int) -> nn.Sequential:
        blocks = [BasicBlock(in_channels, out_channels, stride)]
        blocks += [BasicBlock(out_channels, out_channels) for _ in range(BLOCKS_PER_STAGE - 1)]
        return nn.Sequential(*blocks)

    def reset_parameters(self) -> None:
        """torchvision's init: Kaiming-normal (fan_out, relu) convolutions; BatchNorm weight 1, bias 0."""
        kaiming_init_(self, "relu")

    @property
    def frozen_prefixes(self) -> tuple[str, ...]:
        # the reference freezes the pretrained ImageNet stem and first stage; a CIFAR stem trains from scratch
        return ("conv1", "bn1", "layer1") if self.stem == "imagenet" else ()

    def feature_hw(self, input_size: int) -> tuple[int, int]:
        check_input_size("resnet18", input_size)
        side = input_size
        if self.stem == "imagenet":
            side = conv_out(side, kernel=7, stride=2, padding=3)
            side = conv_out(side, kernel=3, stride=2, padding=1)
        for stride in STAGE_STRIDES:
            side = conv_out(side, kernel=3, stride=stride, padding=1)
        return check_feature_hw("resnet18", input_size, (side, side))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (N, 3, S, S) -> (N, C, H, W)."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))


def resnet18(
    stem: str = "imagenet",
    base_width: int = 64,
    pretrained: str | None = None,
    pretrained_sha256: str | None = None,
) -> ResNet18:
    """ResNet-18 with the `stem` ("imagenet" or "cifar"), optionally loaded from a local (torchvision/timm) file."""
    model = ResNet18(stem, base_width)
    load_optional_pretrained(model, "resnet18", pretrained, pretrained_sha256)
    return model
