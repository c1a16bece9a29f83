"""Seeded protocol generator: a per-class train/test split and the sessions' training samples.

Used for datasets without official split files (class folders, the synthetic benchmark). Everything is
drawn from one `numpy.random.Generator`, so (labels, parameters, seed) fully determine the protocol.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import FSCILError


def split_test(labels: np.ndarray, test_fraction: float, rng: np.random.Generator,
               class_names: list[str] | None = None) -> np.ndarray:
    """(N,) bool test mask: round(test_fraction * n_c) random samples per class, >= 1, leaving >= 1 to train."""
    labels = np.asarray(labels)
    is_test = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        ids = np.flatnonzero(labels == c)
        if len(ids) < 2:
            name = class_names[c] if class_names is not None else str(c)
            raise FSCILError(f"class {name!r} has {len(ids)} image(s); need >= 2 to hold out a test image")
        n_test = int(min(max(1, round(test_fraction * len(ids))), len(ids) - 1))
        is_test[rng.choice(ids, size=n_test, replace=False)] = True
    return is_test


def draw_sessions(labels: np.ndarray, train_mask: np.ndarray, class_order: np.ndarray, base_classes: int,
                  ways: int, shots: int, sessions: int, rng: np.random.Generator,
                  class_names: list[str] | None = None) -> list[np.ndarray]:
    """Training sample ids per session: every training sample of the base classes, then `shots` random ones per class.

    class_order: source class ids in session order; the first base_classes are the base session, the next
    `ways` session 1, and so on (later entries are unused).
    """
    labels = np.asarray(labels)
    needed = base_classes + ways * sessions
    if len(class_order) < needed:
        raise FSCILError(f"the protocol needs {needed} classes ({base_classes} base + {sessions} x {ways}), "
                         f"the dataset has {len(class_order)}")
    train_ids = np.flatnonzero(train_mask)
    per_class = {int(c): train_ids[labels[train_ids] == c] for c in class_order[:needed]}
    out = [np.sort(np.concatenate([per_class[int(c)] for c in class_order[:base_classes]]))]
    for t in range(sessions):
        chosen = []
        for c in class_order[base_classes + t * ways : base_classes + (t + 1) * ways]:
            pool = per_class[int(c)]
            if len(pool) < shots:
                name = class_names[c] if class_names is not None else str(c)
                raise FSCILError(f"class {name!r} has {len(pool)} training image(s), fewer than shots={shots}")
            chosen.append(np.sort(rng.choice(pool, size=shots, replace=False)))
        out.append(np.concatenate(chosen))
    return out
