"""Multi-seed studies: named variants (pipeline/variants/) x seeds through the pipeline's own training code.

`run_study` builds one image pack per data config (the protocol of the synthetic set and of class-folder datasets
is drawn from the seed, so each seed has its own), then trains every (variant, seed) run with `run_candidate`,
which shares a base model and feature store between runs that differ only in the `incremental` section (and
derives `single_ssm`'s base model from `dual_ssm`'s). Each run
gives a per-session table (the method and the prototype baselines); `study_table` turns the runs into mean +- std
over seeds of BASE (session 0), FINAL, AVG and PD, plus the backbone prototype baseline (nearest class mean, cosine,
on the frozen backbone's pooled maps) of the reference variant's backbones. Every run is kept under
out_dir/runs.json, so an interrupted or extended study recomputes nothing, and two variants that resolve to the same
values for a seed are trained once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.atomic import atomic_output, atomic_write_text, claim_folder, mark_folder
from pipeline.config import Config, build_config
from pipeline.data.prepare import build_pack
from pipeline.errors import FSCILError, TrainingDiverged
from pipeline.plots import PROTOTYPE
from pipeline.research.parallel import run_batches
from pipeline.research.seeds import paired_stats, vs_own_cell
from pipeline.research.selection import run_candidate
from pipeline.training.base_model import base_twin, config_digest
from pipeline.training.progress import clock
from pipeline.workdir import locked, run_once

RUNS_FILE = "runs.json"


def _digest(values: dict) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def run_key(cfg: Config) -> str:
    """A study run's key: its seed and every value it reads (a changed one is a new run), not the variant's name, so
    two variants that resolve to the same values (`dual_ssm_supp` and `mamba_fscil` when lambda3 is 0) are one run,
    trained once; the `selection` section, which no run reads, is left out, so new selection candidates keep the
    stored runs."""
    values = {name: value for name, value in cfg.to_dict(for_digest=True).items()
              if name not in ("selection", "variant")}
    return f"s{cfg.seed}/{_digest(values)}"


SCORES = ("base", "final", "avg", "pd")


def prototype_label(reference: str) -> str:
    """The prototype row's name: the class means of whose backbones it is (each projector family trains its own)."""
    return f"{PROTOTYPE} of {reference}"


def reference_variant(variants: list[str]) -> str:
    """The variant whose backbones give the study's prototype row: mamba_fscil when present, else the first."""
    return "mamba_fscil" if "mamba_fscil" in variants else variants[0]


def cached_pack(cfg: Config, folder: Path, check: Callable | None = None) -> tuple[Path, dict | None]:
    """The image pack of cfg's data section in `folder` (one per data section, named by its digest), built when
    missing: (its path, build_pack's summary or None when it was there). `check` sees the protocol of a new pack."""
    pack = folder / f"{_digest(cfg.to_dict(for_digest=True)['data'])}.h5"
    return pack, None if pack.is_file() else build_pack(cfg.data, pack, check)


def _pack(cfg: Config, work: Path) -> Path:
    """The study's image pack of cfg's data section (built once per data section in work/packs)."""
    return cached_pack(cfg, work / "packs")[0]


def _run(cfg: Config, variant: str, seed: int, work: Path, scratch: Path) -> dict:
    """One study run's record: its per-session table (base models shared in work/bases)."""
    return {"variant": variant, "seed": seed,
            "table": run_candidate(cfg, _pack(cfg, work), work / "bases", scratch)["table"]}


def run_study(params: dict[str, Any], variants: list[str], seeds: list[int], out_dir: Path,
              log: Callable[[str], None] | None = None, overrides: tuple[str, ...] | list[str] = (),
              reuse_stale: bool = False, jobs: int = 1) -> pd.DataFrame:
    """Run every (variant, seed) on `params` (a params.yaml mapping) with `-S` overrides; returns the per-session rows
    of all runs. Every run's config is checked before any folder is made; the work folder is locked while the study
    runs, and a stored run made by other code is refused unless `reuse_stale`. `jobs` > 1: runs in that many
    processes at once (`_run_parallel`), with the same results as one."""
    if jobs < 1:
        raise FSCILError(f"--jobs must be >= 1, got {jobs}")
    out_dir = Path(out_dir)
    plan = [(variant, seed, build_config({**params, "variant": variant, "seed": seed}, overrides))
            for seed in seeds for variant in variants]
    work = out_dir.with_name(out_dir.name + ".work")
    claim_folder(out_dir, "fscil study")
    with locked(work, "fscil study"):
        return _run_plan(plan, variants, out_dir, work, log, reuse_stale, jobs)


def _run_parallel(plan: list, keys: list[str], runs: dict, runs_path: Path, work: Path, jobs: int,
                  reuse_stale: bool, say: Callable[[str], None]) -> None:
    """The runs not stored yet, in `jobs` processes: the image packs first (shared), then one batch of runs per base
    model (a base model and its feature stores are made by one process; single_ssm goes with dual_ssm, whose base it
    derives from), batches in parallel (`run_batches`)."""
    todo: dict[str, tuple[str, int, Config]] = {}
    for (variant, seed, cfg), key in zip(plan, keys, strict=True):
        if not (key in runs and not TrainingDiverged.stale(runs[key])):
            todo.setdefault(key, (variant, seed, cfg))
    groups: dict[str, list] = {}
    for key, (variant, seed, cfg) in todo.items():
        _pack(cfg, work)
        groups.setdefault(config_digest(base_twin(cfg) or cfg), []).append(
            (key, functools.partial(_run, cfg, variant, seed, work), {"variant": variant, "seed": seed}))
    if not groups:
        return
    say(f"study: {len(todo)} runs in {len(groups)} groups (one per base model) over {min(jobs, len(groups))} "
        "processes")
    count = {"groups": 0, "runs": 0, "started": time.time()}

    def done(records: dict, size: int) -> None:
        runs.update(records)
        atomic_write_text(runs_path, json.dumps(runs, indent=2) + "\n")
        count["groups"] += 1
        count["runs"] += size
        elapsed = time.time() - count["started"]
        eta = clock(elapsed / count["runs"] * (len(todo) - count["runs"]))
        say(f"[{count['groups']}/{len(groups)} groups, {count['runs']}/{len(todo)} runs, elapsed {clock(elapsed)}, "
            f"ETA {eta}] study: a group of {size} runs done")

    run_batches(list(groups.values()), work, jobs, reuse_stale, done)


def _run_plan(plan: list[tuple[str, int, Config]], variants: list[str], out_dir: Path, work: Path,
              log: Callable[[str], None] | None, reuse_stale: bool, jobs: int = 1) -> pd.DataFrame:
    say = log or (lambda line: None)
    runs_path = work / RUNS_FILE
    runs: dict[str, dict] = json.loads(runs_path.read_text()) if runs_path.is_file() else {}
    keys = [run_key(cfg) for _, _, cfg in plan]
    stored = sum(key in runs and not TrainingDiverged.stale(runs[key]) for key in keys)
    if stored:  # keyed by every value a run reads; one made by other code is refused unless reuse_stale
        say(f"study: reusing {stored} of {len(keys)} runs stored in {work}")
    if jobs > 1:
        _run_parallel(plan, keys, runs, runs_path, work, jobs, reuse_stale, say)
    first: dict[str, str] = {}  # run key -> the variant of this study that named it first
    started = time.time()
    for done, ((variant, seed, cfg), key) in enumerate(zip(plan, keys, strict=True), 1):
        if first.setdefault(key, variant) != variant:
            say(f"{variant} seed {seed}: the same run as {first[key]} (every value it reads is equal)")
        # a diverged run is a result too: kept, counted, not averaged
        run_once(runs, key, runs_path, work / "sessions", functools.partial(_run, cfg, variant, seed, work),
                 diverged={"variant": variant, "seed": seed}, reuse_stale=reuse_stale)
        elapsed = time.time() - started
        eta = clock(elapsed / done * (len(plan) - done))
        # with jobs > 1 the processes above ran them: read back here, no time to report
        timing = "" if jobs > 1 else f", elapsed {clock(elapsed)}, ETA {eta}"
        head = f"[{done}/{len(plan)} runs{timing}]"
        if "diverged" in runs[key]:
            say(f"{head} {variant} seed {seed}: diverged ({runs[key]['diverged']})")
            continue
        table = pd.DataFrame(runs[key]["table"])
        say(f"{head} {variant} seed {seed}: AVG {table['acc'].mean():.2f} final {table['acc'].iloc[-1]:.2f} "
            f"(prototype AVG {table['proto_backbone_acc'].mean():.2f})")
    # each (variant, seed) takes its run's record under its own name (a record shared by two names says the first)
    named = [(variant, seed, runs[key]) for (variant, seed, _), key in zip(plan, keys, strict=True)]
    done = [(variant, seed, run) for variant, seed, run in named if "table" in run]
    if not done:
        raise FSCILError(f"study: every run diverged (first: {named[0][0]} seed {named[0][1]}, "
                         f"{named[0][2]['diverged']}); nothing written to {out_dir}")
    sessions = pd.concat([pd.DataFrame(run["table"]).assign(variant=variant, seed=seed) for variant, seed, run in done],
                         ignore_index=True)
    diverged = {(variant, seed): run["diverged"] for variant, seed, run in named if "diverged" in run}
    write_study(sessions, out_dir, variants, diverged)
    sessions.attrs["diverged"] = diverged
    return sessions


def run_scores(sessions: pd.DataFrame, column: str = "acc") -> pd.DataFrame:
    """One row per (variant, seed): BASE, FINAL, AVG, PD of `column`, plus the novel accuracy after session 1."""
    out = []
    for (variant, seed), run in sessions.sort_values("session").groupby(["variant", "seed"], sort=False):
        acc = run[column].astype(float).to_numpy()
        novel = run["novel_acc" if column == "acc" else column.replace("_acc", "_novel_acc")].astype(float)
        params = run["projector_parameters"] if "projector_parameters" in run else pd.Series([float("nan")])
        # AVG minus the class means of the run's own backbone (each projector family trains its own): paired per
        # run, so the backbone's seed-to-seed spread cancels; undefined for the prototype rows themselves
        own = run["proto_backbone_acc"].astype(float).mean() if column == "acc" else float("nan")
        out.append({"variant": variant, "seed": seed, "base": acc[0], "final": acc[-1], "avg": acc.mean(),
                    "pd": acc[0] - acc[-1], "vs_proto": acc.mean() - own,
                    "novel_s1": novel.iloc[1] if len(novel) > 1 else float("nan"),
                    "params": float(params.iloc[-1])})
    return pd.DataFrame(out)


def study_table(sessions: pd.DataFrame, variants: list[str], reference: str | None = None,
                diverged: dict[tuple[str, int], str] | None = None) -> pd.DataFrame:
    """Mean and std over the finished seeds per variant (in the given order), with the count of runs that diverged
    (`diverged`, default `sessions.attrs["diverged"]`: refused by the divergence check, in no mean), then the backbone
    prototype baseline of the `reference` variant's runs (default: `reference_variant`), named after it."""
    diverged = sessions.attrs.get("diverged", {}) if diverged is None else diverged
    reference = reference or reference_variant(variants)
    label = prototype_label(reference)
    method = run_scores(sessions)
    proto = run_scores(sessions[sessions["variant"] == reference], "proto_backbone_acc").assign(
        variant=label, params=float("nan"))  # no trained parameters
    scores = pd.concat([method, proto], ignore_index=True)
    order = [v for v in variants if v in set(scores["variant"]) or any(d == v for d, _ in diverged)] + [label]
    grouped = scores.groupby("variant", sort=False)
    table = grouped[[*SCORES, "vs_proto", "novel_s1"]].agg(["mean", "std"]).reindex(order)
    # the paired difference to the run's own class means: its SE over seeds and the seeds above / below them
    paired = grouped["vs_proto"].apply(paired_stats).reindex(order)
    for i, name in enumerate(("se", "up", "down"), start=1):
        table[("vs_proto", name)] = [p[i] if isinstance(p, tuple) else np.nan for p in paired]
    table[("seeds", "n")] = grouped.size().reindex(order).fillna(0)
    table[("diverged", "n")] = [sum(d == v for d, _ in diverged) for v in order]
    table[("params", "final")] = grouped["params"].max().reindex(order)  # the projector's, in the last session
    return table


MEAN_RULE = ("Means and stds are over the finished runs of each row; a run that diverged (stopped by the divergence "
             "check) enters no mean and is counted under diverged. AVG - own class means: each run's AVG minus that "
             "of the nearest class mean on its own frozen backbone, paired by seed: mean ± SE over the seeds, the "
             "seeds above / below, and 'above' or 'below' its own class means beyond 2 SE, else 'level'.")


def table_markdown(table: pd.DataFrame) -> str:
    """The study table as markdown, `mean +- std` per score."""
    head = ("| variant | finished | diverged | BASE | FINAL | AVG | PD | AVG - own class means | novel acc. after "
            "session 1 | projector parameters |\n|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for variant, row in table.iterrows():
        cells = ["-" if pd.isna(row[(s, 'mean')]) else f"{row[(s, 'mean')]:.2f} ± {row[(s, 'std')]:.2f}"
                 for s in SCORES]
        vs = row[("vs_proto", "mean")]
        cells.append("-" if pd.isna(vs) else vs_own_cell(vs, row[("vs_proto", "se")], int(row[("vs_proto", "up")]),
                                                         int(row[("vs_proto", "down")])))
        cells.append(f"{row[('novel_s1', 'mean')]:.2f} ± {row[('novel_s1', 'std')]:.2f}")
        params = row[("params", "final")]
        cells.append("-" if pd.isna(params) else f"{int(params):,}")
        lines.append(f"| {variant} | {int(row[('seeds', 'n')])} | {int(row[('diverged', 'n')])} | "
                     + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n\n" + MEAN_RULE + "\n"


def plot_study(sessions: pd.DataFrame, variants: list[str], path: Path, title: str) -> None:
    """Mean accuracy per session of each variant (band: +- std over seeds) and the prototype baseline (dashed)."""
    from pipeline.plots import figure

    with figure(path, size=(7, 4.5)) as (_, axes):
        _plot_study(axes[0, 0], sessions, variants, title)


def _plot_study(ax, sessions: pd.DataFrame, variants: list[str], title: str) -> None:
    for variant in variants:
        runs = sessions[sessions["variant"] == variant]
        if runs.empty:
            continue
        stats = runs.groupby("session")["acc"].agg(["mean", "std"]).fillna(0.0)
        ax.plot(stats.index, stats["mean"], marker="o", label=variant)
        ax.fill_between(stats.index, stats["mean"] - stats["std"], stats["mean"] + stats["std"], alpha=0.15)
    reference = reference_variant(variants)
    proto = sessions[sessions["variant"] == reference].groupby("session")["proto_backbone_acc"].mean()
    ax.plot(proto.index, proto.to_numpy(), linestyle="--", color="black", label=prototype_label(reference))
    ax.set_xlabel("session")
    ax.set_ylabel("accuracy on all seen classes (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def write_study(sessions: pd.DataFrame, out_dir: Path, variants: list[str],
                diverged: dict[tuple[str, int], str] | None = None) -> pd.DataFrame:
    """out_dir/{sessions.csv (every run's sessions), runs.csv (scores per run), table.csv, table.md, accuracy.png};
    `diverged` runs ((variant, seed) -> message) are listed under the table, not averaged."""
    mark_folder(out_dir, "fscil study")
    table = study_table(sessions, variants, diverged=diverged or {})
    with atomic_output(out_dir / "sessions.csv") as tmp:
        sessions.to_csv(tmp, index=False)
    with atomic_output(out_dir / "runs.csv") as tmp:
        run_scores(sessions).round(4).to_csv(tmp, index=False)
    with atomic_output(out_dir / "table.csv") as tmp:
        table.round(4).to_csv(tmp)
    notes = "".join(f"\n{variant} seed {seed} diverged: {why}\n"
                    for (variant, seed), why in sorted((diverged or {}).items()))
    atomic_write_text(out_dir / "table.md", table_markdown(table) + notes)
    seeds = sorted(int(s) for s in sessions["seed"].unique())
    plot_study(sessions, variants, out_dir / "accuracy.png",
               f"{out_dir.name}: mean +- std over seeds {', '.join(map(str, seeds))}")
    return table
