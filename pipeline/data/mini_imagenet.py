"""miniImageNet as distributed for FSCIL: `<root>/images/<filename>.jpg` plus `split/train.csv`, `split/test.csv`.

The csv files have the header `filename,label` with a wnid label; the class index is the order of first
appearance in train.csv (the rows are wnid-sorted). When `<root>/split/` is missing, the copies of the two
csv files in the CEC index-list folder (`split_dir`) are used instead. Split files refer to training
images by file name.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from pipeline.data.builders import cec_pack
from pipeline.data.checksums import digest_files, verify_checksums
from pipeline.data.source import SourceDataset, read_text_lines, require_dir
from pipeline.errors import FSCILError

CSV_FILES = ("train.csv", "test.csv")


def _csv_dir(root: Path, split_dir: Path | None) -> Path:
    for folder in (root / "split", split_dir):
        if folder is not None and all((folder / name).is_file() for name in CSV_FILES):
            return folder
    raise FSCILError(f"missing miniImageNet split/train.csv and split/test.csv under {root}"
                     + (f" (nor in {split_dir})" if split_dir is not None else ""))


def _read_csv(path: Path) -> list[tuple[int, str, str]]:
    """(line number, filename, wnid) rows of a `filename,label` csv."""
    lines = read_text_lines(path, "miniImageNet csv")
    if not lines or [c.strip() for c in lines[0].split(",")] != ["filename", "label"]:
        raise FSCILError(f"{path} line 1: expected the header 'filename,label'")
    rows = []
    for lineno, fields in enumerate(csv.reader(lines[1:]), start=2):
        if not fields:
            continue
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            raise FSCILError(f"{path} line {lineno}: expected 'filename,label', got {','.join(fields)!r}")
        rows.append((lineno, fields[0].strip(), fields[1].strip()))
    return rows


def read_mini_imagenet(root: Path, split_dir: Path | None = None, verify: bool = True,
                       checksums: Mapping[str, str] | None = None) -> SourceDataset:
    """Read miniImageNet under `root`; sample keys are image file names (what CEC split files resolve to)."""
    root = Path(root)
    images = require_dir(root / "images", "miniImageNet images")
    csv_dir = _csv_dir(root, Path(split_dir) if split_dir is not None else None)
    sums = verify_checksums(root, checksums) if verify and checksums else {}

    class_index: dict[str, int] = {}
    keys, labels, is_train = [], [], []
    where: dict[str, str] = {}
    for name in CSV_FILES:
        path = csv_dir / name
        for lineno, filename, wnid in _read_csv(path):
            if filename in where:
                raise FSCILError(f"{path} line {lineno}: {filename} is already listed at {where[filename]}")
            where[filename] = f"{path.name} line {lineno}"
            labels.append(class_index.setdefault(wnid, len(class_index)))
            keys.append(filename)
            is_train.append(name == "train.csv")
    if not any(is_train):
        raise FSCILError(f"{csv_dir / 'train.csv'}: no training images listed")
    return SourceDataset(
        name="mini_imagenet",
        root=root,
        class_names=list(class_index),
        labels=np.asarray(labels, dtype=np.int64),
        is_train=np.asarray(is_train),
        keys=keys,
        paths=[images / k for k in keys],
        provenance={"root": str(root), "csv_dir": str(csv_dir),
                    "files": {**digest_files(csv_dir, list(CSV_FILES)), **sums}},
    )


def build(cfg):
    """The pack of mini_imagenet with its CEC split files (a `DATASETS` entry)."""
    return cec_pack(cfg, read_mini_imagenet(Path(cfg.root), Path(cfg.split_dir), cfg.verify_checksums, cfg.checksums))
