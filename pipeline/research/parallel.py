"""Runs of `fscil study` and `fscil select` in several processes at once, one GPU each when several are visible.

A run is (key, run(scratch) -> record, the record of a diverged run); a batch is runs that must go in order in one
process (they build a base model or a feature store the later ones read). Batches run in parallel; each worker keeps
its records through `run_once` in its own scratch folder and records file, and the parent merges them as batches end.
Every run computes what it would alone: its seed, its threads, its device.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

Run = tuple[str, Callable[[Path], dict], dict]


def visible_gpus() -> list[str]:
    """The CUDA devices this process may use, as CUDA_VISIBLE_DEVICES names them."""
    import torch

    count = torch.cuda.device_count()
    named = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return named[:count] if named else [str(i) for i in range(count)]


def pin_gpu(counter, gpus: list[str]) -> None:
    """A worker's start: the next of `gpus` (round robin) is the only GPU it sees (cuda:0 to it)."""
    with counter.get_lock():
        index = counter.value
        counter.value += 1
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus[index % len(gpus)]


def _run_batch(runs: list[Run], work: Path, index: int, reuse_stale: bool) -> dict:
    """One worker: its runs in order, in its own scratch folder and records file; their records."""
    from pipeline.workdir import run_once

    records: dict[str, dict] = {}
    part = work / f"runs.part{index}.json"
    for key, run, diverged in runs:
        run_once(records, key, part, work / f"scratch.{index}", run, diverged=diverged, reuse_stale=reuse_stale)
    part.unlink(missing_ok=True)
    return records


def run_batches(batches: list[list[Run]], work: Path, jobs: int, reuse_stale: bool,
                on_done: Callable[[dict, int], None]) -> None:
    """`batches` over min(jobs, len(batches)) spawned processes; on_done(records, runs in the batch) in this process
    as each batch ends (its records are the batch's runs by key)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    if not batches:
        return
    context = multiprocessing.get_context("spawn")
    gpus = visible_gpus()  # several: each process its own (round robin), before it touches CUDA
    pin = dict(initializer=pin_gpu, initargs=(context.Value("i", 0), gpus)) if len(gpus) > 1 else {}
    with ProcessPoolExecutor(max_workers=min(jobs, len(batches)), mp_context=context, **pin) as pool:
        futures = {pool.submit(_run_batch, runs, work, i, reuse_stale): len(runs) for i, runs in enumerate(batches)}
        for future in as_completed(futures):
            on_done(future.result(), futures[future])
