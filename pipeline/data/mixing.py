"""Batch Mixup / CutMix (timm-style batch mode: one lambda and one choice per batch).

The result keeps the two targets apart instead of returning one blended label, so a loss is
    lam * L(target_a) + (1 - lam) * L(target_b)
with every sample counted exactly once (`MixedBatch.combine`, or `pipeline.losses.classification.mixed_loss`).
The reference code double-counts one of the two terms; this form cannot. When no mixing is applied
(probability 1 - prob) lam is 1 and target_b == target_a, so the same loss code reduces to L(target_a).

Randomness: a torch.Generator decides whether and how to mix and the partner permutation; lambda and
the CutMix box come from a numpy generator seeded by one draw of it (torch has no seeded Beta sampler).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


@dataclass
class MixedBatch:
    """images: (N, 3, H, W); target_a/target_b: (N,) int64; lam: (N,) float32 weight of target_a;
    partner: (N,) index of the sample mixed into each one (identity when not mixed)."""

    images: torch.Tensor
    target_a: torch.Tensor
    target_b: torch.Tensor
    lam: torch.Tensor
    partner: torch.Tensor
    num_classes: int
    kind: str  # "none", "mixup" or "cutmix"

    def soft_targets(self) -> torch.Tensor:
        """(N, num_classes) lam * onehot(target_a) + (1 - lam) * onehot(target_b)."""
        lam = self.lam.view(-1, 1)
        return (lam * F.one_hot(self.target_a, self.num_classes).to(lam.dtype)
                + (1 - lam) * F.one_hot(self.target_b, self.num_classes).to(lam.dtype))

    def combine(self, loss_a: torch.Tensor, loss_b: torch.Tensor) -> torch.Tensor:
        """Per-sample lam * loss_a + (1 - lam) * loss_b, from per-sample losses against target_a and target_b."""
        lam = self.lam.to(loss_a.dtype)
        return lam * loss_a + (1 - lam) * loss_b


def group_permutation(n: int, groups: int, generator: torch.Generator) -> torch.Tensor:
    """A permutation of n rows that keeps each of `groups` blocks of n / groups consecutive rows in place: one
    permutation of a block's rows, the same for every block (the authors' GPUs drew their partners from one seed)."""
    if groups == 1:
        return torch.randperm(n, generator=generator, device=generator.device)
    size = n // groups
    within = torch.randperm(size, generator=generator, device=generator.device)
    return (torch.arange(groups, device=within.device)[:, None] * size + within).reshape(-1)


def mixup_cutmix(x: torch.Tensor, y: torch.Tensor, num_classes: int, mixup_alpha: float, cutmix_alpha: float,
                 prob: float, switch_prob: float, generator: torch.Generator, groups: int = 1) -> MixedBatch:
    """Mix a batch x: (N, 3, H, W) float, y: (N,) int64. With probability `prob` mix; CutMix is chosen with
    probability `switch_prob` when both alphas are positive, else whichever alpha is positive. groups: partners
    within each block of N / groups consecutive rows (base.device_batch), one lambda and box for the batch."""
    n, _, height, width = x.shape
    if n % groups:
        raise ValueError(f"a batch of {n} rows does not split into {groups} device groups")
    u = torch.rand(2, generator=generator, device=generator.device).tolist()
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
    perm = group_permutation(n, groups, generator).to(x.device)
    rng = np.random.default_rng(seed)
    identity = torch.arange(n, device=x.device)
    if u[0] >= prob or (mixup_alpha <= 0 and cutmix_alpha <= 0):
        return MixedBatch(x, y, y, torch.ones(n, device=x.device), identity, num_classes, "none")
    use_cutmix = cutmix_alpha > 0 and (mixup_alpha <= 0 or u[1] < switch_prob)
    alpha = cutmix_alpha if use_cutmix else mixup_alpha
    lam = float(rng.beta(alpha, alpha))
    if use_cutmix:
        # box of area (1 - lam) H W centred uniformly, clipped to the image; lam corrected to the clipped area
        cut = np.sqrt(1.0 - lam)
        ch, cw = int(height * cut), int(width * cut)
        cy, cx = int(rng.integers(0, height)), int(rng.integers(0, width))
        y0, y1 = np.clip(cy - ch // 2, 0, height), np.clip(cy + ch // 2, 0, height)
        x0, x1 = np.clip(cx - cw // 2, 0, width), np.clip(cx + cw // 2, 0, width)
        mixed = x.clone()
        mixed[:, :, y0:y1, x0:x1] = x[perm][:, :, y0:y1, x0:x1]
        lam = 1.0 - float((y1 - y0) * (x1 - x0)) / (height * width)
    else:
        mixed = lam * x + (1.0 - lam) * x[perm]
    lam_t = torch.full((n,), lam, dtype=torch.float32, device=x.device)
    return MixedBatch(mixed, y, y[perm], lam_t, perm, num_classes, "cutmix" if use_cutmix else "mixup")


# ---- feature-level mixup of incremental sessions (reference-facts: fixed ratio 0.5, probability per dataset) ----
FEATURE_MIXUP_RATIO = 0.5  # the authors' fixed ratio; incremental.mixup_prob decides how often a batch is mixed
def feature_mixup(mu: torch.Tensor, target: torch.Tensor, ratio: float,
                  perm: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mix every sample with its partner perm[i]: ratio * mu + (1 - ratio) * mu[perm]; perm None: no mixing.

    Returns (mu_mixed, target_a, target_b, lam (N,)); without mixing target_b == target_a and lam == 1.
    Whether a batch is mixed (probability incremental.mixup_prob) and its perm are drawn ahead by `mixup_draws`.
    """
    lam = torch.ones(mu.shape[0], dtype=mu.dtype, device=mu.device)
    if perm is None:
        return mu, target, target, lam
    mixed = ratio * mu + (1.0 - ratio) * mu[perm]
    return mixed, target, target[perm], lam * ratio


def mixup_draws(n: int, prob: float, generator: torch.Generator, groups: int = 1) -> torch.Tensor | None:
    """One batch's feature-mixup draws from `generator` (CPU): a uniform against `prob` (none when prob <= 0),
    then, when it mixes, the partner permutation of the n rows; None when the batch is not mixed. With loss groups
    (row r in group r % groups, incremental.loss_groups) partners stay within a group: one permutation p of the
    n / groups rows of a group, row i of every group mixed with its row p[i] (the authors' 8 GPUs drew the same
    permutation of their 8 rows: one seed on every GPU)."""
    if prob <= 0 or float(torch.rand((), generator=generator)) >= prob:
        return None
    if groups == 1:
        return torch.randperm(n, generator=generator)
    within = torch.randperm(n // groups, generator=generator)
    return (within[:, None] * groups + torch.arange(groups)).reshape(-1)


# ---- base deviations lent to the novel rows of an incremental batch (ours; extract.deviations, deviation_prob) ----
def lend_deviations(x: torch.Tensor, is_base: torch.Tensor, deviations: torch.Tensor,
                    draws: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Each novel row of the batch x (N, C, H, W) (is_base false) gets, with probability `prob`, one random base
    deviation (a base training map minus its class mean) added: the shot seen as another drawer's version of it.

    Base rows are never changed. draws: (chosen (N,) bool, pick (N,) index) from `deviation_draws`, on x's device.
    """
    chosen, pick = draws
    return x + (chosen & ~is_base).to(x.dtype)[:, None, None, None] * deviations[pick]


def deviation_draws(n: int, prob: float, count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch's draws for `lend_deviations` from `generator` (CPU): whether each of the n rows takes a deviation
    (probability `prob`) and which of the `count` stored deviations."""
    chosen = torch.rand(n, generator=generator) < prob
    return chosen, torch.randint(count, (n,), generator=generator)
