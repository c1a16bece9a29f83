"""Class-sensitive selective scan losses (paper sec. "Class-Sensitive Selective Scan Mechanism"), in the paper's
text and in the forms of the authors' code (docs/research/authors-code.md), each a named form.

`is_base`: (N,) bool marks the base group F_base (memory prototypes of base classes, eq. batch_split); the rest
of the batch is the novel group. Groups are passed in explicitly, never inferred inside the loss.

Loss groups (`groups` G, incremental.loss_groups): the authors ran the sessions on 8 GPUs x 8 rows, every loss on a
GPU's own rows with gradients averaged, and a term ran only when every GPU's rows held its group (the counts
all-reduced with MIN). Here row r of the batch belongs to group r % G (their sampler gave GPU g the rows g, g + 8,
... of each 64-row slice of its permutation), each term is the mean over the groups of its value on each group, and
it is 0 unless every group holds the rows it needs. G = 1 is one group, the whole batch. Everything is computed
with masks, sync-free, in one process: the results depend on G, never on how many processes run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from pipeline.losses.registry import SEPARATION_DELTAS, SEPARATION_FORMS, SEPARATION_PATHS, SUPPRESSION_FORMS

if TYPE_CHECKING:  # the losses read a branch's outputs, they do not build branches
    from pipeline.models.ss2d import BranchAux


def grouped(t: torch.Tensor, groups: int) -> torch.Tensor:
    """(N, ...) -> (G, N / G, ...): row r of the batch is row r // G of group r % G."""
    n = t.shape[0]
    if n % groups:
        raise ValueError(f"a batch of {n} rows does not split into {groups} loss groups")
    return t.reshape(n // groups, groups, *t.shape[1:]).transpose(0, 1)


def _group_masks(is_base: torch.Tensor, groups: int, dtype: torch.dtype) -> torch.Tensor:
    """(2, G, N / G) float masks of the base and the novel rows of each group."""
    g = grouped(is_base, groups)
    return torch.stack([g, ~g]).to(dtype)


# ---- suppression (eq. loss_supp): what one group's term is, given its rows z (G, M, E) and a row mask (G, M) ----
def suppression_squared_mean(z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The paper's text: the group's mean of ||Z_i||^2 / (L D')."""
    per_row = z.pow(2).mean(dim=-1)
    return (per_row * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1)


def suppression_norm_per_element(z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The authors' code: the Frobenius norm of the group's whole Z tensor, not squared, over its element count.
    vector_norm's gradient at a zero tensor is 0 (g_inc's gate starts at zero)."""
    # reduced over one contiguous axis: over the strided (rows, elements) view float32 lost ~1e-5 of the norm
    norm = torch.linalg.vector_norm((z * mask[..., None]).reshape(len(z), -1), dim=1)
    return norm / (mask.sum(dim=1) * z.shape[-1]).clamp_min(1)


def gated_group_mean(per_group: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Mean over the groups of a term, or 0 unless every group has a row for it (counts (..., G): the MIN gate)."""
    return torch.where(counts.amin(dim=-1) > 0, per_group.mean(dim=-1), torch.zeros_like(per_group[..., 0]))


def suppression_loss(z: torch.Tensor, is_base: torch.Tensor, lambda1: float, lambda2: float,
                     form: str = "squared_mean", groups: int = 1) -> torch.Tensor:
    """eq. loss_supp: lambda1 * S(Z_base) - lambda2 * S(Z_novel), S a suppression form (`SUPPRESSION_FORMS`): the
    paper's mean of ||Z_i||^2 / (L D'), or the authors' ||Z_group||_F / numel(Z_group).

    z: (N, L, D') gate stream (or another tensor for the variants); each term per loss group, gated (module doc).
    """
    zg = grouped(z.flatten(1), groups)  # (G, M, L D')
    masks = _group_masks(is_base, groups, z.dtype)
    total = z.new_zeros(())
    for weight, mask in ((lambda1, masks[0]), (-lambda2, masks[1])):
        if weight:
            total = total + weight * gated_group_mean(SUPPRESSION_FORMS[form](zg, mask), mask.sum(dim=1))
    return total


# ---- what the suppression loss acts on (paper table supp_comparison): (aux, mu_inc) -> tensor or None ----
def target_z(aux: BranchAux, mu_inc: torch.Tensor | None) -> torch.Tensor:
    return aux.z


def target_silu_z(aux: BranchAux, mu_inc: torch.Tensor | None) -> torch.Tensor:
    return F.silu(aux.z)


def target_mu_inc(aux: BranchAux, mu_inc: torch.Tensor | None) -> torch.Tensor | None:
    """g_inc's output; of the expanding baseline, the output of its newest branch (the earlier ones are frozen)."""
    return aux.mu_newest if aux.mu_newest is not None else mu_inc


def target_z_channel_flip(aux: BranchAux, mu_inc: torch.Tensor | None) -> torch.Tensor | None:
    """The authors' 1-D branch: its K orders' gate streams summed with the reversed orders flipped on the channel
    axis, not the token axis (a defect of their code that the published CIFAR-100 / miniImageNet numbers carry)."""
    return aux.z_channel_flip


# ---- separation (eq. loss_sep): one parameter kind's term from the groups' means (G, 2, D_P) ----
def separation_abs_cos(means: torch.Tensor) -> torch.Tensor:
    """The paper's text: |cos(P_bar_base, P_bar_novel)| (0 where a mean is all zero)."""
    return F.cosine_similarity(means[:, 0], means[:, 1], dim=-1).abs()


def separation_confusion_mean(means: torch.Tensor) -> torch.Tensor:
    """The authors' code: mean over the 2 x 2 matrix |I - S| of the cosines S between the two means, |cos| / 2 up
    to the rounding of the diagonal."""
    unit = F.normalize(means, dim=-1)
    sim = unit @ unit.transpose(1, 2)
    return (torch.eye(2, dtype=sim.dtype, device=sim.device) - sim).abs().mean(dim=(1, 2))




def separation_loss(params: BranchAux, is_base: torch.Tensor, form: str = "abs_cos",
                    delta: str = "delta", paths: str = "all", groups: int = 1) -> torch.Tensor:
    """eq. loss_sep: sum over P in (B, C, Delta) of a separation form (`SEPARATION_FORMS`) of P_bar_base and
    P_bar_novel, the means over the group's rows, the scan paths (`paths`: all, or the first only) and the tokens
    (eq. parameter_base_novel).

    params: a branch's B, C (N, K, L, d_state), delta (N, K, L, D_inner), dt_low (N, K, L, dt_rank); `delta` names
    the one read as Delta (`SEPARATION_DELTAS`). Per loss group, gated: 0 unless every group holds base and novel
    rows (module doc). 0 when the branch generates no parameters. Means are masked sums, not boolean indexing: no
    shape that depends on data, no wait for the device.
    """
    generated = [t for k in ("B", "C", SEPARATION_DELTAS[delta]) if (t := getattr(params, k)) is not None]
    if not generated:
        return is_base.new_zeros((), dtype=torch.float32)
    masks = None
    total = 0.0
    for p in generated:
        p = p[:, SEPARATION_PATHS[paths]]
        p = grouped(p.flatten(1, 2), groups)  # (G, M, K*L, D_P)
        if masks is None:
            masks = _group_masks(is_base, groups, p.dtype).transpose(0, 1)  # (G, 2, M)
        sums = torch.einsum("gsm,gmld->gsd", masks, p)
        means = sums / (masks.sum(dim=2, keepdim=True) * p.shape[2]).clamp_min(1)
        total = total + SEPARATION_FORMS[form](means)
    counts = masks.sum(dim=2).amin(dim=1)  # (G,): the smaller of each group's base and novel counts
    return gated_group_mean(total, counts)
