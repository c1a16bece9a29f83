"""`fscil stage base`: train backbone + p_iden + g_base on the base session (eq. optim_base)."""

from __future__ import annotations

import os
import shutil

from pipeline.atomic import atomic_output
from pipeline.config import Config, check_against_data
from pipeline.data.pack import ImagePack
from pipeline.errors import FSCILError
from pipeline.training.base_session import train_base
from stages.paths import StagePaths


def run(cfg: Config, paths: StagePaths, show_progress: bool = True) -> dict:
    """Writes data/base/{model.safetensors, metrics.json}; under torchrun only rank 0 writes."""
    if not paths.pack.is_file():
        raise FSCILError(f"{paths.pack} does not exist; run `fscil stage prepare` first")
    with ImagePack.open(paths.pack) as pack:
        check_against_data(cfg, pack.protocol)
    if int(os.environ.get("RANK", "0")) != 0:
        return train_base(cfg, paths.pack, None, paths.base_checkpoints, show_progress=False)
    with atomic_output(paths.base, directory=True) as tmp:
        result = train_base(cfg, paths.pack, tmp, paths.base_checkpoints, show_progress=show_progress)
    shutil.rmtree(paths.base_checkpoints, ignore_errors=True)  # finished: nothing left to resume
    return result
