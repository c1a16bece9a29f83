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

    @torch.no_grad()
    def match_vertices(self, mu: torch.Tensor, labels: torch.Tensor, start: int) -> list[int]:
        """Give classes start, start + 1, ... (the labels of `mu`, one session's new classes) the free vertices
        (columns >= start, not yet given to a class) their features already point to (ours, incremental.vertex_match).

        The vertices are fixed and equiangular, so which free one a new class gets changes nothing in the ETF; the
        paper gives them in class order. Here class start + i gets column j of the assignment maximising the summed
        mean cosine of each class's mu to its vertex (exact: scipy's linear_sum_assignment); the displaced columns
        keep their order after them. Columns < start (the base classes and earlier sessions') never move. Returns
        the old column index now at start, start + 1, ... (the permutation of columns >= start)."""
        from scipy.optimize import linear_sum_assignment

        labels = labels.to(self.weight.device).long()
        new = int(labels.max()) + 1 - start
        if int(labels.min()) < start or new < 1:
            raise ValueError(f"labels must be new classes >= {start}")
        cos = self(mu.to(self.weight), None)[:, start:].double()  # (N, K - start)
        score = torch.zeros(new, cos.shape[1], dtype=torch.float64, device=cos.device)
        score.index_add_(0, labels - start, cos)
        score /= torch.bincount(labels - start, minlength=new).clamp_min(1).unsqueeze(1)
        _, cols = linear_sum_assignment(score.cpu().numpy(), maximize=True)
        chosen = [int(j) for j in cols]
        order = chosen + sorted(set(range(cos.shape[1])) - set(chosen))
        self.weight[:, start:] = self.weight[:, start:][:, order].clone()
        return [start + j for j in order]


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
    score: str  # what `fscil predict` reports: "cosine" (DR has no softmax scale) or "probability" (CE's softmax)

    def confidence(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (N, K) -> the score of each class under the loss the head trains with: the cosine itself for DR
        (it regresses the true class's cosine to 1), the softmax probability for CE."""
        return logits.softmax(dim=1) if self.score == "probability" else logits

    def loss_scale(self, dr_scale: float) -> float:
        return dr_scale if self.scaled else 1.0


# the heads of `HEADS` (pipeline/models/registry.py)
ETF_HEAD = Head(ETFClassifier, dot_regression_loss, scaled=True, score="cosine")  # fixed ETF + DR (eq. loss_dr)
LINEAR_HEAD = Head(LinearClassifier, cross_entropy_loss, scaled=False, score="probability")  # + CE (ETF ablation)
