"""Hyperparameter selection on pseudo-incremental tasks built from the base session alone (paper appendix
supp:hyperparameter_protocol).

The real base session's training images are split, seeded, into a pseudo-base session, few-shot pseudo-incremental
sessions and a held-out pseudo test set, and written as an ordinary image pack (`pseudo_pack`), so each
candidate runs the very stage functions `dvc repro` runs (base_stage, extract_stage, session_stage). Nothing of the real
test set or of the real incremental sessions is ever read. Choices follow the paper's order, each by the highest pseudo
AVG with the earlier choices fixed: stage 1 the architecture (freezing of p_iden/g_base, the suppression variant, K, our
model.iden_linear and the authors' model.out_norm when listed, incremental.inc_init, and our incremental.vertex_match
when listed), with lambda1 at its configured value and lambda2 = lambda3 = 0 (the suppression variant only when that
lambda1 is not 0: with the loss off every candidate is the same run); stage 2 lambda1 (lambda2 = lambda3 = 0), then
lambda2 (lambda3 = 0), then lambda3. Optional stages, not in the paper, come first when candidates are given: the base
training (base.epochs, lr, dr_scale, weight_decay; each candidate trains its own pseudo base model), then the session
schedule and training set (incremental.lr, base_lr_scale, weight_decay, grad_clip_norm, steps, mixup_prob,
deviation_prob, the shots' stored augmented views extract.augmented_views, the memory: extract.memory, memory_k, then
replay, copy, base_copy; these keys interact, so their stage repeats until a pass changes nothing). A tie keeps the
configured value, else the earliest candidate. With selection.protocols > 1 a candidate scores its mean pseudo AVG over
that many pseudo protocols (seeds selection.seed, seed + 1, ...), and its row carries its gain over the configured value
paired by protocol, in standard errors (`gain_se`); with selection.min_gain_se > 0 (ours) a candidate must beat the
configured value by more than that to replace it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from pipeline.atomic import atomic_output, atomic_write_text
from pipeline.config import Config, check_combination, variant_keys
from pipeline.data.pack import ImagePack
from pipeline.errors import FSCILError, TrainingDiverged
from pipeline.report import session_table, summarise, summarise_prototypes
from pipeline.research.parallel import run_batches
from pipeline.research.pseudo_pack import pseudo_packs
from pipeline.research.selection_config import SEARCH, SelectionConfig
from pipeline.training.base_model import BASE_MODEL_SECTIONS, MODEL_FILE, base_twin, config_digest
from pipeline.training.base_session import base_stage, derive_base_model
from pipeline.training.extract import extract_stage
from pipeline.training.incremental_session import session_stage
from pipeline.training.progress import clock
from pipeline.workdir import locked, run_once

RESULTS_FILE = "results.json"  # candidate results by candidate key, kept in the work dir across runs
SCORES = ("avg", "final", "pd", "base")
# what (with the seed and the pseudo pack) a candidate's result, a base model and a feature store depend on
CANDIDATE_SECTIONS = ("data", "model", "base", "extract", "incremental")
STORE_SECTIONS = (*BASE_MODEL_SECTIONS, "extract")
AUXILIARY = ("incremental.lambda2", "incremental.lambda3")  # the loss weights chosen last, in this order
DIVERGED = {score: float("nan") for score in SCORES}  # a diverged candidate's scores
SCHEDULE_PASSES = 3  # passes over the training-set keys (stage "schedule") at most; the first unchanged pass ends it


# ---- one candidate -------------------------------------------------------------------------------------------------
def with_values(cfg: Config, values: dict[str, Any]) -> Config:
    """A copy of `cfg` with dotted keys ("incremental.lambda1") replaced; each changed section validates again, and so
    do the rules between sections."""
    sections: dict[str, dict[str, Any]] = {}
    for dotted, value in values.items():
        name, key = dotted.split(".")
        sections.setdefault(name, {})[key] = value
    out = dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **kv)
                                      for name, kv in sections.items()})
    check_combination(out)
    return out


def _key(cfg: Config, sections: tuple[str, ...], pack_hash: str) -> str:
    cfg = with_values(cfg, {"extract.memory_k": cfg.extract.memory_rule[1]})  # k of another rule: the same store
    return hashlib.sha256(f"{pack_hash}:{config_digest(cfg, sections)}".encode()).hexdigest()[:16]


def _base_model(cfg: Config, pack_path: Path, pack_hash: str, base_cache: Path) -> Path:
    """cfg's entry in base_cache, its base model trained once; a projector without g_inc takes its twin's trained base
    model less g_inc (`base_twin`: single_ssm shares dual_ssm's base training)."""
    cache = base_cache / _key(cfg, BASE_MODEL_SECTIONS, pack_hash)
    base_dir = cache / "base"
    if not (base_dir / MODEL_FILE).is_file():
        twin = base_twin(cfg)
        twin_dir = None if twin is None else _base_model(twin, pack_path, pack_hash, base_cache) / "base"
        if twin_dir is None:
            base_stage(cfg, pack_path, base_dir, cache / "base.resume", show_progress=False)
        else:
            with atomic_output(base_dir, directory=True) as tmp:
                derive_base_model(cfg, twin_dir, pack_path, tmp)
    return cache


def run_candidate(cfg: Config, pseudo_pack_path: Path, base_cache: Path, work_dir: Path) -> dict:
    """Train and evaluate `cfg` on an image pack (the pseudo pack, or a real one for studies); returns
    {"avg", "final", "pd", "base", "sessions"} (in %), the prototype baselines' summaries and the session table.

    The base model lives in base_cache/<key>/base (key: the pack and the data/model/base sections) and its feature
    stores in base_cache/<key>/stores/<key with extract>, so candidates that differ only in `incremental` share
    both and candidates that differ in `extract` (the memory) share the base model (single_ssm takes dual_ssm's:
    `_base_model`); the sessions go to `work_dir`. Computed with cfg's own thread count (params `threads`: CPU
    results depend on it), in whichever process runs it.
    """
    import torch

    torch.set_num_threads(cfg.threads)
    with ImagePack.open(pseudo_pack_path) as pack:
        pack_hash, num_sessions = pack.content_hash, pack.protocol.num_sessions
    cache = _base_model(cfg, pseudo_pack_path, pack_hash, Path(base_cache))
    base_dir = cache / "base"
    store = cache / "stores" / _key(cfg, STORE_SECTIONS, pack_hash) / "features.zarr"
    if not store.exists():
        extract_stage(cfg, pseudo_pack_path, base_dir, store, show_progress=False, progress_lines=False)
    results = [json.loads((base_dir / "metrics.json").read_text())]
    prev = None
    for session in range(1, num_sessions):
        out = Path(work_dir) / f"session_{session}"
        results.append(session_stage(cfg, session, store, base_dir, prev, out, show_progress=False,
                                     progress_lines=False))
        prev = out
    table = session_table(results)
    summary = summarise(table)
    return {**{key: summary[key] for key in (*SCORES, "sessions")}, "prototype": summarise_prototypes(table),
            "table": table.to_dict("records")}


# ---- the selection -------------------------------------------------------------------------------------------------
def selection_order(sel: SelectionConfig) -> list[tuple[str, str, list, dict[str, Any]]]:
    """(stage, dotted key, candidates, values held while choosing it) in the paper's order (SEARCH), one entry per key
    with candidates; lambda2 and lambda3 are held at 0 until their own turn (lambda1 is chosen without them)."""
    order = []
    for s in SEARCH:
        if values := getattr(sel, s.name):
            held = AUXILIARY[AUXILIARY.index(s.key) + 1:] if s.key in AUXILIARY else AUXILIARY
            order.append((s.stage, s.key, values, {key: 0.0 for key in held}))
    return order


def paired_gain_se(runs: list[float], reference: list[float]) -> float:
    """Mean of the per-protocol differences runs - reference in standard errors of that mean (inf when every
    difference is the same positive number, nan when they are all zero)."""
    diff = np.asarray(runs, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    if not np.isfinite(diff).all():  # a diverged run on either side
        return math.nan
    mean, se = float(diff.mean()), float(diff.std(ddof=1) / math.sqrt(len(diff)))
    if se > 0:
        return mean / se
    return math.copysign(math.inf, mean) if mean else math.nan


def choose(values: list, scores: list[float], configured: Any, gains: list[float] | None = None,
           min_gain_se: float = 0.0) -> Any:
    """The value of the highest score; on a tie the configured value, else the earliest candidate. With min_gain_se
    > 0 (selection.min_gain_se) only candidates whose gain over the configured value (`gains`, paired_gain_se) is
    above min_gain_se may replace it."""
    if min_gain_se > 0 and configured in values and math.isfinite(scores[values.index(configured)]):
        passing = [i for i, v in enumerate(values) if v != configured and math.isfinite(scores[i])
                   and gains[i] > min_gain_se]
        if not passing:
            return configured
        values, scores = [values[i] for i in passing], [scores[i] for i in passing]
    best = max(scores)
    tied = [v for v, s in zip(values, scores, strict=True) if s == best]
    return configured if configured in tied else tied[0]


def _get(cfg: Config, dotted: str) -> Any:
    name, key = dotted.split(".")
    return getattr(getattr(cfg, name), key)


# A key a run reads only under other values (a test on the config it would run with, and why it is not read):
# elsewhere its candidates would all be the same run, so it is not selected there
READ_ONLY_WHEN = {
    "extract.memory_k": (lambda c: c.extract.memory == "sampled", "k counts the maps of the sampled memory only"),
    "incremental.suppression": (lambda c: c.incremental.suppression_on,
                                "lambda1 = lambda2 = 0 here (the suppression loss is off)"),
}

# A chosen value that reads another key, which is not selected itself: (condition on the value, the key it reads)
NEEDS = {"incremental.deviation_prob": (lambda p: p > 0, "extract.deviations"),
         "extract.memory_k": (lambda k: True, "extract.memory")}


def needed_keys(cfg: Config, chosen: dict[str, Any]) -> dict[str, Any]:
    """The keys the chosen values read that were not chosen, at the values the selection ran them with, so that the
    fragment means the same merged into a params file without them (e.g. deviation_prob with its extract.deviations)."""
    ran = with_values(cfg, chosen)
    return {needed: _get(ran, needed) for key, (applies, needed) in NEEDS.items()
            if key in chosen and needed not in chosen and applies(chosen[key])}


def selected_yaml(chosen: dict[str, Any], pseudo: list[dict], variant: str | None = None,
                  needed: dict[str, Any] | None = None) -> str:
    """A params.yaml fragment holding the chosen keys (and the `needed` ones they read), with a comment naming the
    pseudo protocols; for a named variant, under `variant_params: {<variant>: ...}` so that merged into params.yaml
    it applies to that variant alone."""
    nested: dict[str, Any] = {}
    for dotted, value in {**chosen, **(needed or {})}.items():
        name, key = dotted.split(".")
        nested.setdefault(name, {})[key] = value
    if variant is not None:
        nested = {"variant_params": {variant: nested}}
    first, plural = pseudo[0], "s" if len(pseudo) > 1 else ""
    seeds = ", ".join(str(p["seed"]) for p in pseudo)
    packs = ", ".join(p["content_hash"][:12] for p in pseudo)
    header = (f"# fscil select: chosen by pseudo AVG on {first['base_classes']} pseudo-base classes + "
              f"{first['sessions']} x {first['ways']}-way {first['shots']}-shot pseudo sessions\n"
              f"# from the base session's training images only ({first['val_fraction']:g} of each class held out "
              f"as pseudo test), seed{plural} {seeds},\n# pseudo pack{plural} "
              f"{packs}{f', variant {variant}' if variant else ''}. Merge into params.yaml.\n"
              + (f"# Not selected, read by a chosen value: {', '.join(needed)}.\n" if needed else ""))
    return header + yaml.safe_dump(nested, sort_keys=False)


def _run_cached(cand: Config, pack: tuple[Path, dict], work_dir: Path, results: dict, results_path: Path,
                reuse_stale: bool = False) -> dict:
    """One candidate on one pseudo pack, from `results` when it ran before; a diverging candidate scores nan."""
    ckey = _key(cand, CANDIDATE_SECTIONS, pack[1]["content_hash"])
    cached = run_once(results, ckey, results_path, work_dir / "candidate",
                      functools.partial(run_candidate, cand, pack[0], work_dir / "bases"), diverged=DIVERGED,
                      reuse_stale=reuse_stale)
    return {**results[ckey], "cached": cached, "key": ckey}


def select(cfg: Config, pack_path: Path, out_dir: Path, candidates: SelectionConfig, *,
           work_dir: Path | None = None, log: Callable[[str], None] | None = None, reuse_stale: bool = False,
           jobs: int = 1) -> dict:
    """Run the selection; writes out_dir/{selection.csv, selected.yaml, selection.json} and returns
    {"chosen": {dotted key: value}, "rows": [one per candidate, in order], "pseudo_protocol": {...},
    "pseudo_protocols": [one per pseudo protocol]}.

    candidates: the candidate sets (`load_selection`: the params' selection section). work_dir (None:
    out_dir/work) keeps the pseudo packs, the base models and feature stores and every candidate's result, so
    nothing computed there is computed again. With
    selection.protocols > 1 each candidate runs on every pseudo protocol (seed candidates.seed + i, which also seeds its
    training) and scores the mean of their results. jobs > 1: each key's candidate runs in that many processes at
    once (one GPU each when several are visible; `_Selection.prefetch`), with the same results as one.
    """
    if jobs < 1:
        raise FSCILError(f"--jobs must be >= 1, got {jobs}")
    # a named variant is what its name says: the keys it sets itself (a row's projector, its losses off) are held
    fixed = variant_keys(cfg.variant)
    full_order = selection_order(candidates)
    order = [entry for entry in full_order if entry[1] not in fixed]
    # any projector (an ablation row selects its own session settings); a candidate its projector cannot take
    # (inc_init base without g_inc) fails the config check below, before anything trains
    for _, key, values, _ in order:  # every candidate against the configured values, before training
        for value in values:
            try:
                with_values(cfg, {key: value})
            except FSCILError as err:
                raise FSCILError(f"params: selection candidate {key}={value!r}: "
                                 f"{str(err).removeprefix('params: ')}") from None
    out_dir, work_dir = Path(out_dir), Path(work_dir or Path(out_dir) / "work")
    with locked(work_dir, "fscil select"):
        planned = sum(len(v) for _, _, v, _ in order)
        run = _Selection(cfg, candidates, pack_path, work_dir, log, reuse_stale, planned, jobs)
        return _select(run, order, full_order, fixed, out_dir)


class _Selection:
    """One `fscil select` run: the pseudo protocols, the stored candidate results, the choices made so far and the
    rows of selection.csv, with a progress line per candidate."""

    def __init__(self, cfg: Config, sel: SelectionConfig, pack_path: Path, work_dir: Path,
                 log: Callable[[str], None] | None, reuse_stale: bool, planned: int, jobs: int = 1):
        self.cfg, self.sel, self.work_dir, self.reuse_stale, self.jobs = cfg, sel, work_dir, reuse_stale, jobs
        self.say = log or (lambda line: None)
        self.packs = pseudo_packs(pack_path, work_dir, sel)
        pseudo = self.packs[0][1]
        self.say(f"pseudo protocol: {pseudo['base_classes']} base classes + {pseudo['sessions']} x {pseudo['ways']}"
                 f"-way {pseudo['shots']}-shot, {pseudo['num_test']} test images; {len(self.packs)} protocol(s), "
                 f"seeds {', '.join(str(p[1]['seed']) for p in self.packs)}")
        self.results_path = work_dir / RESULTS_FILE
        self.results: dict[str, dict] = (json.loads(self.results_path.read_text()) if self.results_path.is_file()
                                         else {})
        if self.results:  # keyed by the values a candidate reads; one made by other code is refused unless reuse_stale
            self.say(f"select: {len(self.results)} candidate results stored in {work_dir} are reused where they match")
        self.chosen: dict[str, Any] = {}
        self.rows: list[dict] = []
        self.all_diverged: list[str] = []  # keys whose every candidate diverged, in the order they ran
        self.prefetched: set[str] = set()  # candidate results computed by `prefetch` in this run
        # candidates done / planned (a schedule pass that changes a value adds a pass: the total is then a floor)
        self.count = {"done": 0, "total": planned, "started": time.time()}

    def group_values(self, group: list) -> list:
        """The values the group's keys run with now (chosen, else configured)."""
        current = with_values(self.cfg, self.chosen)
        return [_get(current, key) for _, key, _, _ in group]

    def run_candidate(self, stage: str, key: str, value: Any, held: dict[str, Any]) -> tuple[float, list[float]]:
        """`key`=`value` on every pseudo protocol (the earlier choices fixed): its row, and its score (-inf when a
        protocol diverged) with the per-protocol AVGs."""
        cand = with_values(self.cfg, {**held, **self.chosen, key: value})
        runs = [_run_cached(dataclasses.replace(cand, seed=info["seed"]), (path, info), self.work_dir, self.results,
                            self.results_path, self.reuse_stale) for path, info in self.packs]
        diverged = [r["diverged"] for r in runs if "diverged" in r]
        mean = {s: float(np.mean([r[s] for r in runs])) for s in SCORES}  # nan when one diverged
        self.rows.append({"stage": stage, "key": key, "value": value, **mean,
                          **({f"avg_seed{info['seed']}": r["avg"] for (_, info), r in zip(self.packs, runs,
                                                                                          strict=True)}
                             if len(self.packs) > 1 else {}),
                          "seconds": round(sum(r["seconds"] for r in runs), 2), "diverged": bool(diverged),
                          "chosen": False})
        took = ("cached" if all(r["cached"] and r["key"] not in self.prefetched for r in runs)
                else f"{self.rows[-1]['seconds']:.0f} s")
        outcome = f"diverged ({diverged[0]})" if diverged else f"AVG {mean['avg']:.2f} final {mean['final']:.2f}"
        count = self.count
        count["done"] += 1
        count["total"] = max(count["total"], count["done"])
        elapsed = time.time() - count["started"]
        eta = elapsed / count["done"] * (count["total"] - count["done"])
        self.say(f"[{count['done']}/{count['total']} candidates, elapsed {clock(elapsed)}, ETA {clock(eta)}] "
                 f"{key}={value}: {outcome} ({took})")
        return (-math.inf if diverged else mean["avg"]), [r["avg"] for r in runs]

    def prefetch(self, key: str, values: list, held: dict[str, Any]) -> None:
        """The runs of `key`'s candidates not stored yet, in self.jobs processes (`run_batches`): first one run per
        base model (each is trained once), then one per feature store (each extracted once), then the rest; each
        phase in parallel. `choose_key` then reads them as stored results."""
        todo: dict[str, tuple[Config, Path, str]] = {}
        for value in values:
            cand = with_values(self.cfg, {**held, **self.chosen, key: value})
            for path, info in self.packs:
                run = dataclasses.replace(cand, seed=info["seed"])
                ckey = _key(run, CANDIDATE_SECTIONS, info["content_hash"])
                if not (ckey in self.results and not TrainingDiverged.stale(self.results[ckey])):
                    todo.setdefault(ckey, (run, path, info["content_hash"]))
        phases: list[list] = [[], [], []]
        seen: set[str] = set()
        for ckey, (run, path, pack_hash) in todo.items():
            base, store = _key(run, BASE_MODEL_SECTIONS, pack_hash), _key(run, STORE_SECTIONS, pack_hash)
            phase = 0 if base not in seen else 1 if store not in seen else 2
            seen |= {base, store}
            phases[phase].append([(ckey, functools.partial(run_candidate, run, path, self.work_dir / "bases"),
                                   DIVERGED)])
        for batches in phases:
            run_batches(batches, self.work_dir, self.jobs, self.reuse_stale, self._store)
        self.prefetched |= set(todo)

    def _store(self, records: dict, _runs: int) -> None:
        self.results.update(records)
        atomic_write_text(self.results_path, json.dumps(self.results, indent=2) + "\n")

    def choose_key(self, stage: str, key: str, values: list, held: dict[str, Any]) -> None:
        """Run every candidate of `key` (the earlier choices fixed), record their rows and the chosen value."""
        if self.jobs > 1:
            self.prefetch(key, values, held)
        scores, per_protocol = zip(*(self.run_candidate(stage, key, v, held) for v in values), strict=True)
        configured = _get(self.cfg, key)
        if all(score == -math.inf for score in scores):
            # nothing to choose: the configured value stays, and a later key (a clip, a smaller weight) may yet make
            # the run train; when none is left, the selection ends with an error instead of a config that diverged
            self.all_diverged.append(key)
            self.say(f"every candidate of {key} ({', '.join(map(str, values))}) diverged on at least one pseudo "
                     f"protocol; {key} stays at {configured} and the selection goes on")
            return
        paired = len(self.packs) > 1 and configured in values  # each candidate's gain over the configured value, in SE
        gains = [paired_gain_se(runs, per_protocol[values.index(configured)]) if paired and value != configured
                 else math.nan for value, runs in zip(values, per_protocol, strict=True)]
        chosen = self.chosen[key] = choose(values, list(scores), configured, gains, self.sel.min_gain_se)
        for row, value, gain in zip(self.rows[-len(values):], values, gains, strict=True):
            row["chosen"] = value == chosen
            if paired and value != configured:
                row["gain_se"] = gain
        top = choose(values, list(scores), configured)  # the paper's rule, to say when the margin overruled it
        margin = (f" ({top} had the highest mean but gained {gains[values.index(top)]:.2f} standard errors over "
                  f"{configured}, not more than selection.min_gain_se {self.sel.min_gain_se:g})" if chosen != top
                  else "")
        self.say(f"chosen {key}={chosen}{margin}")

    def run_stage(self, stage: str, group: list) -> None:
        """One stage's keys in order. The training-set keys interact (base_copy repeats the memory's rows, replay
        picks what stands for a class), so their stage repeats, each key chosen again with the others at their new
        values, until a pass changes nothing (cached candidates cost nothing); every other stage is one pass."""
        for n in range(SCHEDULE_PASSES if stage == "schedule" and len(group) > 1 else 1):
            before = self.group_values(group)
            for _, key, values, held in group:
                read, unread_because = READ_ONLY_WHEN.get(key, (None, ""))
                if read is not None and not read(with_values(self.cfg, {**held, **self.chosen})):
                    self.say(f"{key} not selected: {unread_because}, so every candidate would be the same run")
                    continue
                self.choose_key(stage if n == 0 else f"{stage} (pass {n + 1})", key, values, held)
            if self.group_values(group) == before:
                break

    def check_last_key(self) -> None:
        """The last key run must leave a configuration that trains."""
        if self.rows and self.rows[-1]["key"] in self.all_diverged:
            key = self.rows[-1]["key"]
            values = ", ".join(str(row["value"]) for row in self.rows if row["key"] == key)
            raise FSCILError(f"selection: every candidate of {key} ({values}) diverged on at least one pseudo "
                             "protocol and no key is left after it; add a smaller candidate (or lower incremental.lr, "
                             "or list incremental.grad_clip_norm candidates)")

    def write(self, out_dir: Path) -> dict:
        """selection.csv, selected.yaml and selection.json in out_dir; returns the summary."""
        out_dir.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(self.rows).to_csv(out_dir / "selection.csv", index=False)
        infos = [info for _, info in self.packs]
        (out_dir / "selected.yaml").write_text(selected_yaml(self.chosen, infos, self.cfg.variant,
                                                             needed_keys(self.cfg, self.chosen)))
        summary = {"chosen": self.chosen, "rows": self.rows, "all_diverged": self.all_diverged,
                   "pseudo_protocol": infos[0], "pseudo_protocols": infos}
        (out_dir / "selection.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


def _select(run: _Selection, order: list, full_order: list, fixed: set[str], out_dir: Path) -> dict:
    if held := sorted(fixed & {key for _, key, _, _ in full_order}):
        run.say(f"variant {run.cfg.variant} fixes {', '.join(held)}: not selected")
    for stage, entries in itertools.groupby(order, key=lambda entry: entry[0]):
        run.run_stage(stage, list(entries))
    run.check_last_key()
    return run.write(out_dir)
