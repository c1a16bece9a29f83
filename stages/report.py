"""`fscil stage report`: per-session table, metrics.json (DVC metrics) and the pictures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.errors import FSCILError
from pipeline.report import ARRAYS_FILE, write_report
from stages.paths import StagePaths


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FSCILError(f"{path}: not found; run the stage that writes it first") from None
    except json.JSONDecodeError:
        raise FSCILError(f"{path}: not valid JSON") from None


def run(paths: StagePaths, metrics_path: Path) -> dict:
    """Collect session 0 (the base stage) and every incremental session of the protocol; all must be done."""
    base = _read(paths.base / "metrics.json")
    results = [base] + [_read(paths.session(s) / "metrics.json") for s in range(1, int(base["num_sessions"]))]
    title = f"Mamba-FSCIL: {base.get('projector', '?')} projector, {base.get('preset', '?')} preset"
    last = paths.session(int(base["num_sessions"]) - 1) / ARRAYS_FILE
    arrays = dict(np.load(last)) if last.is_file() else None
    return write_report(results, metrics_path, paths.report, title, arrays)
