"""The cached-feature store (Zarr v3): frozen-backbone maps that all incremental sessions train on.

Layout (arrays chunked along samples):
    test/maps (N, C, H, W), test/labels (N,), test/ids (N,)           every test image of the pack
    fewshot/maps (M, C, H, W), fewshot/labels, fewshot/ids, fewshot/session   the few-shot training images
    fewshot/views (V, M, C, H, W)                                    optional augmented views
    memory/base_means (B, C, H, W), memory/base_classes (B,)         class-mean maps of the base classes (NCM)
    memory/base_maps (M, C, H, W), memory/base_map_classes (M,)      the base classes' memory (attrs "memory",
                                                                     "memory_k": the rule, pipeline/store/memory.py)
    memory/base_deviations (D, C, H, W), ..._classes (D,)            optional: base training maps minus their class
                                                                     mean (attr "deviations": per class)
Root attributes hold the format version, the sha256 of the image pack's content and of the base checkpoint, the
map shape, dtype and the transform. `FeatureStore.open` refuses a store that is incomplete, of another format,
or built from another checkpoint or data pack.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from pipeline.errors import FSCILError

FORMAT = "mamba-fscil-features/1"


class FeatureStoreWriter:
    """Creates the arrays up front, then takes slices; `finish` marks the store complete."""

    def __init__(self, path: Path, map_shape: tuple[int, int, int], counts: dict[str, int], num_base: int,
                 views: int, dtype: str, chunk: int, attrs: dict[str, Any], memory_rows: int | None = None,
                 deviation_rows: int = 0):
        self.root = zarr.open_group(str(path), mode="w", zarr_format=3)
        self.dtype = dtype
        c, h, w = map_shape

        def make(name: str, shape: tuple[int, ...], dt: str, axis_chunk: int | None = None) -> None:
            chunks = (min(axis_chunk or chunk, max(shape[0], 1)), *shape[1:])
            self.root.create_array(name, shape=shape, chunks=chunks, dtype=dt)

        for part in ("test", "fewshot"):
            n = counts[part]
            make(f"{part}/maps", (n, c, h, w), dtype)
            make(f"{part}/labels", (n,), "int64")
            make(f"{part}/ids", (n,), "int64")
        make("fewshot/session", (counts["fewshot"],), "int64")
        if views:
            self.root.create_array("fewshot/views", shape=(views, counts["fewshot"], c, h, w),
                                   chunks=(1, min(chunk, max(counts["fewshot"], 1)), c, h, w), dtype=dtype)
        make("memory/base_means", (num_base, c, h, w), "float32")
        make("memory/base_classes", (num_base,), "int64")
        make("memory/base_maps", (num_base if memory_rows is None else memory_rows, c, h, w), "float32")
        make("memory/base_map_classes", (num_base if memory_rows is None else memory_rows,), "int64")
        if deviation_rows:
            make("memory/base_deviations", (deviation_rows, c, h, w), "float32")
            make("memory/base_deviation_classes", (deviation_rows,), "int64")
        self.root.attrs.update({**attrs, "format": FORMAT, "complete": False, "map_shape": [c, h, w],
                                "dtype": dtype, "augmented_views": views})

    def write(self, name: str, start: int, values: np.ndarray) -> None:
        self.root[name][start:start + len(values)] = values

    def write_view(self, view: int, start: int, values: np.ndarray) -> None:
        self.root["fewshot/views"][view, start:start + len(values)] = values

    def finish(self) -> None:
        """Record every array's shape and sha256 (what `FeatureStore.verify` checks) and mark the store complete."""
        self.root.attrs["arrays"] = {name: {"shape": list(self.root[name].shape), "sha256": _digest(self.root[name])}
                                     for name in _array_names(self.root)}
        self.root.attrs["complete"] = True


def _array_names(group: zarr.Group, prefix: str = "") -> list[str]:
    """Every array under `group`, as a path ("test/maps", ...), sorted."""
    names = [f"{prefix}{k}" for k in group.array_keys()]
    for k in group.group_keys():
        names += _array_names(group[k], f"{prefix}{k}/")
    return sorted(names)


def _digest(array) -> str:
    """sha256 of an array's values (C order), read one chunk row at a time along its first axis."""
    h = hashlib.sha256()
    step = array.chunks[0] if array.ndim else 1
    for start in range(0, max(array.shape[0], 1) if array.ndim else 1, step):
        h.update(np.ascontiguousarray(array[start:start + step] if array.ndim else array[...]).tobytes())
    return h.hexdigest()


class FeatureStore:
    """Read access with metadata checks. Arrays come back as numpy (float32 maps)."""

    def __init__(self, path: Path, root: zarr.Group):
        self.path, self.root = path, root
        self.attrs: dict[str, Any] = root.attrs.asdict()

    @classmethod
    def open(cls, path: str | Path, pack_hash: str | None = None, checkpoint_sha256: str | None = None
             ) -> FeatureStore:
        path = Path(path)
        if not path.exists():
            raise FSCILError(f"{path}: feature store not found; run `fscil stage extract` first")
        try:
            root = zarr.open_group(str(path), mode="r")
            attrs = root.attrs.asdict()
        except Exception as err:  # zarr raises a variety of errors on corrupt metadata
            raise FSCILError(f"{path}: not a readable Zarr store ({type(err).__name__})") from None
        if attrs.get("format") != FORMAT:
            raise FSCILError(f"{path}: not a feature store of this pipeline (format {attrs.get('format')!r})")
        if not attrs.get("complete"):
            raise FSCILError(f"{path}: incomplete feature store (its extraction did not finish); rerun extract")
        if pack_hash is not None and attrs.get("pack_hash") != pack_hash:
            raise FSCILError(f"{path}: feature store was built from another data pack; rerun extract")
        if checkpoint_sha256 is not None and attrs.get("checkpoint_sha256") != checkpoint_sha256:
            raise FSCILError(f"{path}: feature store was built from another base checkpoint; rerun extract")
        store = cls(path, root)
        for name in ("test/maps", "fewshot/maps", "memory/base_means"):
            if name not in root:
                raise FSCILError(f"{path}: feature store lacks {name}; rerun `fscil stage extract` (dvc repro -f -s "
                                 "extract)")
            if list(root[name].shape[1:]) != attrs["map_shape"]:
                raise FSCILError(f"{path}: {name} has maps of shape {root[name].shape[1:]}, "
                                 f"metadata says {tuple(attrs['map_shape'])}")
        return store

    def verify(self, stage: str = "extract") -> None:
        """Read every chunk of every array and check each array's shape and sha256 against what the extraction
        recorded (`FeatureStoreWriter.finish`): a missing, truncated, reshaped or corrupted array is a one-line error
        naming it and the stage that writes the store, before any training."""
        fix = f"rerun `fscil stage {stage}` (dvc repro -f -s {stage})"
        recorded = self.attrs.get("arrays")
        if not recorded:
            raise FSCILError(f"{self.path}: written by an earlier version of this code (no array digests); {fix}")
        names = sorted(recorded)
        for name in names:
            if name not in self.root:
                raise FSCILError(f"{self.path}: array {name} is missing; {fix}")
            array = self.root[name]
            if list(array.shape) != recorded[name]["shape"]:
                raise FSCILError(f"{self.path}: array {name} has shape {tuple(array.shape)}, the extraction wrote "
                                 f"{tuple(recorded[name]['shape'])}; {fix}")
            try:
                digest = _digest(array)
            except Exception as err:  # zarr and its codecs raise many kinds on a damaged chunk
                raise FSCILError(f"{self.path}: array {name} has an unreadable chunk ({type(err).__name__}); "
                                 f"{fix}") from None
            if digest != recorded[name]["sha256"]:
                raise FSCILError(f"{self.path}: array {name} does not hold what the extraction wrote (sha256 "
                                 f"mismatch); {fix}")

    @property
    def map_shape(self) -> tuple[int, int, int]:
        return tuple(self.attrs["map_shape"])

    def _read(self, name: str, index: np.ndarray | slice = slice(None)) -> np.ndarray:
        try:
            values = self.root[name][index] if isinstance(index, slice) else self.root[name].get_orthogonal_selection(
                (index,))
        except Exception as err:
            raise FSCILError(f"{self.path}: cannot read {name} ({type(err).__name__}: {err})") from None
        return np.asarray(values)

    def test_set(self, max_label: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Test maps (float32) and labels, restricted to labels < max_label (the classes seen so far)."""
        labels = self._read("test/labels")
        keep = np.arange(len(labels)) if max_label is None else np.flatnonzero(labels < max_label)
        return self._read("test/maps", keep).astype(np.float32), labels[keep]

    def fewshot(self, session: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Maps, labels and (V, n, C, H, W) augmented views (or None) of one incremental session's shots."""
        sessions = self._read("fewshot/session")
        rows = np.flatnonzero(sessions == session)
        if len(rows) == 0:
            raise FSCILError(f"{self.path}: no few-shot samples stored for session {session}")
        maps = self._read("fewshot/maps", rows).astype(np.float32)
        views = None
        if self.attrs.get("augmented_views", 0):
            views = np.asarray(self.root["fewshot/views"].get_orthogonal_selection((slice(None), rows)),
                               dtype=np.float32)
        return maps, self._read("fewshot/labels", rows), views

    @property
    def memory_rule(self) -> tuple[str, int]:
        """(kind, k) of the class memory (pipeline/store/memory.py) the sessions apply to their own classes."""
        return self.attrs.get("memory", "mean"), int(self.attrs.get("memory_k", 1))

    def base_memory(self) -> tuple[np.ndarray, np.ndarray]:
        """The base classes' memory (maps (M, C, H, W), classes (M,)): what the sessions train on."""
        return self._read("memory/base_maps").astype(np.float32), self._read("memory/base_map_classes")

    def base_deviations(self) -> np.ndarray | None:
        """Base training maps minus their class mean (D, C, H, W), or None when the store keeps none."""
        if "memory/base_deviations" not in self.root:  # written only when extract.deviations > 0
            return None
        return self._read("memory/base_deviations").astype(np.float32)

    def base_means(self) -> tuple[np.ndarray, np.ndarray]:
        """Class-mean maps of the base classes (B, C, H, W) and their classes: the prototype baseline's."""
        return self._read("memory/base_means").astype(np.float32), self._read("memory/base_classes")

    def shots_before(self, session: int) -> tuple[np.ndarray, np.ndarray]:
        """Every few-shot map and label of sessions 1..session-1 (the earlier novel classes' own shots)."""
        if session <= 1:
            c, h, w = self.map_shape
            return np.zeros((0, c, h, w), dtype=np.float32), np.zeros(0, dtype=np.int64)
        earlier = [self.fewshot(k)[:2] for k in range(1, session)]
        return tuple(np.concatenate(x) for x in zip(*earlier, strict=True))
