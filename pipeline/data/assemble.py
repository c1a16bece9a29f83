"""From a SourceDataset and its sessions' training samples to the pack's content.

This is where the session-ordered class convention is established: classes are renumbered in the order
the sessions introduce them (within a session, by source label), `class_names` follow the new ids, and
the pack's samples are laid out session by session (base training samples, session 1's, ..., then the
test samples of every protocol class), each block sorted by (class, source order). Images are decoded
lazily, `CHUNK` at a time, so a pack never needs the whole dataset in memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from pipeline.data.pack import PackContent
from pipeline.data.presets import ImagePreset, get_preset
from pipeline.data.protocol import FSCILProtocol
from pipeline.data.source import SourceDataset
from pipeline.errors import FSCILError

CHUNK = 512  # images decoded and resized per write


def _stream(source: SourceDataset, order: np.ndarray, size: int) -> Iterator[np.ndarray]:
    # PIL releases the GIL while decoding and resizing, so threads help; map keeps the order deterministic
    workers = 1 if source.arrays is not None else min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for start in range(0, len(order), CHUNK):
            ids = order[start : start + CHUNK].tolist()
            yield np.stack(list(pool.map(source.load, ids, [size] * len(ids))))


def _stream_whole(source: SourceDataset, order: np.ndarray, preset: ImagePreset,
                  extents: list[tuple[int, int]]) -> Iterator[np.ndarray]:
    """The shorter_side view: each image whole on the preset's canvas; its extent (h, w) appended to `extents`."""
    workers = 1 if source.arrays is not None else min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for start in range(0, len(order), CHUNK):
            ids = order[start : start + CHUNK].tolist()
            images, sizes = zip(*pool.map(lambda i: source.load_whole(i, preset.test_resize, preset.canvas), ids),
                                strict=True)
            extents.extend(sizes)
            yield np.stack(images)


def assemble(source: SourceDataset, train_sessions: list[np.ndarray], image_size: int, preset: str,
             provenance: dict[str, Any], ways: int | None = None, shots: int | None = None) -> PackContent:
    """Relabel, order and validate; returns PackContent whose `images` stream from `source`.

    train_sessions: source sample ids of each session's training set (0 = base).
    ways, shots: expected incremental-session shape (None: not checked).
    """
    where = f"{source.name} dataset at {source.root}"
    session_classes = [np.unique(source.labels[np.asarray(ids, dtype=np.int64)]) for ids in train_sessions]
    old_order = np.concatenate(session_classes)
    if len(np.unique(old_order)) != len(old_order):
        raise FSCILError(f"{where}: a class is introduced by more than one session")
    new_label = np.full(len(source.class_names), -1, dtype=np.int64)
    new_label[old_order] = np.arange(len(old_order))

    def by_class(ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        return ids[np.lexsort((ids, new_label[source.labels[ids]]))]

    test_src = np.flatnonzero(~source.is_train & (new_label[source.labels] >= 0))
    blocks = [by_class(ids) for ids in train_sessions] + [by_class(test_src)]
    order = np.concatenate(blocks)  # pack id -> source id
    if len(np.unique(order)) != len(order):
        raise FSCILError(f"{where}: a sample is used by more than one session or by both train and test")
    missing = next((int(i) for i in order if not source.has_image(int(i))), None)
    if missing is not None:
        raise FSCILError(f"missing image file {source.describe(missing)}")

    protocol = FSCILProtocol.from_layout([len(b) for b in blocks[:-1]], [len(c) for c in session_classes],
                                         len(blocks[-1]))
    labels = new_label[source.labels[order]]
    class_names = [source.class_names[c] for c in old_order]
    try:
        protocol.validate(labels, ways=ways, shots=shots, class_names=class_names)
    except FSCILError as err:
        raise FSCILError(f"{where}: {err}") from None
    view = get_preset(preset, image_size)
    extents: list[tuple[int, int]] | None = [] if view.view == "shorter_side" else None
    images = _stream(source, order, image_size) if extents is None else _stream_whole(source, order, view, extents)
    return PackContent(
        dataset=source.name,
        preset=preset,
        image_size=image_size,
        labels=labels,
        class_names=class_names,
        protocol=protocol,
        images=images,
        provenance={**source.provenance, **provenance},
        source_keys=[source.keys[i] for i in order],
        extents=extents,
    )
