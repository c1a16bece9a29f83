"""Training curves as DVC plots: base training's loss, lr and training accuracy per epoch, and each session's loss
terms and lr per step, as CSV files that `dvc plots show` / `dvc plots diff` draw (dvc.yaml `plots:`).

A curve is a log, rewritten whole as training goes (each base epoch, each read-back of a session's losses), so that
VS Code's DVC extension draws it live during `dvc exp run`; it holds what the run computed, never a wall time, so a
rerun writes the same bytes.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from pipeline.atomic import atomic_write_text

BASE_COLUMNS = ("epoch", "loss", "lr", "train_acc")
SESSION_COLUMNS = ("step", "loss", "cls", "supp", "sep", "lr")


def write_curve(path: Path | None, columns: tuple[str, ...], rows: list[dict]) -> None:
    """`rows` (dicts keyed by `columns`) as CSV at `path` (None: no curve, e.g. a selection's runs)."""
    if path is None:
        return
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: row[k] for k in columns} for row in rows)
    atomic_write_text(path, out.getvalue())
