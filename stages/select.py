"""`fscil select`: the paper's pseudo-incremental selection of architecture and loss weights (not a DVC stage).

Reads data/pack.h5 and the `selection` params section; writes <out>/{selection.csv, selected.yaml, selection.json}
atomically. <out>.work keeps the pseudo pack, the candidates' base models and feature stores and their results, so
an interrupted or extended selection recomputes nothing; delete it to start over.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline.atomic import atomic_output, claim_folder
from pipeline.config import Config
from pipeline.errors import FSCILError
from pipeline.research.selection import select
from pipeline.research.selection_config import SelectionConfig
from stages.paths import StagePaths


def run(cfg: Config, candidates: SelectionConfig, paths: StagePaths, out_dir: Path,
        log: Callable[[str], None] | None = None, reuse_stale: bool = False, jobs: int = 1) -> dict:
    out_dir = claim_folder(out_dir, "fscil select")
    if not paths.pack.is_file():
        raise FSCILError(f"{paths.pack}: image pack not found; run `fscil stage prepare` first")
    with atomic_output(out_dir, directory=True, owner="fscil select") as tmp:
        return select(cfg, paths.pack, tmp, candidates, work_dir=out_dir.parent / f"{out_dir.name}.work", log=log,
                      reuse_stale=reuse_stale, jobs=jobs)
