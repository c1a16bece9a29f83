"""The pseudo-incremental image pack of the selection protocol (paper appendix supp:hyperparameter_protocol): the real
base session's training images split, seeded, into a pseudo-base session, few-shot pseudo-incremental sessions and a
held-out pseudo test set, written as an ordinary image pack. Nothing of the real test set or of the real incremental
sessions is read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pipeline.data.pack import ImagePack, PackContent, chunk_rows, write_pack
from pipeline.data.protocol import FSCILProtocol
from pipeline.data.sampling import draw_sessions, split_test
from pipeline.errors import FSCILError
from pipeline.research.selection_config import SelectionConfig

PSEUDO_PACK = "pseudo_pack.h5"


def pseudo_shape(protocol: FSCILProtocol, base_fraction: float | None, ways: int | None, shots: int | None,
                 sessions: int | None) -> tuple[int, int, int, int]:
    """(pseudo-base classes, ways, shots, sessions) carved out of the real protocol's B base classes.

    Defaults: the real ways and shots; min(real sessions, (B // 3) // ways) sessions; every class they leave is a
    pseudo-base class, or round(base_fraction * B) of them.
    """
    num_base = protocol.num_base_classes
    ways = ways or protocol.ways
    shots = shots or protocol.shots
    if ways is None or shots is None:
        raise FSCILError("selection: the real protocol has no uniform ways/shots; set selection.ways and shots")
    sessions = sessions or min(protocol.num_incremental, (num_base // 3) // ways)
    if sessions < 1:
        raise FSCILError(f"selection: {num_base} base classes are too few for a {ways}-way pseudo session")
    pseudo_base = num_base - sessions * ways if base_fraction is None else round(base_fraction * num_base)
    if pseudo_base < 1 or pseudo_base + sessions * ways > num_base:
        raise FSCILError(f"selection: {pseudo_base} pseudo-base + {sessions} x {ways} classes do not fit in the "
                         f"{num_base} base classes")
    return pseudo_base, ways, shots, sessions


def _read_in_chunks(pack: ImagePack, ids: np.ndarray) -> Iterator[np.ndarray]:
    step = chunk_rows(pack.canvas) * 4
    for start in range(0, len(ids), step):
        yield pack.read_images(ids[start:start + step])


def pseudo_pack(pack_path: Path, out_path: Path, base_fraction: float | None = None, ways: int | None = None,
                shots: int | None = None, sessions: int | None = None, val_fraction: float = 0.2,
                seed: int = 0) -> dict:
    """Write the pseudo-incremental image pack at `out_path` (atomically); returns its shape and content hash.

    From the real base session's N training samples only: `val_fraction` of each class's images become the pseudo
    test set, the base classes are permuted, the first ones form the pseudo-base session (all their remaining
    images), the next sessions x ways classes the pseudo-incremental sessions (`shots` images each). Everything is
    drawn from numpy default_rng(seed). Classes are relabelled session-ordered and samples laid out as assemble.py
    does: each session's training block, then the test block, each sorted by (class, parent id).
    """
    with ImagePack.open(pack_path) as parent:
        real = parent.protocol
        ids = np.sort(real.sessions[0].train_ids)  # (N,) parent ids; positions into it index everything below
        labels = parent.labels[ids]  # (N,) parent class ids
        n_base, ways, shots, sessions = pseudo_shape(real, base_fraction, ways, shots, sessions)
        rng = np.random.default_rng(seed)
        is_val = split_test(labels, val_fraction, rng, parent.class_names)
        class_order = rng.permutation(real.base_classes)
        train_blocks = draw_sessions(labels, ~is_val, class_order, n_base, ways, shots, sessions, rng,
                                     parent.class_names)
        used = class_order[: n_base + ways * sessions]
        new_label = np.full(len(parent.class_names), -1, dtype=np.int64)
        new_label[used] = np.arange(len(used))

        def by_class(pos: np.ndarray) -> np.ndarray:
            return pos[np.lexsort((pos, new_label[labels[pos]]))]

        val = np.flatnonzero(is_val & (new_label[labels] >= 0))
        blocks = [by_class(pos) for pos in train_blocks] + [by_class(val)]
        order = ids[np.concatenate(blocks)]  # pseudo id -> parent id
        protocol = FSCILProtocol.from_layout([len(b) for b in blocks[:-1]], [n_base] + [ways] * sessions, len(val))
        pseudo_labels = new_label[parent.labels[order]]
        class_names = [parent.class_names[c] for c in used]
        protocol.validate(pseudo_labels, ways=ways, shots=shots, class_names=class_names)
        selection = {"seed": seed, "val_fraction": val_fraction, "base_fraction": base_fraction,
                     "parent_base_classes": real.num_base_classes, "base_classes": n_base, "ways": ways,
                     "shots": shots, "sessions": sessions}
        digest = write_pack(out_path, PackContent(
            dataset=parent.dataset, preset=parent.preset, image_size=parent.image_size, labels=pseudo_labels,
            class_names=class_names, protocol=protocol, images=_read_in_chunks(parent, order),
            provenance={"parent_pack": parent.content_hash, "selection": selection},
            source_keys=[f"parent/{i}" for i in order], extents=parent.read_extents(order),
        ))
    return {**selection, "num_images": len(order), "num_test": len(val), "content_hash": digest}


def pseudo_packs(pack_path: Path, work_dir: Path, sel: SelectionConfig) -> list[tuple[Path, dict]]:
    """The `sel.protocols` pseudo packs (seeds sel.seed, sel.seed + 1, ...) in work_dir: [(path, description)]."""
    packs = []
    for i in range(sel.protocols):
        path = work_dir / (PSEUDO_PACK if i == 0 else PSEUDO_PACK.replace(".h5", f"_{sel.seed + i}.h5"))
        packs.append((path, pseudo_pack(pack_path, path, sel.base_fraction, sel.ways, sel.shots, sel.sessions,
                                        sel.val_fraction, sel.seed + i)))
    return packs
