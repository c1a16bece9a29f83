"""`fscil stage extract`: cache the frozen backbone's maps and the base class means in a Zarr store."""

from __future__ import annotations

from pipeline.atomic import atomic_output
from pipeline.config import Config
from pipeline.training.extract import extract_features
from stages.paths import StagePaths


def run(cfg: Config, paths: StagePaths, show_progress: bool = True) -> dict:
    with atomic_output(paths.features, directory=True) as tmp:
        return extract_features(cfg, paths.pack, paths.base, tmp, show_progress=show_progress)
