"""The params.yaml `data` section (stage prepare): which dataset to pack, from where, at which resolution, and how
generated protocols are drawn. The other sections: pipeline/config/sections.py."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from pipeline.config.fields import SectionConfig, choice, fail
from pipeline.data.cec_splits import BENCHMARKS
from pipeline.data.checksums import digest_algorithm
from pipeline.data.presets import PRESETS
from pipeline.data.registry import DATASETS
from pipeline.data.synthetic import SyntheticSpec, class_count_error
from pipeline.errors import FSCILError

CEC_DATASETS = tuple(BENCHMARKS)


def _fail_data(key: str, why: str) -> typing.NoReturn:
    fail("data", key, why)


@dataclass
class DataConfig(SectionConfig):
    """Which dataset to pack, from where, at which resolution, and (for generated protocols) how."""

    section: typing.ClassVar[str] = "data"

    dataset: str = choice("synthetic", DATASETS)
    """The dataset (its reader, image preset and standard protocol: pipeline/data/registry.py)."""
    source: str = "files"
    """files (read from data.root), or synthetic: a paper benchmark's shape drawn by the generator, for timing
    without its dataset (README "Paper presets on GPUs"; its accuracy means nothing)."""
    root: str | None = None
    """The raw data: a folder, or Omniglot's zip (README "Your data" says what each dataset expects there)."""
    split_dir: str | None = None
    """CEC index-list folder of this dataset (session_1.txt ...); required for cifar100, mini_imagenet, cub200."""
    image_size: int | None = None
    """Stored image side in pixels (null: the preset's, 32 / 84 / 224 / 84 for class_folder / 32 for omniglot)."""
    verify_checksums: bool = True
    """Check source files: CIFAR-100's official md5 sums, plus every entry of `checksums`."""
    checksums: dict[str, str] | None = None
    """Extra expected digests {path relative to root: hex md5 or sha256}."""
    base_classes: int | None = None
    """Number of base classes (null: the benchmark's; class_folder: every class not used by the sessions)."""
    ways: int | None = None
    """Classes per incremental session (null: the benchmark's)."""
    shots: int | None = None
    """Training images per class in incremental sessions (null: the benchmark's)."""
    sessions: int | None = None
    """Number of incremental sessions (null: the benchmark's)."""
    test_fraction: float = 0.2
    """class_folder, omniglot: fraction of each class's images held out for testing (at least one)."""
    shuffle_classes: bool = True
    """class_folder, omniglot: seeded class order (else sorted by name) decides which classes are base."""
    train_per_class: int | None = None
    """Generated data: training images per base class (null: 100 for synthetic; source synthetic: the benchmark's)."""
    novel_pool_per_class: int | None = None
    """Generated data: images per incremental class, from which `shots` are drawn (null: 20 for synthetic; source
    synthetic: the benchmark's training images per class)."""
    test_per_class: int | None = None
    """Generated data: test images per class (null: 40 for synthetic; source synthetic: the benchmark's)."""
    seed: int = 0
    """Seed of the synthetic images and of generated protocols."""
    novel_shapes: int = SyntheticSpec.novel_shapes
    """synthetic: 0 (every class a mix of the six base shape families), or 1-4 shape families that only the
    incremental classes use (18 classes a family)."""

    def __post_init__(self) -> None:
        self.check_types()
        if self.source not in ("files", "synthetic"):
            _fail_data("source", f"must be files or synthetic, got {self.source!r}")
        if self.source == "synthetic" and self.dataset not in CEC_DATASETS:
            _fail_data("source", f"synthetic applies to {', '.join(CEC_DATASETS)}, got dataset {self.dataset!r}")
        if not self.generated and not self.root:
            _fail_data("root", f"is required for dataset {self.dataset!r}")
        if self.dataset in CEC_DATASETS and not self.generated and not self.split_dir:
            _fail_data("split_dir", f"is required for dataset {self.dataset!r} (the CEC index-list folder)")
        if self.image_size is not None and self.image_size < 8:
            _fail_data("image_size", f"must be >= 8, got {self.image_size}")
        for key in ("base_classes", "ways", "shots", "sessions", "train_per_class", "test_per_class",
                    "novel_pool_per_class"):
            value = getattr(self, key)
            if value is not None and value < 1:
                _fail_data(key, f"must be >= 1, got {value}")
        if not 0.0 < self.test_fraction < 1.0:
            _fail_data("test_fraction", f"must be strictly between 0 and 1, got {self.test_fraction}")
        if self.seed < 0:
            _fail_data("seed", f"must be >= 0, got {self.seed}")
        for rel, digest in (self.checksums or {}).items():
            try:
                digest_algorithm(digest)
            except FSCILError:
                _fail_data(f"checksums.{rel}", f"must be a hex md5 or sha256, got {digest!r}")
        base, ways, shots, sessions = self.protocol_shape()
        if self.novel_shapes and self.dataset != "synthetic":
            _fail_data("novel_shapes", f"applies to dataset synthetic only, got dataset {self.dataset!r}")
        if self.generated:
            error = class_count_error(base, ways * sessions, self.novel_shapes)
            if error is not None:
                _fail_data(*error)
            if (pool := self.generated_counts()[1]) < shots:
                _fail_data("novel_pool_per_class", f"must be >= shots ({shots}), got {pool}")

    @property
    def generated(self) -> bool:
        """Whether the images come from the synthetic generator (dataset synthetic, or source synthetic)."""
        return self.dataset == "synthetic" or self.source == "synthetic"

    def generated_counts(self) -> tuple[int, int, int]:
        """(train_per_class, novel_pool_per_class, test_per_class) of generated data, nulls filled in: the synthetic
        benchmark's, or with source synthetic the benchmark's own counts."""
        if self.dataset == "synthetic":
            defaults = (SyntheticSpec.train_per_class, SyntheticSpec.novel_pool_per_class, SyntheticSpec.test_per_class)
        else:
            b = BENCHMARKS[self.dataset]
            defaults = (b.train_per_class, b.train_per_class, b.test_per_class)
        given = (self.train_per_class, self.novel_pool_per_class, self.test_per_class)
        return tuple(d if g is None else g for g, d in zip(given, defaults, strict=True))  # type: ignore[return-value]

    def protocol_shape(self) -> tuple[int | None, int, int, int]:
        """(base_classes, ways, shots, sessions) with nulls filled from the dataset's standard protocol."""
        defaults = DATASETS[self.dataset].protocol
        given = (self.base_classes, self.ways, self.shots, self.sessions)
        return tuple(d if g is None else g for g, d in zip(given, defaults, strict=True))  # type: ignore[return-value]

    @property
    def resolved_image_size(self) -> int:
        return self.image_size if self.image_size is not None else PRESETS[DATASETS[self.dataset].preset].image_size
