"""`fscil compare`: the rows of `dvc exp show` side by side, only what differs between them, with their metrics;
`fscil show`: a run's per-session table (data/report/sessions.csv) as the workspace, a commit or an experiment has it.

`dvc exp show` lists every resolved value (data/config/run.yaml, tracked by git like metrics.json) and every metric:
hundreds of columns. Comparing two variants means finding the few that differ; this does it: the resolved params
whose values differ between the chosen rows, then the headline metrics (or those asked for).
"""

from __future__ import annotations

import fnmatch
import io
import subprocess
from pathlib import Path

import pandas as pd

from pipeline.errors import FSCILError
from pipeline.report import prototype_columns, summarise, summarise_prototypes

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


UNFINISHED = ("Running", "Queued", "Failed")  # dvc exp show's State of rows without results of their own


def finished_rows(table: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """The rows with results of their own, and {name: state} of those left out (an experiment still running shows
    the workspace's metrics under its name)."""
    state = table["State"] if "State" in table.columns else pd.Series("", index=table.index)
    unfinished = state.isin(UNFINISHED)
    return table[~unfinished], {name: s.lower() for name, s in state[unfinished].items()}


def described(rows: dict[str, str]) -> str:
    """'name (state), ...' of `finished_rows`' left-out rows."""
    return ", ".join(f"{name} ({state})" for name, state in rows.items())


def metric_columns(table: pd.DataFrame, patterns: tuple[str, ...]) -> list[str]:
    """The metrics.json columns that `patterns` name (exact keys, or shell patterns such as 'sessions.*'); a pattern
    that names none is a one-line error listing the keys."""
    metrics = [c for c in table.columns if _is_metric(c)]
    chosen: list[str] = []
    for pattern in patterns:
        found = [c for c in metrics if fnmatch.fnmatchcase(c, pattern)]
        if not found:
            top = list(dict.fromkeys(c.split(".")[0] + (".*" if "." in c else "") for c in metrics
                                     if not c.startswith("metrics.json:")))
            raise FSCILError(f"-m {pattern}: no such metric (metrics.json has {', '.join(top)})")
        chosen += [c for c in found if c not in chosen]
    return chosen


def compare(csv_text: str, rows: list[str] | None = None, metrics: tuple[str, ...] = HEADLINE
            ) -> tuple[pd.DataFrame, dict[str, str]]:
    """A table with one column per chosen row (all finished rows when `rows` is empty) and, as its rows, the
    resolved params that differ between them, then `metrics` (keys or shell patterns); and the rows left out as
    unfinished. Deps (file hashes) and DVC's bookkeeping columns are left out; a name that matches no row, or an
    unfinished one, is a one-line error."""
    table = pd.read_csv(io.StringIO(csv_text), dtype=str, keep_default_na=False)
    if table.empty:
        raise FSCILError("dvc exp show listed no rows (run `dvc repro` or `dvc exp run` first)")
    table.index = row_names(table)
    table, unfinished = finished_rows(table)
    if rows:
        missing = [r for r in rows if r not in table.index]
        if missing:
            pending = {name: state for name, state in unfinished.items() if name in missing}
            raise FSCILError(f"no results for {described(pending)} yet" if pending else
                             f"no row named {', '.join(missing)} in dvc exp show (rows: {', '.join(table.index)})")
        table = table.loc[rows]
    chosen = metric_columns(table, metrics)
    params = [c for c in table.columns if c not in _ROW_COLUMNS and c not in chosen and not _is_dep(c)
              and not _is_metric(c)]
    differing = [c for c in params if table[c].nunique() > 1]
    out = table[differing + chosen].T
    out.index = [c.split(":", 1)[1] if c.startswith("data/config/run.yaml:") else c for c in out.index]
    return out, unfinished


def _is_dep(column: str) -> bool:
    """A dependency's hash column (a file or folder path); params columns of a named file hold a ':'."""
    return ":" not in column and ("/" in column or column.endswith((".py", ".yaml", ".h5", ".json")))


def _is_metric(column: str) -> bool:
    """metrics.json's keys (summary values, per-session accuracies, prototype baselines, identity echoes)."""
    return column.startswith(("sessions.", "prototype.", "metrics.json:", "final_")) or column in (
        "avg", "pd", "final", "base")


SESSIONS_CSV = "data/report/sessions.csv"
SHOW_COLUMNS = (("session", "session"), ("num_seen_classes", "classes"), ("acc", "seen"), ("base_acc", "base"),
                ("novel_acc", "novel"), (prototype_columns("backbone")["acc"], "class means"))


def _git(*args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise FSCILError("git is not on PATH") from None


def sessions_at(row: str) -> tuple[str, str]:
    """(sessions.csv's text, where it came from) for `row`: workspace (the file as it is), a commit or branch, or an
    experiment's name (its ref under refs/exps). A running experiment has no results yet: one-line error."""
    if row == "workspace":
        path = Path(SESSIONS_CSV)
        if not path.is_file():
            raise FSCILError(f"{SESSIONS_CSV}: not found here; run `dvc repro` (or `fscil stage report`) from the "
                             "repository's root")
        return path.read_text(), SESSIONS_CSV
    refs = _git("for-each-ref", "--format=%(refname)", "refs/exps").stdout.split()
    named = [r for r in refs if r.rsplit("/", 1)[-1] == row]
    rev = named[0] if named else row
    done = _git("show", f"{rev}:{SESSIONS_CSV}")
    if done.returncode != 0:
        if _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").returncode != 0:
            raise FSCILError(f"{row}: no such commit, branch or finished experiment (`dvc exp show` lists them; a "
                             "running one has no results yet)")
        raise FSCILError(f"{row}: holds no {SESSIONS_CSV} (a run before the report stage?)")
    return done.stdout, f"{row}:{SESSIONS_CSV}"


def run_table(text: str) -> tuple[str, pd.DataFrame, dict[str, float]]:
    """(the run's name, seen / base / novel accuracy and the class-means baseline per session, AVG / PD / final of
    the method and of the class means, as the report stage computes them) from sessions.csv's text."""
    table = pd.read_csv(io.StringIO(text))
    missing = [c for c, _ in SHOW_COLUMNS if c not in table.columns]
    if missing or table.empty:
        raise FSCILError(f"sessions.csv lacks {', '.join(missing) or 'rows'}; rerun `fscil stage report`")
    first = table.iloc[0]
    name = f"{first['method']}, seed {first['seed']}" if {"method", "seed"} <= set(table.columns) else "run"
    method, means = summarise(table), summarise_prototypes(table).get("backbone", {})
    summary = {"AVG": method["avg"], "PD": method["pd"], "final": method["final"],
               **({"class means AVG": means["avg"], "class means final": means["final"]} if means else {})}
    shown = table[[c for c, _ in SHOW_COLUMNS]].rename(columns=dict(SHOW_COLUMNS))
    return name, shown, summary


def show_text(text: str, source: str) -> str:
    name, shown, summary = run_table(text)
    body = shown.to_string(index=False, na_rep="-", float_format=lambda v: f"{v:.2f}")
    line = "  ".join(f"{k} {v:.2f}" for k, v in summary.items())
    return f"{name}  ({source})\n{body}\n{line}"
