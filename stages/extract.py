"""`fscil stage extract`: cache the frozen backbone's maps and the base class means in a Zarr store."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config
from pipeline.training.extract import extract_stage
from stages.entry import load_config, main, options, show, timed, under_torchrun
from stages.paths import StagePaths


def run(cfg: Config, paths: StagePaths, show_progress: bool = True) -> dict:
    return extract_stage(cfg, paths.pack, paths.base, paths.features, show_progress=show_progress)


def command(params: Path, data_dir: Path, overrides: list[str], quiet: bool = False) -> None:
    cfg = load_config(params, overrides)
    under_torchrun(cfg, "extract", params, data_dir, overrides, quiet)
    summary = timed("extract", run, cfg, StagePaths(data_dir), show_progress=not quiet)
    if summary:  # rank 0's (under torchrun the other processes return none)
        show(summary, ("test", "fewshot", "base_classes", "map_shape", "seconds"))


if __name__ == "__main__":
    main(command, options("extract", "Cache the frozen backbone's maps in data/features.zarr."))
