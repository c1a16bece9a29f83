"""Session metrics: accuracy over all seen classes, over base classes and over novel classes, and the errors that
cross between the two groups.

Evaluation after session t uses every test sample of the classes seen so far, with logits masked to those
classes (classes are session-ordered, so that is the first `num_seen` columns).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch


@torch.no_grad()
def predict(logits_fn: Callable[[torch.Tensor], torch.Tensor], batches: Iterable[torch.Tensor]) -> np.ndarray:
    """Arg-max predictions of `logits_fn` over an iterable of input batches."""
    preds = [logits_fn(batch).argmax(dim=1).cpu() for batch in batches]
    return torch.cat(preds).numpy() if preds else np.zeros(0, dtype=np.int64)


def session_metrics(pred: np.ndarray, labels: np.ndarray, num_base: int, num_seen: int) -> dict:
    """Accuracy (in %) on all seen classes, the base classes and the novel classes, where the errors go (novel_as_base:
    the share of novel test samples predicted as some base class; base_as_novel: of base samples as some novel class;
    the bias between the two groups), plus per-class accuracy."""
    if pred.shape != labels.shape:
        raise ValueError(f"{pred.shape[0]} predictions for {labels.shape[0]} labels")
    correct = pred == labels
    base = labels < num_base
    pred_base = pred < num_base

    def pct(mask: np.ndarray, hit: np.ndarray = correct) -> float | None:
        return round(100.0 * float(hit[mask].mean()), 4) if mask.any() else None

    per_class = [pct(labels == c) for c in range(num_seen)]
    return {
        "acc": pct(np.ones_like(base)),
        "base_acc": pct(base),
        "novel_acc": pct(~base),
        "novel_as_base": pct(~base, pred_base),
        "base_as_novel": pct(base, ~pred_base),
        "num_test": int(labels.shape[0]),
        "num_seen_classes": int(num_seen),
        "per_class_acc": per_class,
    }
