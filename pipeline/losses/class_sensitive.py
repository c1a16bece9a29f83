"""Class-sensitive selective scan losses (paper sec. "Class-Sensitive Selective Scan Mechanism").

`is_base`: (N,) bool marks the base group F_base (memory prototypes of base classes, eq. batch_split); the rest
of the batch is the novel group. Groups are passed in explicitly, never inferred inside the loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _group_mean_sq(x: torch.Tensor, mask: torch.Tensor, count: float | None) -> torch.Tensor:
    # x: (N, L, D) or (N, D); sum over the group of ||x_i||^2 / (N_group * L * D)
    per_sample = x.pow(2).flatten(1).mean(dim=1)  # ||x_i||^2 / (L D)
    n = mask.sum().clamp_min(1) if count is None else max(count, 1)  # an empty group sums to 0: the term is 0
    return (per_sample * mask).sum() / n


def suppression_loss(z: torch.Tensor, is_base: torch.Tensor, lambda1: float, lambda2: float,
                     counts: tuple[float, float] | None = None) -> torch.Tensor:
    """eq. loss_supp: lambda1 * mean_b ||Z_b||^2/(L D') - lambda2 * mean_n ||Z_n||^2/(L D').

    z: (N, L, D') gate stream (or another tensor for the variants); counts: (N_base, N_novel) over the global batch
    when the batch is split across processes.
    """
    base, novel = is_base.to(z.dtype), (~is_base).to(z.dtype)
    n_base, n_novel = counts if counts is not None else (None, None)
    return lambda1 * _group_mean_sq(z, base, n_base) - lambda2 * _group_mean_sq(z, novel, n_novel)


# what the suppression loss acts on (paper table supp_comparison); each maps (aux, mu_inc) -> tensor
SUPPRESSION_TARGETS = {
    "z": lambda aux, mu_inc: aux["z"],
    "silu_z": lambda aux, mu_inc: F.silu(aux["z"]),
    # g_inc's output; of the expanding baseline, the output of its newest branch (the earlier ones are frozen)
    "mu_inc": lambda aux, mu_inc: aux.get("mu_newest", mu_inc),
}


def separation_loss(params: dict[str, torch.Tensor], is_base: torch.Tensor) -> torch.Tensor:
    """eq. loss_sep: sum over P in (B, C, Delta) of |cos(P_bar_b, P_bar_n)|.

    params: "B", "C" (N, K, L, d_state) and "delta" (N, K, L, D'); P_bar averages over the group, K and L
    (eq. parameter_base_novel). Zero when either group is empty or the branch generates no parameters. Group means
    are masked sums over the batch, not boolean indexing: no shape that depends on data, no wait for the device.
    """
    keys = [k for k in ("B", "C", "delta") if k in params]
    if not keys:
        return is_base.new_zeros((), dtype=torch.float32)
    total = 0.0
    for key in keys:
        p = params[key].flatten(1, 2)  # (N, K*L, D_P)
        groups = torch.stack([is_base, ~is_base]).to(p.dtype)  # (2, N)
        sums = torch.einsum("gn,nld->gd", groups, p)
        means = sums / (groups.sum(1, keepdim=True) * p.shape[1]).clamp_min(1)  # an empty group's mean is 0
        # cos with an all-zero mean is 0 (cosine_similarity's eps): an empty group adds nothing
        total = total + F.cosine_similarity(means[0], means[1], dim=0).abs()
    return total
