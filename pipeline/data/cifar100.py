"""CIFAR-100, python version: `<root>/cifar-100-python/{train,test,meta}` pickles, fine labels.

Checksums: the md5 sums of the three extracted files below are the ones torchvision and mmcls check
(the download page itself lists only the tar.gz md5, eb9058c3a382ffc7106e4002c42a8d85). With
`verify_checksums` they are checked; a user `checksums` mapping {relative_path: md5 or sha256}
overrides or extends them.

The reader accepts any square image side s (rows of 3*s*s bytes, channel-planar like the official
3072 = 3*32*32), which lets tests build small fakes in the same on-disk format.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from pipeline.data.builders import cec_pack
from pipeline.data.checksums import digest_algorithm, file_digest
from pipeline.data.source import SourceDataset, one_line, require_dir
from pipeline.errors import FSCILError

FOLDER = "cifar-100-python"
OFFICIAL_MD5 = {
    f"{FOLDER}/train": "16019d7e3df5f24257cddd939b257f8d",
    f"{FOLDER}/test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
    f"{FOLDER}/meta": "7973b15100ade9c7d40fb424638fde48",
}
NUM_TRAIN = 50000


def _load_pickle(path: Path) -> dict:
    # pickle is acceptable only because these are the official CIFAR data files (bytes keys, latin1 era);
    # nothing else in the pipeline reads pickles.
    if not path.is_file():
        raise FSCILError(f"missing CIFAR-100 file {path}")
    try:
        with open(path, "rb") as f:
            obj = pickle.load(f, encoding="bytes")
    except Exception as err:  # any unpickling failure (many exception types) means a corrupt file
        raise FSCILError(f"corrupt CIFAR-100 file {path}: {one_line(err) or type(err).__name__}") from None
    if not isinstance(obj, dict):
        raise FSCILError(f"corrupt CIFAR-100 file {path}: expected a dict, got {type(obj).__name__}")
    return obj


def _field(obj: dict, key: str, path: Path):
    for k in (key.encode(), key):
        if k in obj:
            return obj[k]
    raise FSCILError(f"corrupt CIFAR-100 file {path}: no '{key}' entry")


def _split(path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, s, s, 3) uint8, fine labels (N,) int64) of one pickle."""
    obj = _load_pickle(path)
    data = np.asarray(_field(obj, "data", path))
    labels = np.asarray(_field(obj, "fine_labels", path))
    side = int(round((data.shape[1] / 3) ** 0.5)) if data.ndim == 2 else 0
    if data.dtype != np.uint8 or data.ndim != 2 or side < 1 or 3 * side * side != data.shape[1]:
        raise FSCILError(f"corrupt CIFAR-100 file {path}: data must be uint8 (N, 3*s*s), got {data.dtype} {data.shape}")
    if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
        raise FSCILError(f"corrupt CIFAR-100 file {path}: {labels.shape[0] if labels.ndim else 0} labels "
                         f"for {len(data)} images")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise FSCILError(f"corrupt CIFAR-100 file {path}: fine label outside 0..{num_classes - 1}")
    # channel-planar rows -> (N, s, s, 3)
    images = np.ascontiguousarray(data.reshape(len(data), 3, side, side).transpose(0, 2, 3, 1))
    return images, labels.astype(np.int64)


def read_cifar100(root: Path, verify_checksums: bool = True,
                  checksums: Mapping[str, str] | None = None) -> SourceDataset:
    """Read CIFAR-100 (python version) under `root`; train samples are ids 0..49999 (split-file indices), then test."""
    root = Path(root)
    if root.name == FOLDER and (root / "train").exists():
        root = root.parent  # accept the extracted folder itself
    folder = require_dir(root / FOLDER, "CIFAR-100")
    files = {name: folder / name for name in ("train", "test", "meta")}
    for path in files.values():
        if not path.is_file():
            raise FSCILError(f"missing CIFAR-100 file {path}")
    expected = {**OFFICIAL_MD5, **(checksums or {})} if verify_checksums else {}
    provenance_sums = {}
    for rel in sorted({*OFFICIAL_MD5, *expected}):
        want = expected.get(rel)
        algo = digest_algorithm(want) if want else "md5"
        got = file_digest(root / rel, algo)
        if want and got != want.lower():
            raise FSCILError(f"checksum mismatch for {root / rel}: {algo} {got}, expected {want.lower()}")
        provenance_sums[rel] = f"{algo}:{got}"

    meta = _load_pickle(files["meta"])
    raw_names = _field(meta, "fine_label_names", files["meta"])
    names = [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in raw_names]
    if not names:
        raise FSCILError(f"corrupt CIFAR-100 file {files['meta']}: no fine label names")
    train_x, train_y = _split(files["train"], len(names))
    test_x, test_y = _split(files["test"], len(names))
    if train_x.shape[1:] != test_x.shape[1:]:
        raise FSCILError(f"corrupt CIFAR-100 file {files['test']}: image size differs from the train file")
    n_train, n_test = len(train_x), len(test_x)
    return SourceDataset(
        name="cifar100",
        root=root,
        class_names=names,
        labels=np.concatenate([train_y, test_y]),
        is_train=np.concatenate([np.ones(n_train, bool), np.zeros(n_test, bool)]),
        keys=[str(i) for i in range(n_train)] + [f"test/{i}" for i in range(n_test)],
        arrays=np.concatenate([train_x, test_x]),
        provenance={"root": str(root), "files": provenance_sums, "checksums_verified": bool(verify_checksums)},
    )


def build(cfg):
    """The pack of cifar100 with its CEC split files (a `DATASETS` entry)."""
    return cec_pack(cfg, read_cifar100(Path(cfg.root), cfg.verify_checksums, cfg.checksums))
