"""p_mlp: the input MLP in front of each projector branch (reference-facts "Projector")."""

from __future__ import annotations

import torch
from torch import nn


class TokenMLP(nn.Module):
    """conv1x1 C -> 2C (bias), LayerNorm over (2C, H, W), LeakyReLU(0.1), [repeat], conv1x1 2C -> D' (no bias).

    f: (N, C, H, W) -> (N, D', H, W). `num_layers` is 2 (the default) or 3 (the middle block repeated).
    """

    def __init__(self, in_channels: int, out_dim: int, feature_hw: tuple[int, int], num_layers: int = 2):
        super().__init__()
        if num_layers not in (2, 3):
            raise ValueError(f"p_mlp has 2 or 3 layers, got {num_layers}")
        hidden = 2 * in_channels
        h, w = feature_hw
        blocks: list[nn.Module] = [nn.Conv2d(in_channels, hidden, 1, bias=True), nn.LayerNorm([hidden, h, w]),
                                   nn.LeakyReLU(0.1)]
        for _ in range(num_layers - 2):
            blocks += [nn.Conv2d(hidden, hidden, 1, bias=True), nn.LayerNorm([hidden, h, w]), nn.LeakyReLU(0.1)]
        blocks.append(nn.Conv2d(hidden, out_dim, 1, bias=False))
        self.net = nn.Sequential(*blocks)

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return self.net(f)
