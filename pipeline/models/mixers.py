"""Token mixers other than the selective scan (paper table diff_archs, appendix "Implementation Details for Different
Projections"): each replaces the selective scan inside a projector branch and keeps the rest of it (p_mlp, the
positional embedding, in_proj, the depthwise conv, the SiLU(Z) gate, pooling), so the dual-branch structure, the
zero-initialised gate of g_inc (mu_inc = 0 when session 1 starts) and freezing work the same for all of them.

Each is registered by name in `MIXERS` (pipeline/models/registry.py). `gated` says whether the appendix counts the
mixer as a gating design: the suppression loss acts on Z for those (selective SSM, S4) and on g_inc's output for
the others (MLP, Transformer, GRU, LSTM).

Initial scale: the SS2D mixer starts as y ~ K x (the skip D = 1 on each of its K paths). With g_inc's gate at zero
the only gradient when session 1 starts is the one on p_z, proportional to y, so a mixer that starts smaller
learns its first sessions slower (the MLP baseline's g_inc stayed shut that way). Every mixer here starts at the
same scale: the MLP by its output gain, the others through a skip D * x with D a learnable per-channel vector
initialised to K (the D term an SSM has built in).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.models.registry import ATTENTION_HEADS  # the appendix's 8-head Transformer
from pipeline.models.ss2d import BranchBase, BranchDims, mamba_dt_bias
from pipeline.ops.cross_scan import cross_merge, cross_scan
from pipeline.ops.selective_scan import selective_scan


def _tokens(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(2).transpose(1, 2)  # (N, D_inner, H, W) -> (N, L, D_inner), row-major


def ssm_mixer_parameters(dims: BranchDims) -> int:
    """Parameters of SS2DBranch's selective-scan mixer (x_proj, dt_proj, A_log, D): what the MLP baseline matches."""
    k, di, n, r = dims.k_paths, dims.d_inner, dims.d_state, dims.dt_rank
    return k * (r + 2 * n) * di + k * (di * r + di) + k * di * n + k * di


def matched_mlp_hidden(dims: BranchDims) -> int:
    """Hidden width h of a 3-layer MLP d -> h -> h -> d (with biases) whose parameter count is closest to the
    selective-scan mixer's (paper: the ablation compares "with comparable parameter budgets")."""
    d, target = dims.d_inner, ssm_mixer_parameters(dims)

    def count(h: int) -> int:
        return d * h + h + h * h + h + h * d + d

    # count(h) = h^2 + (2d + 2) h + d: solve for the positive root, then take the nearer integer
    b = 2 * d + 2
    root = (-b + math.sqrt(b * b + 4 * (target - d))) / 2
    return min((max(1, math.floor(root)), max(1, math.ceil(root))), key=lambda h: abs(count(h) - target))


class MLPBranch(BranchBase):
    """Baseline branch (paper table "ablation", row 1): a token-wise 3-layer MLP in place of the selective scan.

    y = MLP(x) with LeakyReLU(0.1) between layers and a hidden width chosen so the MLP has as many parameters as
    the SS2D mixer it replaces (`matched_mlp_hidden`); it generates no B / C / Delta. Hidden layers are
    variance-preserving (Kaiming, LeakyReLU gain) and the output layer has a gain of K, so the baseline starts at
    the SS2D mixer's output scale (module docstring) and differs from it only in being static.
    """

    gated = False

    def __init__(self, in_channels: int, feature_hw: tuple[int, int], dims: BranchDims, zero_init_gate: bool = False):
        super().__init__(in_channels, feature_hw, dims, zero_init_gate)
        di, hidden = dims.d_inner, matched_mlp_hidden(dims)
        self.mlp = nn.Sequential(nn.Linear(di, hidden), nn.LeakyReLU(0.1), nn.Linear(hidden, hidden),
                                 nn.LeakyReLU(0.1), nn.Linear(hidden, di))
        with torch.no_grad():
            for layer in self.mlp[:-1:2]:
                nn.init.kaiming_normal_(layer.weight, a=0.1, nonlinearity="leaky_relu")
                layer.bias.zero_()
            last = self.mlp[-1]
            nn.init.normal_(last.weight, std=dims.k_paths / math.sqrt(hidden))
            last.bias.zero_()

    def mix(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.mlp(_tokens(x)), {}


class _SkipMixer(BranchBase):
    """A static mixer m with the skip of an SSM: y = D * x + m(x), D (D_inner,) initialised to K."""

    gated = False

    def __init__(self, in_channels: int, feature_hw: tuple[int, int], dims: BranchDims, zero_init_gate: bool = False):
        super().__init__(in_channels, feature_hw, dims, zero_init_gate)
        self.D = nn.Parameter(torch.full((dims.d_inner,), float(dims.k_paths)))

    def inner(self, tokens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def mix(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        tokens = _tokens(x)
        return tokens * self.D + self.inner(tokens), {}


class TransformerBranch(_SkipMixer):
    """8-head self-attention over the L tokens followed by a feed-forward network (pre-norm, hidden D_inner, not
    the usual 4 x, to stay near the scan's parameter budget): t = D * x + Attn(LN(x)); y = t + FFN(LN(t)). Static
    weights: W_Q, W_K, W_V are shared by every input."""

    def __init__(self, in_channels: int, feature_hw: tuple[int, int], dims: BranchDims, zero_init_gate: bool = False):
        super().__init__(in_channels, feature_hw, dims, zero_init_gate)
        di = dims.d_inner
        if di % ATTENTION_HEADS:
            raise ValueError(f"the transformer mixer needs D_inner divisible by {ATTENTION_HEADS}, got {di}")
        self.norm1, self.norm2 = nn.LayerNorm(di), nn.LayerNorm(di)
        self.attn = nn.MultiheadAttention(di, ATTENTION_HEADS, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(di, di), nn.GELU(), nn.Linear(di, di))
        with torch.no_grad():  # the two residual writes start small (as GPT-2 scales them), so y starts near D * x
            self.attn.out_proj.weight.mul_(0.1)
            self.ffn[-1].weight.mul_(0.1)

    def mix(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        tokens = _tokens(x)
        a = self.norm1(tokens)
        t = tokens * self.D + self.attn(a, a, a, need_weights=False)[0]
        return t + self.ffn(self.norm2(t)), {}


class _RecurrentBranch(_SkipMixer):
    """A recurrent network over the row-major token sequence, hidden size D' (the appendix: GRU / LSTM), read out
    to D_inner: y = D * x + W_out h_t."""

    cell: type[nn.RNNBase]

    def __init__(self, in_channels: int, feature_hw: tuple[int, int], dims: BranchDims, zero_init_gate: bool = False):
        super().__init__(in_channels, feature_hw, dims, zero_init_gate)
        self.rnn = self.cell(dims.d_inner, dims.dim, batch_first=True)
        self.rnn_out = nn.Linear(dims.dim, dims.d_inner, bias=False)

    def inner(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.rnn_out(self.rnn(tokens)[0])


class GRUBranch(_RecurrentBranch):
    cell = nn.GRU


class LSTMBranch(_RecurrentBranch):
    cell = nn.LSTM


class S4Branch(BranchBase):
    """A static (linear time-invariant) diagonal SSM on the same K scan paths: A, D and the step Delta as in SS2D,
    but B (K, d_state), C (K, d_state) and Delta (K, D_inner) are parameters, the same for every input and every
    token, where SS2D generates them from x (eq. ssm_branch_parameter_generation). Runs on the same scan kernel;
    aux holds B, C, Delta broadcast to SS2D's shapes."""

    gated = True

    def __init__(self, in_channels: int, feature_hw: tuple[int, int], dims: BranchDims, zero_init_gate: bool = False):
        super().__init__(in_channels, feature_hw, dims, zero_init_gate)
        k, di, n = dims.k_paths, dims.d_inner, dims.d_state
        # SS2D's B, C at init are x_proj(x) with x_proj ~ U(-di^-0.5, di^-0.5): rms(x) / sqrt(3), about 0.06 for the
        # mixer inputs x of rms ~0.1 measured here; drawn once at that scale, U(-0.1, 0.1)
        self.B = nn.Parameter(torch.empty(k, n).uniform_(-0.1, 0.1))
        self.C = nn.Parameter(torch.empty(k, n).uniform_(-0.1, 0.1))
        self.dt_bias = nn.Parameter(torch.stack([mamba_dt_bias(di) for _ in range(k)]))  # Delta = softplus(dt_bias)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float32).repeat(k * di, 1)))
        self.D = nn.Parameter(torch.ones(k * di))

    def mix(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        k, n = self.dims.k_paths, self.dims.d_state
        b, di, h, w = x.shape
        length = h * w
        xs = cross_scan(x, k)  # (N, K, D_inner, L)
        bs = self.B[None, :, :, None].expand(b, k, n, length)
        cs = self.C[None, :, :, None].expand(b, k, n, length)
        ys = selective_scan(
            xs.reshape(b, k * di, -1), xs.new_zeros(b, k * di, length), -torch.exp(self.A_log.float()),
            bs.contiguous(), cs.contiguous(), self.D.float(), delta_bias=self.dt_bias.reshape(-1).float(),
            delta_softplus=True,
        ).view(b, k, di, -1)
        y = cross_merge(ys, h, w).transpose(1, 2)
        delta = F.softplus(self.dt_bias)[None, :, None, :].expand(b, k, length, di)
        return y, {"B": bs.transpose(2, 3), "C": cs.transpose(2, 3), "delta": delta}


class ExpandingBranches(nn.Module):
    """The expanding baseline's g_inc (paper Fig. 1(b)): one new branch per incremental session, the earlier ones
    frozen, mu_inc = the sum of all of them. Parameters and inference cost grow with the sessions, where the dual
    selective SSM keeps one g_inc. aux (Z) comes from the newest branch, the one that trains.

    `set_sessions(s)` makes s branches (to load the state of session s); `grow()` freezes them and adds one with a
    zero gate, so mu_inc is unchanged when a session starts.
    """

    gated = False

    def __init__(self, branch: type[BranchBase], in_channels: int, feature_hw: tuple[int, int], dims: BranchDims,
                 zero_init_gate: bool = True):
        super().__init__()
        if not zero_init_gate:
            raise ValueError("an expanding g_inc starts every branch with a zero gate")
        self._make = lambda: branch(in_channels, feature_hw, dims, zero_init_gate=True)
        self.branches = nn.ModuleList([self._make()])

    def set_sessions(self, count: int) -> None:
        """Exactly `count` branches (new ones zero-gated), the newest trainable, the others frozen."""
        if count < 1:
            raise ValueError(f"an expanding g_inc has >= 1 branch, got {count}")
        while len(self.branches) > count:
            del self.branches[-1]
        while len(self.branches) < count:
            self.branches.append(self._make())
        for i, branch in enumerate(self.branches):
            branch.requires_grad_(i == count - 1)

    def grow(self) -> None:
        self.set_sessions(len(self.branches) + 1)

    def zero_gate(self) -> None:
        for branch in self.branches:
            branch.zero_gate()

    def forward(self, f: torch.Tensor, return_aux: bool = False):
        *earlier, newest = self.branches
        total = sum((b(f) for b in earlier), start=torch.zeros(()))
        if not return_aux:
            return total + newest(f)
        mu, aux = newest(f, return_aux=True)
        aux.mu_newest = mu  # what the suppression acts on: the output of the branch that trains
        return total + mu, aux
