"""Any image tree: `root/<class>/<image>` or nested `root/<group>/<class>/<image>`.

A class is a folder that directly holds image files; its name is its path relative to root (posix
separators) and classes are sorted by name. There is no official split, so `class_folder_protocol`
draws one from a seed: a per-class test fraction, then (optionally shuffled) class order, base classes,
and `shots` random training images per novel class. The chosen protocol is saved in the pack.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from pipeline.data.sampling import draw_sessions, split_test
from pipeline.data.source import SourceDataset, require_dir
from pipeline.errors import FSCILError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff"}


def _is_image(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES


def read_class_folder(root: Path) -> SourceDataset:
    """Every image under `root`, labelled by its folder; all samples start as training samples."""
    root = require_dir(Path(root), "class-folder dataset")
    classes: dict[str, list[Path]] = {}
    listing = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        images = sorted(f for f in filenames if _is_image(f))
        if not images:
            continue
        rel = Path(dirpath).relative_to(root).as_posix()
        if rel == ".":
            raise FSCILError(f"{root} holds images directly; expected root/<class>/<image>")
        classes[rel] = [Path(dirpath) / f for f in images]
    if not classes:
        raise FSCILError(f"no images found under {root} (expected root/<class>/<image>)")
    names = sorted(classes)
    for name in names:
        # a class folder that also contains class folders would make labels ambiguous
        nested = [other for other in names if other.startswith(name + "/")]
        if nested:
            raise FSCILError(f"{root / name} holds images and also class folder {nested[0]!r}")
    paths, labels, keys = [], [], []
    for label, name in enumerate(names):
        for p in classes[name]:
            rel = p.relative_to(root).as_posix()
            listing.update(f"{rel}\0{p.stat().st_size}\n".encode())
            paths.append(p)
            keys.append(rel)
            labels.append(label)
    return SourceDataset(
        name="class_folder",
        root=root,
        class_names=names,
        labels=np.asarray(labels, dtype=np.int64),
        is_train=np.ones(len(labels), dtype=bool),
        keys=keys,
        paths=paths,
        provenance={"root": str(root), "num_files": len(paths), "listing_sha256": listing.hexdigest()},
    )


def class_folder_protocol(source: SourceDataset, base_classes: int | None, ways: int, shots: int, sessions: int,
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
    protocol_info = {"generator": "class_folder", "seed": seed, "base_classes": base_classes, "ways": ways,
                     "shots": shots, "sessions": sessions, "test_fraction": test_fraction,
                     "shuffle_classes": shuffle_classes}
    split_source = replace(source, is_train=~is_test, provenance={**source.provenance, "protocol": protocol_info})
    return split_source, train_sessions
