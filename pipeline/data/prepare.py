"""`build_pack`: read (or generate) the configured dataset, draw or read its protocol, write the image pack.

One builder per dataset kind, chosen by a plain dict keyed by `DataConfig.dataset`; each returns the
pack's content with images still to be streamed, and `write_pack` writes it atomically.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.data.assemble import assemble
from pipeline.data.cec_splits import BENCHMARKS, BenchmarkShape, read_cec_splits
from pipeline.data.cifar100 import read_cifar100
from pipeline.data.class_folder import class_folder_protocol, read_class_folder
from pipeline.data.cub200 import read_cub200
from pipeline.data.mini_imagenet import read_mini_imagenet
from pipeline.data.omniglot import read_omniglot
from pipeline.data.pack import PackContent, write_pack
from pipeline.data.protocol import FSCILProtocol
from pipeline.data.source import SourceDataset
from pipeline.data.synthetic import SyntheticSpec, synthetic_pack_content

if TYPE_CHECKING:  # the data package does not import the top-level config at run time
    from pipeline.config_sections import DataConfig


def _config_provenance(cfg: DataConfig) -> dict[str, Any]:
    return {"config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}}


def _synthetic(cfg: DataConfig) -> PackContent:
    """The synthetic benchmark, or with source synthetic the generator at a benchmark's shape: drawn at 32 px
    (CIFAR's side, whatever the benchmark's) and resized, and augmented and normalised by the benchmark's preset."""
    base, ways, shots, sessions = cfg.protocol_shape()
    train, pool, test = cfg.generated_counts()
    size = cfg.resolved_image_size
    spec = SyntheticSpec(base_classes=base, ways=ways, shots=shots, sessions=sessions, train_per_class=train,
                         novel_pool_per_class=pool, test_per_class=test, image_size=size, seed=cfg.seed,
                         novel_shapes=cfg.novel_shapes,
                         render_size=min(size, SyntheticSpec.image_size) if cfg.source == "synthetic" else None)
    content = synthetic_pack_content(spec, preset=cfg.dataset)
    content.provenance.update(_config_provenance(cfg))
    return content


def _with_cec_splits(read: Callable[[DataConfig], SourceDataset]) -> Callable[[DataConfig], PackContent]:
    """Builder for a benchmark with official CEC split files."""

    def build(cfg: DataConfig) -> PackContent:
        source = read(cfg)
        base, ways, shots, sessions = cfg.protocol_shape()
        # the CIFAR-100 class-range check only makes sense for the standard protocol's shape
        consecutive = BENCHMARKS[cfg.dataset].consecutive and shape_is_standard(cfg)
        shape = BenchmarkShape(base, ways, shots, sessions, consecutive=consecutive)
        train_sessions, split_sums = read_cec_splits(Path(cfg.split_dir), source, shape)
        provenance = {**_config_provenance(cfg), "split_dir": str(cfg.split_dir), "split_files": split_sums}
        return assemble(source, train_sessions, cfg.resolved_image_size, cfg.dataset, provenance, ways, shots)

    return build


def shape_is_standard(cfg: DataConfig) -> bool:
    b = BENCHMARKS[cfg.dataset]
    return cfg.protocol_shape() == (b.base_classes, b.ways, b.shots, b.sessions)


def _seeded_protocol(read: Callable[[DataConfig], SourceDataset]) -> Callable[[DataConfig], PackContent]:
    """Builder for a dataset without official FSCIL splits: the protocol is drawn from the seed."""

    def build(cfg: DataConfig) -> PackContent:
        base, ways, shots, sessions = cfg.protocol_shape()
        source, train_sessions = class_folder_protocol(read(cfg), base, ways, shots, sessions, cfg.test_fraction,
                                                       cfg.seed, cfg.shuffle_classes)
        return assemble(source, train_sessions, cfg.resolved_image_size, cfg.dataset, _config_provenance(cfg),
                        ways, shots)

    return build


BUILDERS: dict[str, Callable[[DataConfig], PackContent]] = {
    "synthetic": _synthetic,
    "cifar100": _with_cec_splits(lambda c: read_cifar100(Path(c.root), c.verify_checksums, c.checksums)),
    "mini_imagenet": _with_cec_splits(
        lambda c: read_mini_imagenet(Path(c.root), Path(c.split_dir), c.verify_checksums, c.checksums)),
    "cub200": _with_cec_splits(lambda c: read_cub200(Path(c.root), c.verify_checksums, c.checksums)),
    "class_folder": _seeded_protocol(lambda c: read_class_folder(Path(c.root))),
    "omniglot": _seeded_protocol(lambda c: read_omniglot(Path(c.root), c.verify_checksums, c.checksums)),
}


def build_pack(cfg: DataConfig, out: Path, check: Callable[[FSCILProtocol], None] | None = None) -> dict[str, Any]:
    """Write the image pack for `cfg` to `out` (atomically) and return a summary of what it holds.

    `check` sees the protocol once it is drawn, before any image is written: what it raises stops the build
    with nothing at `out`.
    """
    start = time.perf_counter()
    content = (_synthetic if cfg.generated else BUILDERS[cfg.dataset])(cfg)
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
