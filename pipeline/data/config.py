"""`DataConfig`: the `data:` section of params.yaml, read by the prepare stage.

`DataConfig.from_dict` rejects unknown keys and mistyped values with an FSCILError naming the key; a
null value means "use the default". Protocol sizes left null take the benchmark's standard values
(`protocol_shape`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from pipeline.data.cec_splits import BENCHMARKS
from pipeline.data.checksums import digest_algorithm
from pipeline.data.presets import PRESETS
from pipeline.data.synthetic import COLOURS, SHAPES, TEXTURES
from pipeline.config_fields import SectionConfig, fail
from pipeline.errors import FSCILError

DATASETS = ("synthetic", "cifar100", "mini_imagenet", "cub200", "class_folder", "omniglot")
CEC_DATASETS = tuple(BENCHMARKS)
# (base_classes, ways, shots, sessions) when left null; class_folder's base None = all remaining classes
_DEFAULT_SHAPE = {
    "synthetic": (60, 5, 5, 8),
    "class_folder": (None, 5, 5, 8),
    "omniglot": (60, 5, 5, 8),
    **{name: (b.base_classes, b.ways, b.shots, b.sessions) for name, b in BENCHMARKS.items()},
}
MAX_SYNTHETIC_CLASSES = len(SHAPES) * len(COLOURS) * len(TEXTURES)


def _fail(key: str, why: str) -> typing.NoReturn:
    fail("data", key, why)


@dataclass
class DataConfig(SectionConfig):
    """Which dataset to pack, from where, at which resolution, and (for generated protocols) how."""

    section: typing.ClassVar[str] = "data"

    dataset: str = "synthetic"
    """synthetic | cifar100 | mini_imagenet | cub200 | class_folder | omniglot."""
    root: str | None = None
    """Raw data folder (cifar100: holds cifar-100-python/; mini_imagenet: images/ + split/; cub200: CUB_200_2011;
    class_folder: root/<class>/<image>; omniglot: an official zip or its extracted folder). Unused for synthetic."""
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
    train_per_class: int = 100
    """synthetic: training images per base class."""
    novel_pool_per_class: int = 20
    """synthetic: images generated per incremental class, from which `shots` are drawn."""
    test_per_class: int = 40
    """synthetic: test images per class."""
    seed: int = 0
    """Seed of the synthetic images and of generated protocols."""

    def __post_init__(self) -> None:
        self.check_types()
        if self.dataset not in DATASETS:
            _fail("dataset", f"must be one of {', '.join(DATASETS)}, got {self.dataset!r}")
        if self.dataset != "synthetic" and not self.root:
            _fail("root", f"is required for dataset {self.dataset!r}")
        if self.dataset in CEC_DATASETS and not self.split_dir:
            _fail("split_dir", f"is required for dataset {self.dataset!r} (the CEC index-list folder)")
        if self.image_size is not None and self.image_size < 8:
            _fail("image_size", f"must be >= 8, got {self.image_size}")
        for key in ("base_classes", "ways", "shots", "sessions"):
            value = getattr(self, key)
            if value is not None and value < 1:
                _fail(key, f"must be >= 1, got {value}")
        for key in ("train_per_class", "test_per_class", "novel_pool_per_class"):
            if getattr(self, key) < 1:
                _fail(key, f"must be >= 1, got {getattr(self, key)}")
        if not 0.0 < self.test_fraction < 1.0:
            _fail("test_fraction", f"must be strictly between 0 and 1, got {self.test_fraction}")
        if self.seed < 0:
            _fail("seed", f"must be >= 0, got {self.seed}")
        for rel, digest in (self.checksums or {}).items():
            try:
                digest_algorithm(digest)
            except FSCILError:
                _fail(f"checksums.{rel}", f"must be a hex md5 or sha256, got {digest!r}")
        base, ways, shots, sessions = self.protocol_shape()
        if self.dataset == "synthetic":
            if base + ways * sessions > MAX_SYNTHETIC_CLASSES:
                _fail("base_classes", f"+ ways x sessions must be <= {MAX_SYNTHETIC_CLASSES} for synthetic, "
                      f"got {base + ways * sessions}")
            if self.novel_pool_per_class < shots:
                _fail("novel_pool_per_class", f"must be >= shots ({shots}), got {self.novel_pool_per_class}")

    def protocol_shape(self) -> tuple[int | None, int, int, int]:
        """(base_classes, ways, shots, sessions) with nulls filled from the dataset's standard protocol."""
        defaults = _DEFAULT_SHAPE[self.dataset]
        given = (self.base_classes, self.ways, self.shots, self.sessions)
        return tuple(d if g is None else g for g, d in zip(given, defaults, strict=True))  # type: ignore[return-value]

    @property
    def resolved_image_size(self) -> int:
        return self.image_size if self.image_size is not None else PRESETS[self.dataset].image_size
