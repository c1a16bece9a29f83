"""`fscil stage extract`: cache the frozen backbone's maps and the base class means in a Zarr store."""

from __future__ import annotations

from pipeline.config import Config
from pipeline.training.extract import extract_stage
from stages.paths import StagePaths


def run(cfg: Config, paths: StagePaths, show_progress: bool = True) -> dict:
    return extract_stage(cfg, paths.pack, paths.base, paths.features, show_progress=show_progress)
