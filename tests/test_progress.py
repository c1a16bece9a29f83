"""Progress lines (pipeline/training/progress.py): what a user waiting on `dvc repro` sees."""

from __future__ import annotations

import io

from pipeline.training import progress as progress_module
from pipeline.training.progress import ProgressLog, clock


def test_clock():
    assert (clock(5), clock(65), clock(3725)) == ("5s", "1m05s", "1h02m")


def test_lines_come_first_then_every_n_seconds_and_last_with_an_eta(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: now[0])
    out = io.StringIO()
    log = ProgressLog("base", 10, "epoch", start=2, every=10.0, stream=out)
    for done in range(3, 11):  # a run resumed after epoch 2, 4 s an epoch
        now[0] += 4.0
        log.update(done, loss="0.5")
    lines = out.getvalue().splitlines()
    # epoch 3 (the first), then 10 s or more after the line before (6, 9), and epoch 10 (the last)
    assert [line.split()[2] for line in lines] == ["3/10", "6/10", "9/10", "10/10"]
    assert lines[0] == "base: epoch 3/10  loss 0.5  elapsed 4s  ETA 28s"  # 7 epochs left at 4 s each
    assert lines[-1].endswith("elapsed 32s  ETA 0s")
    silent = io.StringIO()
    ProgressLog("x", 3, "step", enabled=False, stream=silent).update(1)
    assert silent.getvalue() == ""
