"""Seeded protocol generator: a per-class train/test split and the sessions' training samples.

Used for datasets without official split files (class folders, the synthetic benchmark). Everything is
drawn from one `numpy.random.Generator`, so (labels, parameters, seed) fully determine the protocol.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from pipeline.data.presets import CLASS_FOLDER
from pipeline.data.source import SourceDataset
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


def seeded_protocol(source: SourceDataset, base_classes: int | None, ways: int, shots: int, sessions: int,
                          test_fraction: float, seed: int,
                          shuffle_classes: bool = True) -> tuple[SourceDataset, list[np.ndarray]]:
    """Draw a protocol: returns the source with its train/test split set, and the training ids per session.

    base_classes None means every class not used by the incremental sessions. With shuffle_classes the class
    order (hence which classes are base) is a seeded permutation, otherwise the sorted name order.
    """
    num_classes = len(source.class_names)
    if base_classes is None:
        base_classes = num_classes - ways * sessions
        if base_classes < 1:
            raise FSCILError(f"{source.root}: {num_classes} classes cannot fill {sessions} sessions x {ways} ways "
                             "plus a base session")
    rng = np.random.default_rng(seed)
    try:
        is_test = split_test(source.labels, test_fraction, rng, source.class_names)
    except FSCILError as err:  # name the folder the class is in
        raise FSCILError(f"{source.root}: {err}") from None
    order = rng.permutation(num_classes) if shuffle_classes else np.arange(num_classes)
    train_sessions = draw_sessions(source.labels, ~is_test, order, base_classes, ways, shots, sessions, rng,
                                   source.class_names)
    protocol_info = {"generator": CLASS_FOLDER, "seed": seed, "base_classes": base_classes, "ways": ways,
                     "shots": shots, "sessions": sessions, "test_fraction": test_fraction,
                     "shuffle_classes": shuffle_classes}
    split_source = replace(source, is_train=~is_test, provenance={**source.provenance, "protocol": protocol_info})
    return split_source, train_sessions
