"""Training curves as DVC plots: base training's loss, lr and training accuracy per epoch, and each session's loss
terms and lr per step, as CSV files that `dvc plots show` / `dvc plots diff` draw (dvc.yaml `plots:`). A session's
terms are three files, one folder each, so that DVC draws each on its own axis: the loss and its classification
term (and the lr, not drawn), the suppression term (~1e-4 under the default) and the separation term (0 there).

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
SESSION_CURVES = {"loss": ("step", "loss", "cls", "lr"), "suppression": ("step", "supp"), "separation": ("step", "sep")}
"""{folder under data/curves/sessions/: the columns of its session_N.csv}."""


def write_curve(path: Path | None, columns: tuple[str, ...], rows: list[dict]) -> None:
    """`rows` (dicts keyed by `columns`) as CSV at `path` (None: no curve, e.g. a selection's runs)."""
    if path is None:
        return
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: row[k] for k in columns} for row in rows)
    atomic_write_text(path, out.getvalue())


def session_curve_files(folder: Path, session: int) -> dict[str, Path]:
    """{term group: folder/<group>/session_N.csv} of session N."""
    return {group: Path(folder) / group / f"session_{session}.csv" for group in SESSION_CURVES}


def write_session_curves(paths: dict[str, Path] | None, rows: list[dict]) -> None:
    """`rows` (keyed by SESSION_COLUMNS) split into the SESSION_CURVES files `paths` ({folder: file}; None: none)."""
    for group, columns in SESSION_CURVES.items():
        write_curve(None if paths is None else paths[group], columns, rows)
