"""`SourceDataset`: a raw dataset on disk described in memory, with images decoded lazily.

Every reader (cifar100, mini_imagenet, cub200, class_folder) returns one. Samples keep their source
order and their source labels; relabelling into the session-ordered convention happens in `assemble.py`.
Images come either from files (`paths`, optionally members of a zip `archive`, Omniglot) or from an in-memory
uint8 array (`arrays`, CIFAR).
"""

from __future__ import annotations

import io
import threading
import zipfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from pipeline.errors import FSCILError

# One fixed filter for every resize, so the same source always gives the same pack bytes.
RESAMPLE = Image.Resampling.BILINEAR


def one_line(err: BaseException | str) -> str:
    """Collapse an underlying error message to one line (FSCILError messages must fit on one)."""
    return " ".join(str(err).split())


def decode_rgb(path: Path, data: bytes | None = None) -> Image.Image:
    """Open an image file (or its bytes `data`) as RGB (grayscale replicated), raising FSCILError naming the file if
    it is missing or corrupt."""
    try:
        with Image.open(path if data is None else io.BytesIO(data)) as img:
            img.load()
            return img.convert("RGB")
    except FileNotFoundError:
        raise FSCILError(f"missing image file {path}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise FSCILError(f"unreadable image {path}: {one_line(err)}") from None


def fit_shorter_side(img: Image.Image, shorter: int, canvas: int) -> tuple[np.ndarray, tuple[int, int]]:
    """The whole image with its shorter side resized to `shorter` (aspect kept; a longer side beyond `canvas` is
    centre-cropped to it) at the top-left of a zero canvas x canvas image -> ((canvas, canvas, 3) uint8, (h, w))."""
    w, h = img.size
    # the longer side truncated, as torchvision's Resize(int) and mmcls's Resize((s, -1)) compute it
    nw, nh = (shorter, int(shorter * h / w)) if w <= h else (int(shorter * w / h), shorter)
    if (nw, nh) != (w, h):
        img = img.resize((nw, nh), RESAMPLE)
    cw, ch = min(nw, canvas), min(nh, canvas)
    if (cw, ch) != (nw, nh):
        left, top = (nw - cw) // 2, (nh - ch) // 2
        img = img.crop((left, top, left + cw, top + ch))
    out = np.zeros((canvas, canvas, 3), dtype=np.uint8)
    out[:ch, :cw] = np.asarray(img, dtype=np.uint8).reshape(ch, cw, 3)
    return out, (ch, cw)


def fit_square(img: Image.Image, size: int) -> np.ndarray:
    """Resize the shorter side to `size` (aspect kept) and centre-crop a size x size square -> (size, size, 3) uint8.

    An image that already is size x size passes through untouched (CIFAR at 32, miniImageNet at 84).
    """
    w, h = img.size
    if (w, h) != (size, size):
        scale = size / min(w, h)
        nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
        if (nw, nh) != (w, h):
            img = img.resize((nw, nh), RESAMPLE)
        left, top = (nw - size) // 2, (nh - size) // 2
        img = img.crop((left, top, left + size, top + size))
    return np.asarray(img, dtype=np.uint8).reshape(size, size, 3)


@dataclass
class SourceDataset:
    """A raw dataset: per-sample label, train/test membership, split-file key and image source.

    name: dataset kind ("cifar100", "mini_imagenet", ...).
    root: the raw data folder.
    class_names: (C,) names in source label order.
    labels: (N,) int64 source labels.
    is_train: (N,) bool, True for the source's training split.
    keys: (N,) how split files refer to a sample (CIFAR: train index; mini: file name; CUB: relative path).
    paths: (N,) image files, for file-backed sources (members of `archive` when it is set).
    archive: a zip file holding `paths` as member names (posix), or None for files on disk.
    arrays: (N, H, W, 3) uint8 images, for array-backed sources.
    provenance: source files and their checksums, stored in the pack.
    """

    name: str
    root: Path
    class_names: list[str]
    labels: np.ndarray
    is_train: np.ndarray
    keys: list[str]
    paths: list[Path] | None = None
    arrays: np.ndarray | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    archive: Path | None = None

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.int64)
        self.is_train = np.asarray(self.is_train, dtype=bool)
        n = len(self.labels)
        if len(self.is_train) != n or len(self.keys) != n:
            raise ValueError("labels, is_train and keys must have one entry per sample")
        if (self.paths is None) == (self.arrays is None):
            raise ValueError("a SourceDataset has exactly one of paths or arrays")
        if self.paths is not None and len(self.paths) != n:
            raise ValueError("paths must have one entry per sample")
        if self.arrays is not None and len(self.arrays) != n:
            raise ValueError("arrays must have one entry per sample")

    def __len__(self) -> int:
        return len(self.labels)

    @cached_property
    def train_key_index(self) -> dict[str, int]:
        """Split-file key -> sample id, over training samples only (split files list training samples)."""
        return {self.keys[i]: int(i) for i in np.flatnonzero(self.is_train)}

    def describe(self, i: int) -> str:
        """Human-readable location of sample i for error messages."""
        if self.archive is not None:
            return f"{self.archive}:{self.paths[i]}"
        if self.paths is not None:
            return str(self.paths[i])
        return f"{self.root} sample {i}"

    @cached_property
    def _members(self) -> set[str]:
        with zipfile.ZipFile(self.archive) as zf:
            return set(zf.namelist())

    @cached_property
    def _zip_local(self) -> threading.local:
        return threading.local()  # one open ZipFile per decoding thread

    def _read_member(self, i: int) -> bytes:
        local = self._zip_local
        if getattr(local, "zf", None) is None:
            local.zf = zipfile.ZipFile(self.archive)
        return local.zf.read(Path(self.paths[i]).as_posix())

    def has_image(self, i: int) -> bool:
        if self.archive is not None:
            return Path(self.paths[i]).as_posix() in self._members
        return self.arrays is not None or self.paths[i].is_file()

    def image(self, i: int) -> Image.Image:
        """Sample i, decoded, as an RGB PIL image."""
        if self.arrays is not None:
            return Image.fromarray(np.ascontiguousarray(self.arrays[i], dtype=np.uint8))
        if self.archive is not None:
            return decode_rgb(Path(self.describe(i)), self._read_member(i))
        return decode_rgb(self.paths[i])

    def load(self, i: int, size: int) -> np.ndarray:
        """Sample i as (size, size, 3) uint8, shorter side resized to `size` and centre-cropped."""
        if self.arrays is not None and self.arrays[i].shape[:2] == (size, size):
            return np.ascontiguousarray(self.arrays[i], dtype=np.uint8)
        return fit_square(self.image(i), size)

    def load_whole(self, i: int, shorter: int, canvas: int) -> tuple[np.ndarray, tuple[int, int]]:
        """Sample i whole on a canvas (`fit_shorter_side`): the shorter_side view."""
        return fit_shorter_side(self.image(i), shorter, canvas)


def read_text_lines(path: Path, what: str) -> list[str]:
    """The lines of a text index file, raising FSCILError naming it when missing or not utf-8."""
    if not path.is_file():
        raise FSCILError(f"missing {what} file {path}")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise FSCILError(f"unreadable {what} file {path}: {one_line(err)}") from None


def require_dir(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise FSCILError(f"missing {what} directory {path}")
    return path
