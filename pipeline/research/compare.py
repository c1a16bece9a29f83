"""`fscil compare`: the rows of `dvc exp show` side by side, only what differs between them, with their metrics.

`dvc exp show` lists every resolved value (data/config/run.yaml, tracked by git like metrics.json) and every metric:
hundreds of columns. Comparing two variants means finding the few that differ; this does it: the resolved params
whose values differ between the chosen rows, then the headline metrics (or those asked for).
"""

from __future__ import annotations

import io
import subprocess

import pandas as pd

from pipeline.errors import FSCILError

HEADLINE = ("avg", "pd", "final", "base", "prototype.backbone.avg")  # metrics.json keys shown by default
_ROW_COLUMNS = ("Experiment", "rev", "typ", "Created", "parent", "State", "Executor")


def exp_show_csv(all_commits: bool = False) -> str:
    """`dvc exp show --csv` of the repository in the working directory (one-line error when DVC fails)."""
    cmd = ["dvc", "exp", "show", "--csv", *(["--all-commits"] if all_commits else [])]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise FSCILError("dvc is not on PATH (source .venv/bin/activate, or run `make install`)") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise FSCILError(f"dvc exp show failed: {last}")
    return done.stdout


def row_names(table: pd.DataFrame) -> pd.Series:
    """Each row's name: the experiment's name, else its rev (workspace, a branch, a commit)."""
    names = table["Experiment"].fillna("").astype(str)
    return names.where(names != "", table["rev"].astype(str))


def compare(csv_text: str, rows: list[str] | None = None, metrics: tuple[str, ...] = HEADLINE) -> pd.DataFrame:
    """A table with one column per chosen row (all rows when `rows` is empty) and, as its rows, the resolved
    params that differ between them, then `metrics`. Deps (file hashes) and DVC's bookkeeping columns are left out;
    a name that matches no row is a one-line error."""
    table = pd.read_csv(io.StringIO(csv_text), dtype=str, keep_default_na=False)
    if table.empty:
        raise FSCILError("dvc exp show listed no rows (run `dvc repro` or `dvc exp run` first)")
    table.index = row_names(table)
    if rows:
        missing = [r for r in rows if r not in table.index]
        if missing:
            raise FSCILError(f"no row named {', '.join(missing)} in dvc exp show (rows: {', '.join(table.index)})")
        table = table.loc[rows]
    metric_columns = [m for m in metrics if m in table.columns]
    params = [c for c in table.columns if c not in _ROW_COLUMNS and c not in metric_columns and not _is_dep(c)
              and not _is_metric(c)]
    differing = [c for c in params if table[c].nunique() > 1]
    out = table[differing + metric_columns].T
    out.index = [c.split(":", 1)[1] if c.startswith("data/config/run.yaml:") else c for c in out.index]
    return out


def _is_dep(column: str) -> bool:
    """A dependency's hash column (a file or folder path); params columns of a named file hold a ':'."""
    return ":" not in column and ("/" in column or column.endswith((".py", ".yaml", ".h5", ".json")))


def _is_metric(column: str) -> bool:
    """metrics.json's keys (summary values, per-session accuracies, prototype baselines, identity echoes)."""
    return column.startswith(("sessions.", "prototype.", "metrics.json:", "final_")) or column in (
        "avg", "pd", "final", "base")
