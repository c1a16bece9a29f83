"""Any image tree: `root/<class>/<image>` or nested `root/<group>/<class>/<image>`.

A class is a folder that directly holds image files; its name is its path relative to root (posix
separators) and classes are sorted by name. There is no official split, so `seeded_protocol`
draws one from a seed: a per-class test fraction, then (optionally shuffled) class order, base classes,
and `shots` random training images per novel class. The chosen protocol is saved in the pack.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from pipeline.data.builders import seeded_pack
from pipeline.data.presets import CLASS_FOLDER
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
        name=CLASS_FOLDER,
        root=root,
        class_names=names,
        labels=np.asarray(labels, dtype=np.int64),
        is_train=np.ones(len(labels), dtype=bool),
        keys=keys,
        paths=paths,
        provenance={"root": str(root), "num_files": len(paths), "listing_sha256": listing.hexdigest()},
    )


def build(cfg):
    """The pack of class folders under data.root, its protocol drawn from the seed (a `DATASETS` entry)."""
    return seeded_pack(cfg, read_class_folder(Path(cfg.root)))
