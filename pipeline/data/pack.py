"""The HDF5 image pack: the one file every later stage reads images, labels and the protocol from.

Layout (format_version 1):
    images        uint8 (N, S, S, 3), chunked along N (S: the preset's canvas, image_size unless its view is
                  shorter_side)
    extents       int32 (N, 2), the shorter_side view only: each image's (h, w) at the top-left of its canvas
    labels        int64 (N,), session-ordered class ids (see protocol.py)
    class_names   utf-8 strings (C,), in class-id order
    source_keys   utf-8 strings (N,), where each sample came from (file name, train index, ...)
    protocol/     session_classes_{t}, session_train_ids_{t} (t = 0..S), test_ids, all int64
    attrs         format_version, dataset, preset, image_size, canvas, num_sessions (= S + 1, base included),
                  num_classes, provenance (JSON), content_hash (written last: its absence marks an incomplete file)

content_hash is sha256 over the image bytes, labels, protocol arrays and class names, computed while the
images stream in, so identical inputs give an identical hash. The writer goes through `atomic_output`:
a failed or killed build leaves no pack at the final path.

h5py handles must not cross a fork: open the pack in each worker process.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from pipeline.atomic import atomic_output
from pipeline.data.presets import get_preset
from pipeline.data.protocol import FSCILProtocol, Session
from pipeline.data.source import one_line
from pipeline.errors import FSCILError

FORMAT_VERSION = 1
CHUNK_BYTES = 4 << 20  # ~4 MiB per HDF5 chunk: 256 CIFAR images, 198 at 84 px, 27 at 224 px
_STR = h5py.string_dtype("utf-8")


@dataclass
class PackContent:
    """Everything a pack holds; `images` is an iterable of uint8 (k, S, S, 3) chunks in sample order."""

    dataset: str
    preset: str
    image_size: int
    labels: np.ndarray
    class_names: list[str]
    protocol: FSCILProtocol
    images: Iterable[np.ndarray]
    provenance: dict[str, Any] = field(default_factory=dict)
    source_keys: list[str] | None = None
    extents: Any = None
    """The shorter_side view: each image's (h, w) on its canvas, (N, 2) or a list filled while `images` streams."""

    @property
    def canvas(self) -> int:
        """The stored side of an image: the preset's canvas."""
        return get_preset(self.preset, self.image_size).canvas


def chunk_rows(image_size: int) -> int:
    return int(max(1, min(256, CHUNK_BYTES // (image_size * image_size * 3))))


def _hash_metadata(h: hashlib._Hash, labels: np.ndarray, class_names: list[str], protocol: FSCILProtocol) -> None:
    """Fold everything but the images into the content hash (fixed order, little-endian int64)."""
    h.update(np.ascontiguousarray(labels, dtype="<i8").tobytes())
    for s in protocol.sessions:
        for arr in (s.classes, s.train_ids):
            h.update(len(arr).to_bytes(8, "little"))
            h.update(np.ascontiguousarray(arr, dtype="<i8").tobytes())
    h.update(len(protocol.test_ids).to_bytes(8, "little"))
    h.update(np.ascontiguousarray(protocol.test_ids, dtype="<i8").tobytes())
    for name in class_names:
        h.update(name.encode("utf-8") + b"\0")


def _new_hash(n: int, size: int) -> hashlib._Hash:
    h = hashlib.sha256()
    h.update(f"fscil-image-pack-v{FORMAT_VERSION}:{n}x{size}x{size}x3\n".encode())
    return h


def write_pack(path: Path, content: PackContent) -> str:
    """Stream `content` into an HDF5 pack at `path` (atomically); returns the content hash.

    No modification times are stored, so the same content gives a byte-identical file (DVC's cache relies on it).
    """
    labels = np.asarray(content.labels, dtype=np.int64)
    n, size = len(labels), content.canvas
    h = _new_hash(n, size)
    with atomic_output(path) as tmp, h5py.File(tmp, "w") as f:
        images = f.create_dataset("images", shape=(n, size, size, 3), dtype=np.uint8,
                                  chunks=(min(max(n, 1), chunk_rows(size)), size, size, 3), track_times=False)
        written = 0
        for chunk in content.images:
            chunk = np.asarray(chunk)
            if chunk.dtype != np.uint8 or chunk.shape[1:] != (size, size, 3) or written + len(chunk) > n:
                raise RuntimeError(f"image chunk {chunk.dtype} {chunk.shape} does not fit the pack ({n}, {size})")
            images[written : written + len(chunk)] = chunk
            h.update(np.ascontiguousarray(chunk).tobytes())
            written += len(chunk)
        if written != n:
            raise RuntimeError(f"{written} images streamed for {n} labels")
        if content.extents is not None:
            extents = np.asarray(content.extents, dtype=np.int32).reshape(-1, 2)
            if len(extents) != n or extents.min(initial=1) < 1 or extents.max(initial=size) > size:
                raise RuntimeError(f"{len(extents)} image extents do not fit {n} images on a {size} px canvas")
            f.create_dataset("extents", data=extents, track_times=False)
            h.update(extents.tobytes())
        f.create_dataset("labels", data=labels, track_times=False)
        f.create_dataset("class_names", data=np.array(content.class_names, dtype=object), dtype=_STR,
                         track_times=False)
        if content.source_keys is not None:
            f.create_dataset("source_keys", data=np.array(content.source_keys, dtype=object), dtype=_STR,
                             track_times=False)
        group = f.create_group("protocol")
        for s in content.protocol.sessions:
            group.create_dataset(f"session_classes_{s.index}", data=s.classes, track_times=False)
            group.create_dataset(f"session_train_ids_{s.index}", data=s.train_ids, track_times=False)
        group.create_dataset("test_ids", data=content.protocol.test_ids, track_times=False)
        _hash_metadata(h, labels, content.class_names, content.protocol)
        digest = h.hexdigest()
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["dataset"] = content.dataset
        f.attrs["preset"] = content.preset
        f.attrs["image_size"] = int(content.image_size)
        f.attrs["canvas"] = size
        f.attrs["num_sessions"] = content.protocol.num_sessions
        f.attrs["num_classes"] = len(content.class_names)
        f.attrs["provenance"] = json.dumps(content.provenance, sort_keys=True, default=str)
        f.attrs["content_hash"] = digest  # last: marks the file complete
    return digest


class ImagePack:
    """Read access to a pack: `with ImagePack.open(path) as pack: x = pack.read_images(ids)`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FSCILError(f"missing image pack {self.path} (run the prepare stage)")
        try:
            self._file = h5py.File(self.path, "r")
        except OSError as err:
            raise FSCILError(f"unreadable image pack {self.path}: {one_line(err)}") from None
        try:
            self._load()
        except BaseException:
            self._file.close()
            raise

    def _load(self) -> None:
        f, where = self._file, f"image pack {self.path}"
        version = f.attrs.get("format_version")
        if version is None or "content_hash" not in f.attrs:
            raise FSCILError(f"incomplete {where}: no format_version/content_hash (re-run the prepare stage)")
        if int(version) != FORMAT_VERSION:
            raise FSCILError(f"{where} has format_version {int(version)}, expected {FORMAT_VERSION} "
                             "(re-run the prepare stage)")
        for key in ("images", "labels", "class_names", "protocol/test_ids"):
            if key not in f:
                raise FSCILError(f"incomplete {where}: no '{key}'")
        self.images: h5py.Dataset = f["images"]
        self.labels: np.ndarray = f["labels"][:].astype(np.int64)
        self.class_names: list[str] = [str(s) for s in f["class_names"].asstr()[:]]
        self.content_hash: str = str(f.attrs["content_hash"])
        self.image_size: int = int(f.attrs["image_size"])
        self.canvas: int = int(f.attrs.get("canvas", self.image_size))
        self.extents: np.ndarray | None = f["extents"][:].astype(np.int64) if "extents" in f else None
        self.dataset: str = str(f.attrs["dataset"])
        self.preset: str = str(f.attrs["preset"])
        self.provenance: dict[str, Any] = json.loads(str(f.attrs["provenance"]))
        num_sessions = int(f.attrs["num_sessions"])
        group = f["protocol"]
        sessions = []
        for t in range(num_sessions):
            keys = (f"session_classes_{t}", f"session_train_ids_{t}")
            if any(k not in group for k in keys):
                raise FSCILError(f"incomplete {where}: no protocol/{keys[0]}")
            sessions.append(Session(t, group[keys[0]][:], group[keys[1]][:]))
        self.protocol = FSCILProtocol(sessions, group["test_ids"][:])
        if self.images.shape != (len(self.labels), self.canvas, self.canvas, 3):
            raise FSCILError(f"corrupt {where}: images {self.images.shape} do not match {len(self.labels)} labels")
        if self.extents is not None and self.extents.shape != (len(self.labels), 2):
            raise FSCILError(f"corrupt {where}: extents {self.extents.shape} do not match {len(self.labels)} labels")

    @classmethod
    def open(cls, path: str | Path) -> ImagePack:
        return cls(Path(path))

    def __enter__(self) -> ImagePack:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def source_keys(self) -> list[str] | None:
        return [str(s) for s in self._file["source_keys"].asstr()[:]] if "source_keys" in self._file else None

    def read_images(self, ids: np.ndarray) -> np.ndarray:
        """(len(ids), S, S, 3) uint8 images in the order of `ids` (unsorted and repeated ids allowed)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if len(ids) == 0:
            return np.empty((0, *self.images.shape[1:]), dtype=np.uint8)
        if ids.min() < 0 or ids.max() >= len(self.labels):
            raise IndexError(f"sample ids outside 0..{len(self.labels) - 1}")
        # one slice read per run of consecutive ids: ~10x faster than h5py's fancy (point-list) indexing
        uniq, inverse = np.unique(ids, return_inverse=True)
        cuts = np.flatnonzero(np.diff(uniq) != 1) + 1
        out = np.empty((len(uniq), *self.images.shape[1:]), dtype=np.uint8)
        for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(uniq)], strict=True):
            out[a:b] = self.images[uniq[a] : uniq[b - 1] + 1]
        return out[inverse.reshape(-1)]

    def read_extents(self, ids: np.ndarray) -> np.ndarray | None:
        """(len(ids), 2) extents (h, w) of images `ids` on their canvas (the shorter_side view), else None."""
        return None if self.extents is None else self.extents[np.asarray(ids, dtype=np.int64).reshape(-1)]

    def verify(self) -> None:
        """Recompute the content hash from the stored data; FSCILError if it differs."""
        n, size = len(self.labels), self.canvas
        h = _new_hash(n, size)
        step = chunk_rows(size) * 4
        for start in range(0, n, step):
            h.update(np.ascontiguousarray(self.images[start : start + step]).tobytes())
        if self.extents is not None:
            h.update(self.extents.astype(np.int32).tobytes())
        _hash_metadata(h, self.labels, self.class_names, self.protocol)
        if h.hexdigest() != self.content_hash:
            raise FSCILError(f"corrupt image pack {self.path}: content does not match content_hash")
