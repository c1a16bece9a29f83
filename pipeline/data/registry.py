"""The dataset registry (pipeline/registry.py): each data.dataset the config accepts, with its reader, the image
preset its pack is stored and augmented with (pipeline/data/presets.py) and its standard protocol. A new reader is
its module with a `build(cfg) -> PackContent` (the readers here are ~100-line examples) plus one line here."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.data.cec_splits import BENCHMARKS
from pipeline.data.presets import CLASS_FOLDER
from pipeline.registry import Registry, load


@dataclass(frozen=True)
class DatasetKind:
    build: str
    """"module:function" of its reader's build(cfg) -> PackContent."""
    preset: str
    """The image preset (`pipeline.data.presets.PRESETS`) of its packs."""
    protocol: tuple[int | None, int, int, int]
    """(base classes, ways, shots, sessions) when data leaves them null; base None: every class the sessions
    leave."""

    def builder(self):
        return load(self.build)


def _cec(build: str, name: str) -> DatasetKind:
    """A benchmark with CEC split files: its standard protocol is its `BENCHMARKS` shape."""
    b = BENCHMARKS[name]
    return DatasetKind(build, name, (b.base_classes, b.ways, b.shots, b.sessions))


DATASETS = Registry("dataset", {
    "synthetic": (DatasetKind("pipeline.data.builders:build_synthetic", "synthetic", (60, 5, 5, 8)),
                  "embedded 32 px shapes drawn from the seed (no download)"),
    "cifar100": (_cec("pipeline.data.cifar100:build", "cifar100"), "CIFAR-100, python version, CEC splits"),
    "mini_imagenet": (_cec("pipeline.data.mini_imagenet:build", "mini_imagenet"), "miniImageNet, CEC splits"),
    "cub200": (_cec("pipeline.data.cub200:build", "cub200"), "CUB-200-2011, CEC splits"),
    CLASS_FOLDER: (DatasetKind("pipeline.data.class_folder:build", CLASS_FOLDER, (None, 5, 5, 8)),
                     "your images in root/<class>/<image>, protocol drawn from the seed"),
    "omniglot": (DatasetKind("pipeline.data.omniglot:build", "omniglot", (60, 5, 5, 8)),
                 "Omniglot zip or folder, 32 px grayscale, protocol drawn from the seed"),
}, lazy=False)
