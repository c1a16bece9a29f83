"""`build_pack`: read (or generate) the configured dataset, draw or read its protocol, write the image pack.

The dataset's `build` (its `DATASETS` entry, pipeline/data/registry.py) returns the pack's content with images still
to be streamed, and `write_pack` writes it atomically.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.data.pack import write_pack
from pipeline.data.protocol import FSCILProtocol
from pipeline.data.registry import DATASETS

if TYPE_CHECKING:  # the data package does not import the top-level config at run time
    from pipeline.config.data_section import DataConfig


def build_pack(cfg: DataConfig, out: Path, check: Callable[[FSCILProtocol], None] | None = None) -> dict[str, Any]:
    """Write the image pack for `cfg` to `out` (atomically) and return a summary of what it holds.

    `check` sees the protocol once it is drawn, before any image is written: what it raises stops the build
    with nothing at `out`.
    """
    start = time.perf_counter()
    content = DATASETS["synthetic" if cfg.generated else cfg.dataset].builder()(cfg)  # data.source synthetic: drawn
    protocol = content.protocol
    if check is not None:
        check(protocol)
    content_hash = write_pack(Path(out), content)
    return {
        "path": str(out),
        "dataset": content.dataset,
        "preset": content.preset,
        "image_size": content.image_size,
        "images": int(len(content.labels)),
        "classes": len(content.class_names),
        "base_classes": protocol.num_base_classes,
        "incremental_sessions": protocol.num_incremental,
        "ways": protocol.ways,
        "shots": protocol.shots,
        "train_images_per_session": [len(s.train_ids) for s in protocol.sessions],
        "test_images": int(len(protocol.test_ids)),
        "content_hash": content_hash,
        "seconds": round(time.perf_counter() - start, 3),
    }
