"""Per-session results: accuracy on all seen / base / novel classes, AVG, PD (first minus last) and final accuracy,
the prototype baselines and the class-sensitive diagnostics (pipeline/training/diagnostics.py) beside them."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from pipeline.atomic import atomic_output, atomic_write_text

ACCURACIES = ("acc", "base_acc", "novel_acc")
# errors across the base / novel boundary (pipeline/training/evaluate.py), the method's and each baseline's
CROSSINGS = ("novel_as_base", "base_as_novel")
PROTOTYPE_SPACES = ("backbone", "projector")  # the NCM baselines of pipeline/training/prototype.py
ARRAYS_FILE = "diagnostics.npz"  # per-sample arrays each incremental session writes (pipeline/training/diagnostics.py)
# the session diagnostics (sessions >= 1), as sessions.csv columns diag_<name>
DIAGNOSTICS = ("alignment", "base_novel_similarity", "z_energy_base", "z_energy_novel", "B_cosine", "C_cosine",
               "delta_cosine")


def prototype_columns(space: str) -> dict[str, str]:
    """sessions.csv column of each accuracy and crossing of one prototype baseline: {"acc": "proto_backbone_acc",
    ...}."""
    return {name: f"proto_{space}_{name}" for name in (*ACCURACIES, *CROSSINGS)}


def _prototype_row(result: dict, session0: dict | None) -> dict:
    """The prototype columns of one session; NaN where its metrics predate the baseline."""
    proto = result.get("prototype", session0 if result["session"] == 0 else None) or {}
    return {column: proto.get(space, {}).get(name) for space in PROTOTYPE_SPACES
            for name, column in prototype_columns(space).items()}


def session_table(results: list[dict]) -> pd.DataFrame:
    """One row per session (0 = base), ordered by session, with the prototype baselines' accuracies. Session 0's
    come from session 1's `prototype_session0` (the base stage has no feature store)."""
    session0 = next((r.get("prototype_session0") for r in results if r["session"] == 1), None)
    rows = [{"session": r["session"], "acc": r["acc"], "base_acc": r["base_acc"], "novel_acc": r["novel_acc"],
             **{name: r.get(name) for name in CROSSINGS},  # None in metrics written before they existed
             "num_seen_classes": r["num_seen_classes"], "num_test": r["num_test"], **_prototype_row(r, session0),
             "projector_parameters": r.get("projector_parameters"),
             **{f"diag_{name}": r.get("diagnostics", {}).get(name) for name in DIAGNOSTICS}}
            for r in results]
    table = pd.DataFrame(rows).sort_values("session").reset_index(drop=True)
    floats = [*CROSSINGS, *(column for space in PROTOTYPE_SPACES for column in prototype_columns(space).values())]
    floats += ["projector_parameters", *(f"diag_{name}" for name in DIAGNOSTICS)]
    table[floats] = table[floats].astype(float)
    expected = list(range(len(table)))
    if table["session"].tolist() != expected:
        raise ValueError(f"sessions {table['session'].tolist()} are not 0..{len(table) - 1}")
    return table


def summarise(table: pd.DataFrame) -> dict:
    """metrics.json content: accuracy per session, AVG, PD and final (all in %), and after the last session the
    share of test images that crossed between base and novel classes (when its metrics have them), so that
    `dvc exp show` lists where a run's errors go beside its accuracy."""
    acc = table["acc"].astype(float).tolist()
    last = table.iloc[-1]
    crossings = {f"final_{name}": round(float(last[name]), 4) for name in CROSSINGS
                 if name in table and pd.notna(last[name])}
    return {
        "avg": round(sum(acc) / len(acc), 4),
        "pd": round(acc[0] - acc[-1], 4),
        "final": round(acc[-1], 4),
        "base": round(acc[0], 4),
        "final_base_acc": last["base_acc"],
        "final_novel_acc": last["novel_acc"],
        **crossings,
        "sessions": {f"s{int(s)}": round(float(a), 4) for s, a in zip(table["session"], acc, strict=True)},
    }


# metrics.json: the numbers a comparison reads first, in this order (`dvc exp show` lists them first); every other
# number of the summary is in the report folder's DETAILS_FILE (`dvc metrics show data/report/details.json`)
HEADLINE = ("avg", "final", "pd", "base", "novel", "class_means_avg")
DETAILS_FILE = "details.json"


def headline(summary: dict) -> dict:
    """metrics.json's content from a `write_report` summary: AVG, final, PD, base (session 0) and novel (the last
    session's novel classes) accuracy, then the AVG of the class means of the run's own backbone (the baseline a
    trained projector must beat) when the sessions have it."""
    out = {"avg": summary["avg"], "final": summary["final"], "pd": summary["pd"], "base": summary["base"],
           "novel": summary["final_novel_acc"]}
    means = summary.get("prototype", {}).get("backbone")
    if means:
        out["class_means_avg"] = means["avg"]
    return out


def summarise_prototypes(table: pd.DataFrame) -> dict:
    """`summarise` of each prototype baseline that every session has (older session metrics lack them)."""
    summaries = {}
    for space in PROTOTYPE_SPACES:
        columns = {k: c for k, c in prototype_columns(space).items() if c in table}  # crossings: newer tables
        if all(a in columns for a in ACCURACIES) and table[columns["acc"]].notna().all():
            renamed = table[["session", *columns.values()]].rename(columns={v: k for k, v in columns.items()})
            summaries[space] = summarise(renamed)
    return summaries


def standing(table: pd.DataFrame, suspects: list[str] | None = None) -> list[str]:
    """Where a run stands against the class means of its own backbone (the baseline a trained projector must beat),
    and what looks wrong: its AVG beside theirs, then a warning when novel accuracy is 0 in every session after the
    base one, or when the run ends below its own class means. `suspects`: 'key=value' of the keys the user set that
    the sessions read (params.yaml or -S), named as the likely cause."""
    method = summarise(table)
    means = summarise_prototypes(table).get("backbone")
    lines = []
    if means:
        diff = method["avg"] - means["avg"]
        lines.append(f"AVG {method['avg']:.2f} against the class means of its own backbone {means['avg']:.2f}: "
                     f"{diff:+.2f}" + ("" if diff > 0 else ", not above them"))
    cause = f" (keys you set that the sessions read: {', '.join(suspects)})" if suspects else ""
    novel = pd.to_numeric(table.loc[table["session"] >= 1, "novel_acc"], errors="coerce")
    if len(novel) and (novel.fillna(0) == 0).all():
        lines.append("warning: novel accuracy is 0 in every session after the base one: the sessions learned none "
                     f"of the new classes{cause}")
    if means and method["final"] < means["final"]:
        lines.append(f"warning: the run ends below the class means of its own backbone (final {method['final']:.2f} "
                     f"against {means['final']:.2f}){cause}")
    return lines


def write_report(results: list[dict], metrics_path: Path, out_dir: Path, title: str = "Mamba-FSCIL",
                 arrays: dict | None = None, identity: dict | None = None, suspects: list[str] | None = None) -> dict:
    """Write metrics.json (`headline`), out_dir/details.json (the whole summary: `identity`, e.g. preset / variant /
    method / seed, then AVG, PD, final, the last session's base / novel accuracies and crossings, every session's
    accuracy, the prototype baselines' summaries under "prototype" when every session has them, and the run's
    `standing` against its own class means, `suspects` named in its warnings),
    out_dir/sessions.csv (`identity` a column of every row) and the pictures: accuracy.png, diagnostics.png when
    the sessions have diagnostics, and from `arrays` (the last session's diagnostics.npz) z_histogram.png, tsne.png
    and, for projectors that generate B, b_maps.png; returns the whole summary."""
    from pipeline.plots import plot_accuracy, plot_b_maps, plot_diagnostics, plot_empty, plot_tsne, plot_z_histogram

    identity = identity or {}
    table = session_table(results)
    summary = {**identity, **summarise(table)}
    prototype = summarise_prototypes(table)
    if prototype:
        summary["prototype"] = prototype
    summary["standing"] = standing(table, suspects)
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_output(out_dir / "sessions.csv") as tmp:
        table.assign(**identity).to_csv(tmp, index=False)
    plot_accuracy(table, out_dir / "accuracy.png", title, prototype_columns("backbone")["acc"])
    # every picture dvc.yaml declares is written for every run, empty with its reason when there is nothing to show
    if table["diag_alignment"].notna().any():
        plot_diagnostics(table, out_dir / "diagnostics.png", f"{title}: diagnostics on test maps")
    else:
        plot_empty(out_dir / "diagnostics.png", title, "no diagnostics: the sessions recorded none")
    if arrays is not None:
        last = int(table["session"].iloc[-1])
        plot_z_histogram(arrays, out_dir / "z_histogram.png", f"{title}\n||Z|| after session {last}")
        plot_tsne(arrays, out_dir / "tsne.png", f"{title}\ntest features after session {last}")
        if "b_maps" in arrays:
            plot_b_maps(arrays, out_dir / "b_maps.png", f"{title}\nactivation maps of B after session {last}")
        else:
            plot_empty(out_dir / "b_maps.png", title, "no B maps: this projector generates no input-dependent B")
    else:
        for name in ("z_histogram.png", "tsne.png", "b_maps.png"):
            plot_empty(out_dir / name, title, "no pictures of the last session's features: it saved no arrays")
    atomic_write_text(out_dir / DETAILS_FILE, json.dumps(summary, indent=2) + "\n")
    atomic_write_text(metrics_path, json.dumps(headline(summary), indent=2) + "\n")
    return summary
