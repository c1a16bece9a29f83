"""Where each stage reads and writes, relative to one data directory (dvc.yaml uses the defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StagePaths:
    data_dir: Path = Path("data")

    @property
    def run_config(self) -> Path:
        """Every resolved value that runs (written by `fscil stage config`)."""
        return self.data_dir / "config" / "run.yaml"

    def stage_config(self, stage: str) -> Path:
        """The resolved values `stage` reads (pipeline.config.STAGE_KEYS), the file dvc.yaml's stage depends on."""
        return self.data_dir / "config" / f"{stage}.yaml"

    @property
    def pack(self) -> Path:
        return self.data_dir / "pack.h5"

    @property
    def base(self) -> Path:
        return self.data_dir / "base"

    @property
    def base_checkpoints(self) -> Path:
        """Periodic resumable checkpoints of base training (not a DVC output)."""
        return self.data_dir / "base.resume"

    @property
    def features(self) -> Path:
        return self.data_dir / "features.zarr"

    def session(self, session: int) -> Path:
        return self.data_dir / "sessions" / f"session_{session}"

    @property
    def base_curve(self) -> Path:
        """Base training's loss, lr and training accuracy per epoch (a DVC plot, written as it trains)."""
        return self.data_dir / "curves" / "base.csv"

    @property
    def session_curves(self) -> Path:
        """The sessions' loss terms and lr per step: one folder per term group (`session_curve_files`), DVC plots."""
        return self.data_dir / "curves" / "sessions"

    @property
    def report(self) -> Path:
        return self.data_dir / "report"
