"""ResNet-12, the few-shot standard backbone (CIFAR-100 and miniImageNet rows).

Four residual stages, each halving the map with a 2x2 max-pool: 640 x 2 x 2 at 32 input,
640 x 5 x 5 at 84 with the default widths. Module names follow the common few-shot code
(`layer1..4`, `conv1..3`, `bn1..3`, `downsample`) so its checkpoints load by name.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.errors import FSCILError
from pipeline.models.backbones.base import Backbone, check_feature_hw, check_input_size, kaiming_init_
from pipeline.models.backbones.pretrained import load_optional_pretrained

DEFAULT_WIDTHS = (64, 160, 320, 640)
LEAKY_SLOPE = 0.1


def conv3x3(in_channels: int, out_channels: int) -> nn.Conv2d:
    """3x3 convolution, stride 1, padding 1, no bias (a BatchNorm follows)."""
    return nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False)


class ResNet12Block(nn.Module):
    """conv-BN-LReLU, conv-BN-LReLU, conv-BN, + (1x1 conv-BN shortcut), LReLU, max-pool 2.

    x: (N, C_in, H, W) -> (N, C_out, H // 2, W // 2)
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = conv3x3(in_channels, out_channels)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = conv3x3(out_channels, out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.conv3 = conv3x3(out_channels, out_channels)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.LeakyReLU(LEAKY_SLOPE)
        self.downsample = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, kernel_size=1, bias=False),
            nn.BatchNorm2d(out_channels),
        )
        self.maxpool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out = self.relu(out + self.downsample(x))
        return self.maxpool(out)


class ResNet12(Backbone):
    """ResNet-12 returning the last stage's map.

    x: (N, 3, S, S) -> (N, widths[-1], S // 16, S // 16)
    """

    def __init__(self, widths: tuple[int, ...] = DEFAULT_WIDTHS, in_channels: int = 3) -> None:
        super().__init__()
        widths = tuple(widths)
        if len(widths) != 4 or not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths):
            raise FSCILError(f"resnet12: widths must be 4 positive integers, got {widths!r}")
        self.widths = widths
        self.out_channels = widths[-1]
        channels = (in_channels, *widths)
        self.layer1 = ResNet12Block(channels[0], channels[1])
        self.layer2 = ResNet12Block(channels[1], channels[2])
        self.layer3 = ResNet12Block(channels[2], channels[3])
        self.layer4 = ResNet12Block(channels[3], channels[4])
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Kaiming-normal (fan_out, leaky_relu) convolutions; BatchNorm weight 1, bias 0."""
        # a = 0 (gain sqrt 2) as in the common few-shot ResNet-12, not the 0.1 slope used in forward
        kaiming_init_(self, "leaky_relu")

    def feature_hw(self, input_size: int) -> tuple[int, int]:
        check_input_size("resnet12", input_size)
        side = input_size
        for _ in range(4):
            side //= 2  # MaxPool2d(2) floors
        return check_feature_hw("resnet12", input_size, (side, side))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (N, 3, S, S) -> (N, C, S // 16, S // 16)."""
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))


def resnet12(
    widths: tuple[int, ...] = DEFAULT_WIDTHS,
    pretrained: str | None = None,
    pretrained_sha256: str | None = None,
) -> ResNet12:
    """ResNet-12 with stage widths `widths` (default 64-160-320-640), optionally loaded from a local file."""
    model = ResNet12(widths)
    load_optional_pretrained(model, "resnet12", pretrained, pretrained_sha256)
    return model
