"""Classifier heads: the fixed simplex ETF (paper sec. "Optimization") and a learnable linear head (table etf_ablation).

Both map mu (N, D') to logits over the classes seen so far: (N, num_seen). Classes are session-ordered, so the
classes seen after session t are the first `num_seen` columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from pipeline.losses.classification import cross_entropy_loss, dot_regression_loss


def simplex_etf(dim: int, num_classes: int, seed: int = 0) -> torch.Tensor:
    """W = sqrt(K/(K-1)) U (I - 11^T/K) with U the orthonormal columns of QR(random d x K): (D', K).

    Columns are unit-norm with pairwise cosine -1/(K-1).
    """
    if num_classes < 2 or dim < num_classes:
        raise ValueError(f"an ETF of {num_classes} classes needs 2 <= K <= D' (D' = {dim})")
    gen = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(dim, num_classes, generator=gen, dtype=torch.float64))
    k = num_classes
    w = math.sqrt(k / (k - 1)) * u @ (torch.eye(k, dtype=torch.float64) - torch.full((k, k), 1.0 / k,
                                                                                      dtype=torch.float64))
    return w.float()


class ETFClassifier(nn.Module):
    """Fixed ETF prototypes (a buffer, never trained). logits = normalize(mu) . w_c: cosines in [-1, 1]."""

    def __init__(self, dim: int, num_classes: int, seed: int = 0):
        super().__init__()
        self.register_buffer("weight", simplex_etf(dim, num_classes, seed))

    def forward(self, mu: torch.Tensor, num_seen: int | None = None) -> torch.Tensor:
        w = self.weight if num_seen is None else self.weight[:, :num_seen]
        # F.normalize's own arithmetic, except where the norm overflows float32: F.normalize then returns 0 (cosine 0
        # to every class: a DR loss flat at 0.5 x scale with no gradient, a dead model that trains on silently);
        # NaN there turns it into the non-finite loss the training loops refuse
        norm = mu.norm(2, dim=-1, keepdim=True)
        return torch.where(torch.isfinite(norm), mu / norm.clamp_min(1e-12), torch.nan) @ w

    def prototypes(self, num_seen: int) -> torch.Tensor:
        """(num_seen, D'): row k is class k's target direction."""
        return self.weight[:, :num_seen].T


class LinearClassifier(nn.Module):
    """A learnable linear head trained with cross-entropy; logits restricted to the seen classes."""

    def __init__(self, dim: int, num_classes: int, seed: int = 0):
        super().__init__()
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, mu: torch.Tensor, num_seen: int | None = None) -> torch.Tensor:
        logits = self.fc(mu)
        return logits if num_seen is None else logits[:, :num_seen]

    def prototypes(self, num_seen: int) -> torch.Tensor:
        """(num_seen, D'): row k is class k's weight vector."""
        return self.fc.weight[:num_seen]


@dataclass(frozen=True)
class Head:
    """A classifier and the loss it trains with (params model.classifier names one)."""

    classifier: type[nn.Module]
    loss: Callable[..., torch.Tensor]
    scaled: bool  # the authors' x10 (`dr_scale`) belongs to the DR loss only; CE x10 made the linear head diverge

    def loss_scale(self, dr_scale: float) -> float:
        return dr_scale if self.scaled else 1.0


HEADS: dict[str, Head] = {
    "etf": Head(ETFClassifier, dot_regression_loss, scaled=True),  # fixed ETF + DR (eq. loss_dr)
    "linear": Head(LinearClassifier, cross_entropy_loss, scaled=False),  # learnable linear + CE (ETF ablation)
}
