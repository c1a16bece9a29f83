"""The authors' 1-D selective SSM branch (`version='ssm'` of their neck, used by their CIFAR-100 and miniImageNet
configs; the paper's text describes SS2D for every dataset): ONE 1-D Mamba block run over the K token orders of the
map with the same parameters.

Per token order k (row-major, its reverse, column-major, its reverse: `pipeline.ops.cross_scan`): in_proj -> x, z;
a causal depthwise conv1d (kernel model.d_conv, 4 in their configs, with bias) along that order, SiLU; one x_proj ->
(dt_low, B, C), one dt_proj, A_log and D; the selective scan gated with SiLU(z); the K outputs mapped back to
row-major order and summed. No LayerNorm (model.out_norm adds one), no out_proj at expand 1. Where SS2D has a 3 x 3
conv over the map before the scan and K parameter sets, this branch has a 1-D causal conv inside each order and one
parameter set: at the CIFAR-100 preset its two branches with their p_mlp and positional embeddings hold 6,590,720
parameters, as the authors' neck does (tests/test_mamba1d.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.models.ss2d import BranchBase, BranchDims, mamba_dt_bias
from pipeline.ops.cross_scan import cross_merge, cross_scan
from pipeline.ops.selective_scan import selective_scan


def cross_merge_channel_flip(y: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The authors' merge of the K orders' gate streams in their 1-D branch: as `cross_merge`, but the reversed
    orders are flipped on the channel axis instead of the token axis (`flip([1])` on a (batch, channel, token)
    tensor), so they stay in reversed token order. A defect of their code: the Z their suppression loss reads (the
    published CIFAR-100 / miniImageNet numbers carry it). y: (N, K, D, L) -> (N, D, L)."""
    n, k, d, length = y.shape
    out = y[:, 0]
    if k >= 2:
        out = out + y[:, 1].flip(1)
    if k == 4:
        col = y[:, 2] + y[:, 3].flip(1)
        out = out + col.view(n, d, w, h).transpose(2, 3).reshape(n, d, length)
    return out


class SharedMamba1DBranch(BranchBase):
    """g_ssm as one 1-D Mamba block shared by the K token orders (module doc). Optional aux: Z (N, L, D_inner), the
    channel-flipped merge of the orders' gate streams `z_channel_flip` (N, L, D_inner), and per order B, C (N, K, L,
    d_state), Delta (N, K, L, D_inner), dt_low (N, K, L, dt_rank)."""

    gated = True
    default_conv = 4  # the authors' d_conv

    def __init__(self, in_channels: int, feature_hw: tuple[int, int], dims: BranchDims, zero_init_gate: bool = False):
        super().__init__(in_channels, feature_hw, dims, zero_init_gate)
        di, n, r = dims.d_inner, dims.d_state, dims.dt_rank
        self.x_proj = nn.Linear(di, r + 2 * n, bias=False)  # U(+-D_inner^-0.5), as SS2D's per-path x_proj
        self.dt_proj = nn.Linear(r, di, bias=True)
        with torch.no_grad():
            self.dt_proj.weight.uniform_(-(r ** -0.5), r ** -0.5)
            self.dt_proj.bias.copy_(mamba_dt_bias(di))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float32).repeat(di, 1)))
        self.D = nn.Parameter(torch.ones(di))

    @staticmethod
    def build_conv(channels: int, kernel: int) -> nn.Module:
        """Causal depthwise conv1d along a token order: padded by kernel - 1, the first L outputs kept."""
        return nn.Conv1d(channels, channels, kernel, padding=kernel - 1, groups=channels, bias=True)

    def x_stream(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        k, n, r = self.dims.k_paths, self.dims.d_state, self.dims.dt_rank
        b, length, di = x.shape
        h, w = hw
        # the K orders as K times the batch: every order runs through the same conv, x_proj, dt_proj, A, D
        xs = cross_scan(x.transpose(1, 2).reshape(b, di, h, w), k).reshape(b * k, di, length)
        xs = F.silu(self.conv(xs)[..., :length])
        dt_low, bs, cs = torch.split(self.x_proj(xs.transpose(1, 2)), [r, n, n], dim=-1)  # (bK, L, .)
        dts = (dt_low @ self.dt_proj.weight.T).transpose(1, 2)  # (bK, D_inner, L), bias added in the scan
        ys = selective_scan(
            xs, dts.contiguous(), -torch.exp(self.A_log.float()), bs.transpose(1, 2).contiguous(),
            cs.transpose(1, 2).contiguous(), self.D.float(), delta_bias=self.dt_proj.bias.float(), delta_softplus=True,
        )
        y = cross_merge(ys.view(b, k, di, length), h, w).transpose(1, 2)  # (N, L, D_inner)
        per_order = lambda t: t.reshape(b, k, length, -1)  # noqa: E731  (bK, L, .) -> (N, K, L, .)
        aux = {"B": per_order(bs), "C": per_order(cs), "dt_low": per_order(dt_low),
               "delta": per_order(F.softplus(dts.transpose(1, 2) + self.dt_proj.bias))}
        return y, aux

    def forward(self, f: torch.Tensor, return_aux: bool = False):
        out = super().forward(f, return_aux)
        if not return_aux:
            return out
        mu, aux = out
        h, w = self.feature_hw
        z = aux.z.transpose(1, 2).reshape(len(mu), -1, h, w)
        aux.z_channel_flip = cross_merge_channel_flip(cross_scan(z, self.dims.k_paths), h, w).transpose(1, 2)
        return mu, aux
