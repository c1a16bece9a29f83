"""CUB-200-2011: `<root>/{images/, images.txt, train_test_split.txt, image_class_labels.txt, classes.txt}`.

The four index files are `<id> <value>` per line (1-based image and class ids). The train/test split is
CUB's own `train_test_split.txt`; split files refer to training images by their path relative to images/.
`root` may be the CUB_200_2011 folder or its parent.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from pipeline.data.builders import cec_pack
from pipeline.data.checksums import digest_files, verify_checksums
from pipeline.data.source import SourceDataset, read_text_lines, require_dir
from pipeline.errors import FSCILError

FOLDER = "CUB_200_2011"
INDEX_FILES = ("images.txt", "train_test_split.txt", "image_class_labels.txt", "classes.txt")


def _read_pairs(path: Path, what: str) -> dict[int, tuple[str, int]]:
    """{id: (value, line number)} of an `<int id> <value>` file; duplicate or malformed lines are errors."""
    out: dict[int, tuple[str, int]] = {}
    for lineno, line in enumerate(read_text_lines(path, what), start=1):
        if not line.strip():
            continue
        parts = line.strip().split(maxsplit=1)
        if len(parts) != 2 or not parts[0].isdigit():
            raise FSCILError(f"{path} line {lineno}: expected '<id> <value>', got {line.strip()!r}")
        key = int(parts[0])
        if key in out:
            raise FSCILError(f"{path} line {lineno}: id {key} already defined at line {out[key][1]}")
        out[key] = (parts[1].strip(), lineno)
    return out


def _int_value(path: Path, value: str, lineno: int, allowed: set[int] | None = None) -> int:
    if not value.isdigit() or (allowed is not None and int(value) not in allowed):
        raise FSCILError(f"{path} line {lineno}: unexpected value {value!r}")
    return int(value)


def read_cub200(root: Path, verify: bool = True, checksums: Mapping[str, str] | None = None) -> SourceDataset:
    """Read CUB-200-2011 under `root`; sample keys are image paths relative to images/ (as in CEC split files)."""
    root = Path(root)
    if not (root / "images.txt").exists() and (root / FOLDER).is_dir():
        root = root / FOLDER
    require_dir(root, "CUB-200-2011")
    images_dir = require_dir(root / "images", "CUB-200-2011 images")
    sums = verify_checksums(root, checksums) if verify and checksums else {}
    paths = {name: root / name for name in INDEX_FILES}
    images = _read_pairs(paths["images.txt"], "CUB images.txt")
    split = _read_pairs(paths["train_test_split.txt"], "CUB train_test_split.txt")
    image_labels = _read_pairs(paths["image_class_labels.txt"], "CUB image_class_labels.txt")
    classes = _read_pairs(paths["classes.txt"], "CUB classes.txt")
    if not images:
        raise FSCILError(f"{paths['images.txt']}: no images listed")

    class_ids = sorted(classes)
    label_of_class = {c: i for i, c in enumerate(class_ids)}
    known_classes = set(label_of_class)
    keys, labels, is_train = [], [], []
    for image_id in sorted(images):
        rel, lineno = images[image_id]
        for name, table in (("train_test_split.txt", split), ("image_class_labels.txt", image_labels)):
            if image_id not in table:
                raise FSCILError(f"{paths[name]}: no entry for image id {image_id} (images.txt line {lineno})")
        flag, flag_line = split[image_id]
        cls, cls_line = image_labels[image_id]
        is_train.append(_int_value(paths["train_test_split.txt"], flag, flag_line, {0, 1}) == 1)
        class_id = _int_value(paths["image_class_labels.txt"], cls, cls_line, known_classes)
        labels.append(label_of_class[class_id])
        keys.append(rel)
    return SourceDataset(
        name="cub200",
        root=root,
        class_names=[classes[c][0] for c in class_ids],
        labels=np.asarray(labels, dtype=np.int64),
        is_train=np.asarray(is_train),
        keys=keys,
        paths=[images_dir / k for k in keys],
        provenance={"root": str(root), "files": {**digest_files(root, list(INDEX_FILES)), **sums}},
    )


def build(cfg):
    """The pack of cub200 with its CEC split files (a `DATASETS` entry)."""
    return cec_pack(cfg, read_cub200(Path(cfg.root), cfg.verify_checksums, cfg.checksums))
