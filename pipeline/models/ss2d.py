"""The selective SSM branch g_ssm (paper sec. "Selective SSM Branch", eqs. ssm_branch_*): SS2D with K scan paths.

Both g_base and g_inc are instances of `SS2DBranch`; they differ only in their parameters and in g_inc's
zero-initialised gate projection (appendix "Initialization of the Incremental Branch").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.models.token_mlp import TokenMLP
from pipeline.ops.cross_scan import cross_merge, cross_scan
from pipeline.ops.selective_scan import selective_scan


@dataclass(frozen=True)
class BranchDims:
    """Widths of one projector branch: the values of the params model section (`from_config`), no defaults here."""

    dim: int  # D', the projector width
    d_state: int  # D_B = D_C
    dt_rank: int  # D_Delta, the low-rank width of f_Delta
    k_paths: int  # number of scan paths K (1, 2 or 4)
    expand: int  # d_inner = expand * D'
    d_conv: int | None  # depthwise conv kernel (None: the branch class's `default_conv`)
    mlp_layers: int  # p_mlp depth (2 or 3)
    out_norm: bool  # LayerNorm on the merged scan output before gating (the authors' code)

    @classmethod
    def from_config(cls, model_cfg) -> BranchDims:
        """The branch widths of a ModelConfig (or anything with the same attributes)."""
        return cls(**{f.name: getattr(model_cfg, f.name) for f in fields(cls)})

    @property
    def d_inner(self) -> int:
        return self.expand * self.dim


def mamba_dt_bias(d: int, generator: torch.Generator | None = None, dt_min: float = 1e-3, dt_max: float = 1e-1,
                  dt_floor: float = 1e-4) -> torch.Tensor:
    """Mamba's dt_proj bias: inverse softplus of dt = exp(U(log dt_min, log dt_max)) clamped >= dt_floor."""
    u = torch.rand(d, generator=generator)
    dt = torch.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=dt_floor)
    return dt + torch.log(-torch.expm1(-dt))  # softplus^-1(dt)


@dataclass
class BranchAux:
    """What a branch hands the class-sensitive losses (eq. loss_supp, eq. loss_sep) and the diagnostics, besides mu.
    Shapes: N maps, L tokens, K scan paths."""

    z: torch.Tensor
    """(N, L, D_inner) the gate stream Z."""
    B: torch.Tensor | None = None
    """(N, K, L, d_state) the generated B (None: a mixer without one)."""
    C: torch.Tensor | None = None
    """(N, K, L, d_state) the generated C."""
    delta: torch.Tensor | None = None
    """(N, K, L, D_inner) softplus(dt_proj(dt) + b)."""
    dt_low: torch.Tensor | None = None
    """(N, K, L, dt_rank) the low-rank dt before dt_proj (what the authors' separation reads)."""
    z_channel_flip: torch.Tensor | None = None
    """(N, L, D_inner) the authors' 1-D branch's Z: the orders' gate streams summed with the channel axis flipped."""
    mu_newest: torch.Tensor | None = None
    """(N, D') the expanding baseline's newest branch's output (the one that trains)."""


class BranchBase(nn.Module):
    """Shared front and back of a projector branch: p_mlp + positional embedding + in_proj -> (x, z), gating, pooling.

    Subclasses implement `mix(x, hw)`: the token mixer between the x stream and the gate (the selective scan for
    SS2D; the others in pipeline/models/mixers.py). f: (N, C, H, W) -> mu: (N, D'). `gated`: whether the suppression
    loss acts on Z (gating designs) or on the branch output (appendix "Implementation Details for Different
    Projections").
    """

    gated: bool = False
    default_conv: int = 3  # the x stream's conv kernel when model.d_conv is null

    def __init__(self, in_channels: int, feature_hw: tuple[int, int], dims: BranchDims, zero_init_gate: bool = False):
        super().__init__()
        self.dims = dims
        self.feature_hw = tuple(feature_hw)
        h, w = self.feature_hw
        d, di = dims.dim, dims.d_inner
        self.p_mlp = TokenMLP(in_channels, d, self.feature_hw, dims.mlp_layers)
        self.pos_embed = nn.Parameter(torch.zeros(1, h * w, d))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.in_proj = nn.Linear(d, 2 * di, bias=False)  # -> x (p_x) and z (p_z), eq. ssm_branch_scan_and_gate
        if zero_init_gate:
            self.zero_gate()
        self.conv = self.build_conv(di, dims.d_conv if dims.d_conv is not None else self.default_conv)
        self.out_norm = nn.LayerNorm(di) if dims.out_norm else nn.Identity()
        self.out_proj = nn.Linear(di, d, bias=False) if di != d else nn.Identity()

    @staticmethod
    def build_conv(channels: int, kernel: int) -> nn.Module:
        """The depthwise conv of the x stream: kernel x kernel over the 2-D map (SS2D)."""
        return nn.Conv2d(channels, channels, kernel, padding=kernel // 2, groups=channels, bias=True)

    @torch.no_grad()
    def zero_gate(self) -> None:
        """p_z = 0: Z = 0, so SiLU(Z) = 0 and mu = 0 (appendix "Initialization of the Incremental Branch")."""
        self.in_proj.weight[self.dims.d_inner:].zero_()

    def mix(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """x: (N, D_inner, H, W) after conv + SiLU -> y: (N, L, D_inner) row-major, plus the generated parameters
        (`BranchAux` fields: B, C, delta, dt_low)."""
        raise NotImplementedError

    def x_stream(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """x: (N, L, D_inner) from in_proj -> (y (N, L, D_inner), aux): the depthwise conv over the map, SiLU, then
        the token mixer (eq. ssm_branch_scan_and_gate)."""
        n = x.shape[0]
        x = F.silu(self.conv(x.transpose(1, 2).reshape(n, -1, *hw)))
        return self.mix(x, hw)

    def forward(self, f: torch.Tensor, return_aux: bool = False):
        n, _, h, w = f.shape
        if (h, w) != self.feature_hw:
            raise ValueError(f"branch built for {self.feature_hw} maps, got {(h, w)}")
        tokens = self.p_mlp(f).flatten(2).transpose(1, 2) + self.pos_embed  # (N, L, D'), eq. ssm_branch_backbone_addpos
        x, z = self.in_proj(tokens).chunk(2, dim=-1)  # (N, L, D_inner) each
        y, aux = self.x_stream(x, (h, w))  # (N, L, D_inner)
        y = self.out_norm(y) * F.silu(z)  # eq. ssm_branch_gated_output
        mu = self.out_proj(y).mean(dim=1)  # Pool over tokens -> (N, D')
        if not return_aux:
            return mu
        return mu, BranchAux(z=z, **aux)


class SS2DBranch(BranchBase):
    """g_ssm with K-path 2D selective scan. Optional aux: Z (N, L, D'), B, C (N, K, L, d_state), Delta (N, K, L, D'),
    dt_low (N, K, L, dt_rank)."""

    gated = True

    def __init__(self, in_channels: int, feature_hw: tuple[int, int], dims: BranchDims, zero_init_gate: bool = False):
        super().__init__(in_channels, feature_hw, dims, zero_init_gate)
        k, di, n, r = dims.k_paths, dims.d_inner, dims.d_state, dims.dt_rank
        # per-direction f_B, f_C and the low-rank half of f_Delta (eq. ssm_branch_parameter_generation)
        bound = di ** -0.5
        self.x_proj_weight = nn.Parameter(torch.empty(k, r + 2 * n, di).uniform_(-bound, bound))
        self.dt_proj_weight = nn.Parameter(torch.empty(k, di, r).uniform_(-(r ** -0.5), r ** -0.5))
        self.dt_proj_bias = nn.Parameter(torch.stack([mamba_dt_bias(di) for _ in range(k)]))
        # A = -exp(A_log) with A_log = log(1..d_state) per channel (S4D-real init), D = 1
        a = torch.arange(1, n + 1, dtype=torch.float32).repeat(k * di, 1)
        self.A_log = nn.Parameter(torch.log(a))
        self.D = nn.Parameter(torch.ones(k * di))

    def mix(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        k, n, r = self.dims.k_paths, self.dims.d_state, self.dims.dt_rank
        b, di, h, w = x.shape
        xs = cross_scan(x, k)  # (N, K, D_inner, L), eq. ssm_branch_directional_scanning
        x_dbl = torch.einsum("bkdl,kcd->bkcl", xs, self.x_proj_weight)
        dt_low, bs, cs = torch.split(x_dbl, [r, n, n], dim=2)
        dts = torch.einsum("bkrl,kdr->bkdl", dt_low, self.dt_proj_weight)  # (N, K, D_inner, L)
        ys = selective_scan(
            xs.reshape(b, k * di, -1), dts.reshape(b, k * di, -1), -torch.exp(self.A_log.float()),
            bs.contiguous(), cs.contiguous(), self.D.float(), delta_bias=self.dt_proj_bias.reshape(-1).float(),
            delta_softplus=True,
        ).view(b, k, di, -1)  # eq. ssm_branch_s6_recurrence
        y = cross_merge(ys, h, w).transpose(1, 2)  # InverseScan + sum over K -> (N, L, D_inner)
        aux = {
            "B": bs.transpose(2, 3),
            "C": cs.transpose(2, 3),
            "delta": F.softplus(dts + self.dt_proj_bias[None, :, :, None]).transpose(2, 3),
            "dt_low": dt_low.transpose(2, 3),  # the low-rank dt before dt_proj (what the authors' separation reads)
        }
        return y, aux
