"""`fscil speed`: every stage of one run, timed in this process on a scratch folder: wall seconds, peak GPU memory
and what a stage measures itself (base training images per second), so a user knows before a long run what each
stage of a preset costs on their machine. With `data.source: synthetic` a paper preset runs at its own shape
without its dataset."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd

from pipeline.config import Config, check_against_data
from pipeline.data.pack import ImagePack
from pipeline.report import write_report
from pipeline.research.study import cached_pack
from pipeline.training.base_session import base_stage
from pipeline.training.extract import extract_stage
from pipeline.training.incremental_session import session_stage
from pipeline.training.runtime import run_device


@contextlib.contextmanager
def _timed(rows: list[dict], stage: str, device, say: Callable[[str], None]) -> Iterator[dict]:
    """One row of the table: the stage's wall seconds (the device synchronised at both ends) and, on CUDA, its peak
    allocated memory; the block may add columns to the yielded row."""
    import torch

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    row = {"stage": stage}
    started = time.perf_counter()
    yield row
    if cuda:
        torch.cuda.synchronize(device)
    row["seconds"] = round(time.perf_counter() - started, 2)
    row["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20) if cuda else None
    rows.append(row)
    say(f"speed: {stage} {row['seconds']:.1f} s" + (f", peak {row['peak_gpu_mib']} MiB" if cuda else ""))


def time_stages(cfg: Config, work: Path, say: Callable[[str], None] | None = None,
                pack_cache: Path | None = None, base_epochs: int | None = None) -> pd.DataFrame:
    """prepare, base, extract, each session and report of `cfg` into `work` (the same stage functions `dvc repro`
    runs, in one process: no interpreter start-up or DVC bookkeeping per stage); one row per stage, then the
    sessions' total and the whole run's. pack_cache: a folder keeping the image pack of each data section, so runs
    on the same data (another profile, say) build it once (their prepare row says `cached`). base_epochs: train
    only the first epochs of the base schedule (whole passes of base.repeat; the schedule is the config's own), and
    add the whole run's estimate: the remaining epochs at the median seconds an epoch took."""
    say = say or (lambda line: None)
    device = run_device(cfg)
    rows: list[dict] = []
    check = functools.partial(check_against_data, cfg)
    with _timed(rows, "prepare", device, say) as row:
        pack, built = cached_pack(cfg, pack_cache or work, check)
        if built is None:
            with ImagePack.open(pack) as stored:
                check(stored.protocol)
        row.update(images=built["images"] if built else None, cached=built is None)
    with _timed(rows, "base", device, say) as row:
        base = base_stage(cfg, pack, work / "base", work / "base.resume", show_progress=False,
                          epoch_limit=base_epochs)
        row.update(epochs=base["epochs"], images_per_second=base["images_per_second"], acc=base["acc"])
    with _timed(rows, "extract", device, say):
        extract_stage(cfg, pack, work / "base", work / "features.zarr", show_progress=False, progress_lines=False)
    results, prev = [base], None
    for session in range(1, base["num_sessions"]):
        out = work / "sessions" / f"session_{session}"
        with _timed(rows, f"session {session}", device, say) as row:
            results.append(session_stage(cfg, session, work / "features.zarr", work / "base", prev, out,
                                         show_progress=False, progress_lines=False))
            row["acc"] = results[-1]["acc"]
        prev = out
    with _timed(rows, "report", device, say):
        write_report(results, work / "metrics.json", work / "report", f"speed: {cfg.method}")
    table = pd.DataFrame(rows)
    sessions = table[table.stage.str.startswith("session ")]
    totals = [{"stage": "sessions (all)", "seconds": round(sessions.seconds.sum(), 2),
               "peak_gpu_mib": sessions.peak_gpu_mib.max()},
              {"stage": "total", "seconds": round(table.seconds.sum(), 2), "peak_gpu_mib": table.peak_gpu_mib.max()}]
    if base["epochs"] < cfg.base.epochs:  # cut short by base_epochs: the rest of the schedule at the measured pace
        rest = (cfg.base.epochs - base["epochs"]) * base["seconds_per_epoch"]
        totals.append({"stage": f"total, {cfg.base.epochs} base epochs (estimated)", "epochs": cfg.base.epochs,
                       "seconds": round(table.seconds.sum() + rest, 2)})
    return pd.concat([table, pd.DataFrame(totals)], ignore_index=True)


def device_label(device) -> str:
    """The device in words: the GPU's name, or the CPU with the threads it runs."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({torch.get_num_threads()} threads)"


def speed_markdown(table: pd.DataFrame, cfg: Config, device: str) -> str:
    """The table as Markdown, headed by what ran where (preset, method, data, profile, device)."""
    return (f"`fscil speed`: preset {cfg.preset}, {cfg.method}, data {cfg.data.dataset} (source {cfg.data.source}), "
            f"precision {cfg.precision}, deterministic {str(cfg.deterministic).lower()}, on {device}\n\n"
            + table.astype(object).where(table.notna(), None).to_markdown(index=False, missingval="-") + "\n")
