"""`fscil stage base`: train backbone + p_iden + g_base on the base session (eq. optim_base)."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config, check_against_data
from pipeline.data.pack import ImagePack
from pipeline.errors import FSCILError
from pipeline.training.base_session import base_stage
from stages.entry import load_config, main, options, say, show, timed, under_torchrun
from stages.paths import StagePaths


def run(cfg: Config, paths: StagePaths, show_progress: bool = True) -> dict:
    """Writes data/base/{model.safetensors, metrics.json} and data/curves/base.csv; under torchrun only rank 0
    writes."""
    if not paths.pack.is_file():
        raise FSCILError(f"{paths.pack} does not exist; run `fscil stage prepare` first")
    with ImagePack.open(paths.pack) as pack:
        check_against_data(cfg, pack.protocol)
    return base_stage(cfg, paths.pack, paths.base, paths.base_checkpoints, show_progress=show_progress,
                      curve=paths.base_curve)


def command(params: Path, data_dir: Path, overrides: list[str], quiet: bool = False) -> None:
    cfg = load_config(params, overrides)
    under_torchrun(cfg, "base", params, data_dir, overrides, quiet)
    summary = timed("base", run, cfg, StagePaths(data_dir), show_progress=not quiet)
    if summary:  # rank 0's (under torchrun the other processes return none)
        say(f"base: accuracy {summary['acc']:.2f} on the base classes ({summary['epochs']} epochs)")
        show(summary, ("acc", "epochs", "steps", "world_size", "seconds"))


if __name__ == "__main__":
    main(command, options("base", "Train backbone, p_iden and g_base on the base session."))
