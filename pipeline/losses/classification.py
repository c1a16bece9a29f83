"""Classification losses on logits from a classifier head (pipeline/models/classifier.py).

The ETF head's logits are cosines w_c . mu_hat, so the DR loss of eq. loss_dr is 0.5 (logit_y - 1)^2.
Every loss takes an optional per-sample `weight` (mixup coefficients, class-balance factors) and a `denominator`
(the number of samples in the *global* batch under DDP), so the result does not depend on how a batch is split.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.losses.registry import DR_WEIGHTINGS


def _reduce(per_sample: torch.Tensor, weight: torch.Tensor | None, denominator: float | None) -> torch.Tensor:
    if weight is not None:
        per_sample = per_sample * weight
    return per_sample.sum() / (per_sample.shape[0] if denominator is None else denominator)


def dot_regression_loss(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                        denominator: float | None = None, scale: float = 1.0) -> torch.Tensor:
    """eq. loss_dr: mean over samples of scale * 0.5 * (w_y . mu_hat - 1)^2. logits: (N, K) cosines; target: (N,)."""
    cos_y = logits.gather(1, target[:, None]).squeeze(1)
    return scale * _reduce(0.5 * (cos_y - 1.0) ** 2, weight, denominator)


def cross_entropy_loss(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                       denominator: float | None = None, scale: float = 1.0) -> torch.Tensor:
    """Cross-entropy for the learnable linear head (paper table etf_ablation)."""
    return scale * _reduce(F.cross_entropy(logits, target, reduction="none"), weight, denominator)


def mixed_loss(loss_fn, logits: torch.Tensor, target_a: torch.Tensor, target_b: torch.Tensor, lam: torch.Tensor,
               denominator: float | None = None, scale: float = 1.0,
               weights: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """lam * L(y_a) + (1 - lam) * L(y_b), each sample counted once (lam: (N,) or a scalar).

    The reference code double-counts one term under Mixup/CutMix; here the two targets share one denominator.
    weights: None, or per-sample weights of each target (`DR_WEIGHTINGS` of its labels), times lam and 1 - lam.
    """
    lam = torch.as_tensor(lam, dtype=logits.dtype, device=logits.device).expand(logits.shape[0])
    weight_a, weight_b = lam, 1.0 - lam
    if weights is not None:
        weight_a, weight_b = weight_a * weights[0], weight_b * weights[1]
    return (loss_fn(logits, target_a, weight_a, denominator, scale)
            + loss_fn(logits, target_b, weight_b, denominator, scale))


def mix_loss_lam_weighted(loss_fn, logits: torch.Tensor, target_a: torch.Tensor, target_b: torch.Tensor,
                          lam: torch.Tensor, mixed: bool, scale: float = 1.0,
                          weights: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The paper's base loss on a batch (eq. optim_base): lam L(y_a) + (1 - lam) L(y_b) (`mixed_loss`); an unmixed
    batch (lam = 1, y_b = y_a) is L(y_a). mixed: whether the batch is a Mixup / CutMix batch (unused here)."""
    return mixed_loss(loss_fn, logits, target_a, target_b, lam, scale=scale, weights=weights)


def mix_loss_lam_weighted_plus_a(loss_fn, logits: torch.Tensor, target_a: torch.Tensor, target_b: torch.Tensor,
                                 lam: torch.Tensor, mixed: bool, scale: float = 1.0,
                                 weights: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The authors' base loss: on a Mixup / CutMix batch lam L(y_a) + (1 - lam) L(y_b) + L(y_a), the head's loss
    on the first targets added a second time (their classifier's mixed branch, then its plain branch on the same
    features); an unmixed batch is L(y_a) once. mixed: whether the batch is a Mixup / CutMix batch."""
    once = mixed_loss(loss_fn, logits, target_a, target_b, lam, scale=scale, weights=weights)
    if not mixed:
        return once
    return once + loss_fn(logits, target_a, None if weights is None else weights[0], None, scale)


def target_weights(kind: str, target_a: torch.Tensor, target_b: torch.Tensor,
                   num_classes: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each target's per-sample weights under a DR weighting (`DR_WEIGHTINGS`), for `mixed_loss`; None when uniform.
    Computed on the batch given (the global batch when it is split across processes)."""
    rule = DR_WEIGHTINGS[kind]
    weights = rule(target_a, num_classes), rule(target_b, num_classes)
    return None if weights[0] is None else weights


def class_balance_weights(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The authors' `with_len` DR weights: each sample weighted by (batch size / classes in the batch) / (count of
    its class in the batch), so every class present weighs the same in the mean. (N,) float32, sync-free."""
    counts = torch.bincount(labels, minlength=num_classes).to(torch.float32)
    present = (counts > 0).sum()
    return labels.shape[0] / present / counts[labels]


def uniform_weights(labels: torch.Tensor, num_classes: int) -> None:
    """The plain mean (the paper): no weights."""
    return None
