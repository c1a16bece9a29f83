"""Feature-level mixup for incremental sessions (reference-facts: fixed ratio 0.5, probability per dataset)."""

from __future__ import annotations

import torch


def feature_mixup(mu: torch.Tensor, target: torch.Tensor, ratio: float, prob: float,
                  generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """With probability `prob`, mix every sample with a shuffled partner: ratio * mu + (1 - ratio) * mu[perm].

    Returns (mu_mixed, target_a, target_b, lam (N,)); without mixing target_b == target_a and lam == 1.
    The random draws come from `generator` (on CPU) so runs are reproducible.
    """
    n = mu.shape[0]
    lam = torch.ones(n, dtype=mu.dtype, device=mu.device)
    if prob <= 0 or float(torch.rand((), generator=generator)) >= prob:
        return mu, target, target, lam
    perm = torch.randperm(n, generator=generator).to(mu.device)
    mixed = ratio * mu + (1.0 - ratio) * mu[perm]
    return mixed, target, target[perm], lam * ratio
