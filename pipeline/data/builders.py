"""What the dataset readers' `build` functions share: a reader returns a `SourceDataset`; its benchmark's CEC split
files (`cec_pack`) or a protocol drawn from the seed (`seeded_pack`) make it a pack's content. The synthetic
benchmark is generated whole (`build_synthetic`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.data.assemble import assemble
from pipeline.data.cec_splits import BENCHMARKS, BenchmarkShape, read_cec_splits
from pipeline.data.pack import PackContent
from pipeline.data.registry import DATASETS
from pipeline.data.sampling import seeded_protocol
from pipeline.data.source import SourceDataset
from pipeline.data.synthetic import SyntheticSpec, synthetic_pack_content

if TYPE_CHECKING:  # the data package does not import the config at run time
    from pipeline.config.data_section import DataConfig


def config_provenance(cfg: DataConfig) -> dict[str, Any]:
    return {"config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}}


def build_synthetic(cfg: DataConfig) -> PackContent:
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
    content.provenance.update(config_provenance(cfg))
    return content


def shape_is_standard(cfg: DataConfig) -> bool:
    return cfg.protocol_shape() == DATASETS[cfg.dataset].protocol


def cec_pack(cfg: DataConfig, source: SourceDataset) -> PackContent:
    """A benchmark with official CEC split files (data.split_dir)."""
    base, ways, shots, sessions = cfg.protocol_shape()
    # the CIFAR-100 class-range check only makes sense for the standard protocol's shape
    consecutive = BENCHMARKS[cfg.dataset].consecutive and shape_is_standard(cfg)
    shape = BenchmarkShape(base, ways, shots, sessions, consecutive=consecutive)
    train_sessions, split_sums = read_cec_splits(Path(cfg.split_dir), source, shape)
    provenance = {**config_provenance(cfg), "split_dir": str(cfg.split_dir), "split_files": split_sums}
    return assemble(source, train_sessions, cfg.resolved_image_size, cfg.dataset, provenance, ways, shots)


def seeded_pack(cfg: DataConfig, source: SourceDataset) -> PackContent:
    """A dataset without official FSCIL splits: the protocol is drawn from the seed."""
    base, ways, shots, sessions = cfg.protocol_shape()
    source, train_sessions = seeded_protocol(source, base, ways, shots, sessions, cfg.test_fraction, cfg.seed,
                                             cfg.shuffle_classes)
    return assemble(source, train_sessions, cfg.resolved_image_size, cfg.dataset, config_provenance(cfg), ways, shots)
