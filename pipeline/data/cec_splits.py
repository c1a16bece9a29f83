"""CEC-style index lists: `session_1.txt` (base training samples) and `session_t.txt`, t >= 2 (ways x shots samples).

How a line names a training sample depends on the dataset:
- cifar100: an integer index into the 50000-image train array;
- mini_imagenet: `MINI-ImageNet/train/<wnid>/<file>.jpg`, only the file name matters;
- cub200: `CUB_200_2011/images/NNN.Name/file.jpg`, the path relative to CUB's images/ folder.

Checks (each failure is an FSCILError naming the split file and line): every line resolves to an existing
training image; no sample appears twice; an incremental session's classes (the labels of its samples)
are new; it has `ways` classes with `shots` samples each; for CIFAR-100 session t holds exactly the
classes 60+5(t-2)..64+5(t-2).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from pipeline.data.checksums import digest_files
from pipeline.data.source import SourceDataset, read_text_lines, require_dir
from pipeline.errors import FSCILError


@dataclass(frozen=True)
class BenchmarkShape:
    """The standard protocol of a benchmark (reference-facts benchmarks table)."""

    base_classes: int
    ways: int
    shots: int
    sessions: int
    consecutive: bool = False
    """Session t must hold exactly the next `ways` source labels (true of the CIFAR-100 lists)."""
    train_per_class: int = 0
    """Training images per class (CUB: about; its base session has 3000 for 100 classes)."""
    test_per_class: int = 0
    """Test images per class (CUB: about; its base test set has 2864 for 100 classes)."""


BENCHMARKS = {
    "cifar100": BenchmarkShape(60, 5, 5, 8, consecutive=True, train_per_class=500, test_per_class=100),
    "mini_imagenet": BenchmarkShape(60, 5, 5, 8, train_per_class=500, test_per_class=100),
    "cub200": BenchmarkShape(100, 10, 5, 10, train_per_class=30, test_per_class=29),
}


def _cifar_key(line: str) -> str:
    if not line.isdigit():
        raise ValueError(f"expected an integer train index, got {line!r}")
    return str(int(line))


def _cub_key(line: str) -> str:
    marker = "images/"
    return line.split(marker, 1)[1] if marker in line else line


KEY_OF_LINE: dict[str, Callable[[str], str]] = {
    "cifar100": _cifar_key,
    "mini_imagenet": lambda line: PurePosixPath(line).name,
    "cub200": _cub_key,
}

_SESSION_FILE = re.compile(r"session_(\d+)\.txt")


def _session_files(split_dir: Path, expected: int | None) -> list[Path]:
    numbers = sorted(int(m.group(1)) for p in split_dir.iterdir() if (m := _SESSION_FILE.fullmatch(p.name)))
    count = max(numbers, default=0) if expected is None else expected
    for t in range(1, count + 1):
        if t not in numbers:
            raise FSCILError(f"missing split file {split_dir / f'session_{t}.txt'}")
    if count < 1:
        raise FSCILError(f"no session_1.txt in split folder {split_dir}")
    if expected is not None and max(numbers) > expected:
        raise FSCILError(f"split folder {split_dir} has session_{max(numbers)}.txt, expected session_1..{expected}.txt")
    return [split_dir / f"session_{t}.txt" for t in range(1, count + 1)]


def read_cec_splits(split_dir: Path, source: SourceDataset, shape: BenchmarkShape | None = None,
                    ) -> tuple[list[np.ndarray], dict[str, str]]:
    """Training sample ids (source ids, file order) per session, and {split file: sha256} for provenance.

    shape: the expected protocol (None: only the generic checks: new, disjoint, existing samples).
    """
    split_dir = require_dir(Path(split_dir), "split")
    key_of_line = KEY_OF_LINE.get(source.name)
    if key_of_line is None:
        raise FSCILError(f"no CEC split format for dataset {source.name!r} (known: {', '.join(KEY_OF_LINE)})")
    files = _session_files(split_dir, None if shape is None else shape.sessions + 1)
    index = source.train_key_index
    names = source.class_names
    listed_at: dict[int, str] = {}  # sample id -> "file line n"
    class_session: dict[int, str] = {}  # source label -> split file that introduced it
    sessions = []
    for t, path in enumerate(files):
        ids, lines = [], []
        for lineno, raw in enumerate(read_text_lines(path, "split"), start=1):
            line = raw.strip()
            if not line:
                continue
            where = f"{path} line {lineno}"
            try:
                key = key_of_line(line)
            except ValueError as err:
                raise FSCILError(f"{where}: {err}") from None
            i = index.get(key)
            if i is None:
                raise FSCILError(f"{where}: references missing image {line!r} (not a training image of {source.root})")
            if not source.has_image(i):
                raise FSCILError(f"{where}: references missing image file {source.describe(i)}")
            if i in listed_at:
                raise FSCILError(f"{where}: {line!r} is already listed at {listed_at[i]}")
            listed_at[i] = f"{path.name} line {lineno}"
            ids.append(i)
            lines.append(lineno)
        if not ids:
            raise FSCILError(f"split file {path} lists no samples")
        ids_arr = np.asarray(ids, dtype=np.int64)
        labels = source.labels[ids_arr]
        for label, lineno in zip(labels.tolist(), lines, strict=True):
            if label in class_session and class_session[label] != path.name:
                raise FSCILError(f"{path} line {lineno}: class {names[label]!r} was already introduced by "
                                 f"{class_session[label]}")
        for label in labels.tolist():
            class_session.setdefault(label, path.name)
        if shape is not None:
            _check_shape(path, t, labels, lines, shape, names)
        sessions.append(ids_arr)
    digests = digest_files(split_dir, [p.name for p in files])
    return sessions, {f"split/{name}": digest for name, digest in digests.items()}


def _check_shape(path: Path, t: int, labels: np.ndarray, lines: list[int], shape: BenchmarkShape,
                 names: list[str]) -> None:
    classes, counts = np.unique(labels, return_counts=True)
    if t == 0:
        if len(classes) != shape.base_classes:
            raise FSCILError(f"{path}: {len(classes)} base classes, expected {shape.base_classes}")
        wanted = np.arange(shape.base_classes)
    else:
        if len(labels) != shape.ways * shape.shots:
            raise FSCILError(f"{path}: {len(labels)} samples, expected {shape.ways} ways x {shape.shots} shots")
        if len(classes) != shape.ways:
            raise FSCILError(f"{path}: {len(classes)} classes, expected {shape.ways}")
        bad = int(np.argmax(counts != shape.shots))
        if counts[bad] != shape.shots:
            raise FSCILError(f"{path}: class {names[classes[bad]]!r} has {counts[bad]} samples, expected {shape.shots}")
        first = shape.base_classes + (t - 1) * shape.ways
        wanted = np.arange(first, first + shape.ways)
    if shape.consecutive:
        stray = ~np.isin(labels, wanted)
        if stray.any():
            k = int(np.argmax(stray))
            raise FSCILError(f"{path} line {lines[k]}: class {int(labels[k])} is not one of this session's classes "
                             f"{wanted[0]}..{wanted[-1]}")
