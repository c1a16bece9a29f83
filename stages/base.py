"""`fscil stage base`: train backbone + p_iden + g_base on the base session (eq. optim_base)."""

from __future__ import annotations

from pipeline.config import Config, check_against_data
from pipeline.data.pack import ImagePack
from pipeline.errors import FSCILError
from pipeline.training.base_session import base_stage
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
