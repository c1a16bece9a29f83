"""`fscil compare`: the rows of `dvc exp show` side by side, only what differs between them, with their metrics, or,
when a setting ran with several seeds, each setting's mean +- SE over its seeds and two settings' paired difference
(pipeline/research/seeds.py); `fscil show`: a run's per-session table (data/report/sessions.csv) as the workspace, a
commit or an experiment has it.

`dvc exp show` lists params.yaml's keys and the headline metrics (metrics.json); every resolved value that ran is in
each row's data/config/run.yaml (tracked by git like metrics.json). Comparing two variants means finding the few
values that differ: the params, then the resolved values (a variant's or preset's own). Metrics beyond the headline
(per session, per baseline) come from each row's data/report/details.json.
"""

from __future__ import annotations

import fnmatch
import io
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from pipeline.errors import FSCILError
from pipeline.report import DETAILS_FILE, HEADLINE, prototype_columns, standing, summarise, summarise_prototypes
from pipeline.research.queue import run_dvc
from pipeline.research.seeds import SEED, by_setting, has_repeated_settings, paired, setting_labels, vs_own_class_means

_ROW_COLUMNS = ("Experiment", "rev", "typ", "Created", "parent", "State", "Executor")
DETAILS = f"data/report/{DETAILS_FILE}"
RUN_YAML = "data/config/run.yaml"


def exp_show_csv(all_commits: bool = False) -> str:
    """`dvc exp show --csv` of the repository in the working directory (one-line error when DVC fails)."""
    return run_dvc(["exp", "show", "--csv", *(["--all-commits"] if all_commits else [])])


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


def finished_names(csv_text: str) -> set[str]:
    """The names of the rows of `dvc exp show --csv` that have results of their own."""
    table = pd.read_csv(io.StringIO(csv_text), dtype=str, keep_default_na=False)
    if table.empty:
        return set()
    table.index = row_names(table)
    return set(finished_rows(table)[0].index)


def described(rows: dict[str, str]) -> str:
    """'name (state), ...' of `finished_rows`' left-out rows."""
    return ", ".join(f"{name} ({state})" for name, state in rows.items())


def flat_values(values: dict, prefix: str = "") -> dict:
    """{'sessions.s1': 68.7, 'model.projector': 'dual_ssm', ...}: a nested dict's leaves under dotted keys."""
    out: dict = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_values(value, f"{name}."))
        else:
            out[name] = value
    return out


def flat_numbers(values: dict) -> dict[str, float]:
    """`flat_values`' numbers (a metrics dict without its text)."""
    return {k: v for k, v in flat_values(values).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def metric_columns(table: pd.DataFrame, patterns: tuple[str, ...],
                   details: dict[str, dict[str, float]] | None = None) -> tuple[list[str], list[str]]:
    """(the exp show metric columns, the details.json keys) that `patterns` name (exact keys, or shell patterns such
    as 'sessions.*'): metrics.json's first, then each row's details (`details`: row -> `flat_numbers`, None: none);
    a pattern that names neither is a one-line error listing the keys."""
    metrics = [c for c in table.columns if _is_metric(c)]
    detail_keys = list(dict.fromkeys(k for values in (details or {}).values() for k in values))
    chosen: list[str] = []
    extra: list[str] = []
    for pattern in patterns:
        found = [c for c in metrics if fnmatch.fnmatchcase(c, pattern)]
        if found:
            chosen += [c for c in found if c not in chosen]
            continue
        more = [k for k in detail_keys if fnmatch.fnmatchcase(k, pattern)]
        if not more:
            raise FSCILError(f"-m {pattern}: no such metric (metrics.json has {_keys(metrics)}"
                             + (f"; {DETAILS} has {_keys(detail_keys)})" if detail_keys else ")"))
        extra += [k for k in more if k not in extra]
    return chosen, extra


def _keys(columns: list[str]) -> str:
    return ", ".join(dict.fromkeys(c.split(".")[0] + (".*" if "." in c else "") for c in columns
                                   if not c.startswith("metrics.json:")))


def compare(csv_text: str, rows: list[str] | None = None, metrics: tuple[str, ...] = HEADLINE,
            details: Callable[[str], dict] | None = None, resolved: Callable[[str], dict] | None = None
            ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
    """(params, metrics, unfinished): for the chosen rows (all finished rows when `rows` is empty), one row per run,
    the params that differ between them (params.yaml's, as `dvc exp show` lists them, and seed, when there is one;
    then the resolved values of `resolved`(row name), a row's run.yaml, that differ too) and the chosen `metrics`
    (keys or shell patterns; one that metrics.json lacks is read from `details`(row name), the row's details.json);
    and the rows left out as unfinished. Deps (file hashes) and DVC's bookkeeping columns are left out; a name that
    matches no row, or an unfinished one, is a one-line error."""
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
    exp_metrics = [c for c in table.columns if _is_metric(c)]
    needs_details = any(not any(fnmatch.fnmatchcase(c, p) for c in exp_metrics) for p in metrics)
    loaded = ({row: flat_numbers(details(row)) for row in table.index} if details is not None and needs_details
              else None)
    chosen, extra = metric_columns(table, metrics, loaded)
    params = [c for c in table.columns if c not in _ROW_COLUMNS and not _is_dep(c) and not _is_metric(c)]
    differing = [c for c in params if table[c].nunique() > 1 or _param_name(c) == SEED]
    out_params = table[differing].rename(columns=_param_name)
    if resolved is not None:
        values = pd.DataFrame([flat_values(resolved(row)) for row in table.index], index=table.index).astype(str)
        more = [c for c in values.columns if c not in out_params.columns and values[c].nunique() > 1]
        out_params = pd.concat([out_params, values[more]], axis=1)
        out_params.attrs["resolved"] = more  # shown, but no part of a setting (data.seed follows seed)
    out_metrics = table[chosen].apply(pd.to_numeric, errors="coerce")
    for key in extra:
        out_metrics[key] = [loaded[row].get(key) for row in table.index]
    return out_params, out_metrics, unfinished


def compare_text(params: pd.DataFrame, metrics: pd.DataFrame) -> str:
    """Side by side (one column per run: the params that differ, then the metrics) when no setting ran with more
    than one seed; else grouped over seeds: each setting (its params.yaml keys; resolved values only follow them)
    with its mean +- SE over its seeds, and for two settings their paired difference (pipeline/research/seeds.py)."""
    own = params[[c for c in params.columns if c not in params.attrs.get("resolved", [])]]  # params.yaml's keys
    if not has_repeated_settings(own):
        shown = params.drop(columns=[SEED]) if SEED in params and params[SEED].nunique() < 2 else params
        side = pd.concat([shown.astype(object), metrics.astype(object)], axis=1).T
        side.columns.name = None
        return side.to_string()
    settings = setting_labels(own)
    text = by_setting(settings, own[SEED], metrics).to_string()
    own_means = vs_own_class_means(settings, metrics)
    if own_means:
        width = max(map(len, own_means))
        text += "\n\nAVG minus the class means of each run's own backbone, paired by seed:\n" + "\n".join(
            f"{setting:<{width}}  {cell}" for setting, cell in own_means.items())
    names = list(dict.fromkeys(settings))
    if len(names) == 2:
        a, b = names
        lines = [p.line() for p in paired(settings, own[SEED], metrics, a, b)]
        text += f"\n\npaired over the seeds both ran, ({b}) minus ({a}):\n" + "\n".join(lines)
    return text


def details_at(row: str) -> dict:
    """A row's data/report/details.json (workspace, a commit or branch, or an experiment's name)."""
    text, _ = file_at(row, DETAILS)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise FSCILError(f"{row}: {DETAILS} is not valid JSON") from None


def resolved_at(row: str) -> dict:
    """A row's data/config/run.yaml (every resolved value that ran); empty when the row has none."""
    import yaml

    try:
        return yaml.safe_load(file_at(row, RUN_YAML)[0]) or {}
    except FSCILError:
        return {}


def _param_name(column: str) -> str:
    """A param's key (a column carries its file's name when another params file has the key too)."""
    return column.split(":", 1)[1] if column.startswith(("params.yaml:", "data/config/run.yaml:")) else column


def _is_dep(column: str) -> bool:
    """A dependency's hash column (a file or folder path); params columns of a named file hold a ':'."""
    return ":" not in column and ("/" in column or column.endswith((".py", ".yaml", ".h5", ".json")))


def _is_metric(column: str) -> bool:
    """metrics.json's keys (the headline; older commits' layout: per-session accuracies, prototype baselines,
    crossings and identity echoes)."""
    return (column in HEADLINE or bool(re.fullmatch(r"sessions\.s\d+", column))  # params.yaml has sessions.1, ...
            or column.startswith(("prototype.", "metrics.json:", "final_")))


SESSIONS_CSV = "data/report/sessions.csv"
SHOW_COLUMNS = (("session", "session"), ("num_seen_classes", "classes"), ("acc", "seen"), ("base_acc", "base"),
                ("novel_acc", "novel"), (prototype_columns("backbone")["acc"], "class means"))


def _git(*args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise FSCILError("git is not on PATH") from None


def file_at(row: str, path: str) -> tuple[str, str]:
    """(the text of `path`, where it came from) for `row`: workspace (the file as it is), a commit or branch, or an
    experiment's name (its ref under refs/exps). A running experiment has no results yet: one-line error."""
    if row == "workspace":
        local = Path(path)
        if not local.is_file():
            raise FSCILError(f"{path}: not found here; run `dvc repro` (or `fscil stage report`) from the "
                             "repository's root")
        return local.read_text(), path
    refs = _git("for-each-ref", "--format=%(refname)", "refs/exps").stdout.split()
    named = [r for r in refs if r.rsplit("/", 1)[-1] == row]
    rev = named[0] if named else row
    done = _git("show", f"{rev}:{path}")
    if done.returncode != 0:
        if _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").returncode != 0:
            raise FSCILError(f"{row}: no such commit, branch or finished experiment (`dvc exp show` lists them; a "
                             "running one has no results yet)")
        raise FSCILError(f"{row}: holds no {path} (a run before the report stage, or before {path} existed?)")
    return done.stdout, f"{row}:{path}"


def sessions_at(row: str) -> tuple[str, str]:
    """(sessions.csv's text, where it came from) for `row` (`file_at`)."""
    return file_at(row, SESSIONS_CSV)


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
    """`fscil show`'s block: the run's name, its per-session table, AVG / PD / final (the method's and the class
    means'), then its standing against its own class means and any warning (`pipeline.report.standing`)."""
    name, shown, summary = run_table(text)
    body = shown.to_string(index=False, na_rep="-", float_format=lambda v: f"{v:.2f}")
    line = "  ".join(f"{k} {v:.2f}" for k, v in summary.items())
    return "\n".join([f"{name}  ({source})", body, line, *standing(pd.read_csv(io.StringIO(text)))])


def show_side_by_side(runs: list[tuple[str, str, str]]) -> str:
    """`fscil show A B ...`: one table, a column group per run (its row name) over the sessions they share, then
    each run's name, AVG line and standing. runs: (row name, sessions.csv text, source)."""
    tables, lines = [], []
    for row, text, source in runs:
        name, shown, summary = run_table(text)
        tables.append(shown.set_index(["session", "classes"]).add_prefix(f"{row} "))
        lines += [f"{row}: {name}  ({source})", "  " + "  ".join(f"{k} {v:.2f}" for k, v in summary.items()),
                  *("  " + line for line in standing(pd.read_csv(io.StringIO(text))))]
    body = pd.concat(tables, axis=1).reset_index().to_string(index=False, na_rep="-", float_format=lambda v: f"{v:.2f}")
    return "\n".join([body, *lines])
