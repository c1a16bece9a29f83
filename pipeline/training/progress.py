"""Progress lines for the long stages: one plain line to stderr at most every `every` seconds (and at the end), with
elapsed time and ETA. They show under `dvc repro` and in logs, where bars do not: `--quiet` turns bars off, not these.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def clock(seconds: float) -> str:
    """1m05s, 2h03m, 42s."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class ProgressLog:
    """`update(done, **fields)` after each unit of `total` (units started at `start`, e.g. a resumed epoch)."""

    def __init__(self, name: str, total: int, unit: str, *, start: int = 0, every: float = 10.0,
                 enabled: bool = True, stream: TextIO | None = None) -> None:
        self.name, self.total, self.unit, self.start, self.every = name, total, unit, start, every
        self.enabled, self.stream = enabled, stream
        self.started = self.last = time.perf_counter()

    def update(self, done: int, **fields: object) -> None:
        """A line for the first unit, then at most one every `every` seconds, and for the last."""
        now = time.perf_counter()
        first = done == self.start + 1
        if not self.enabled or (now - self.last < self.every and done < self.total and not first):
            return
        self.last = now
        elapsed = now - self.started
        rate = elapsed / max(done - self.start, 1)
        shown = "  ".join(f"{k} {v}" for k, v in fields.items())
        line = (f"{self.name}: {self.unit} {done}/{self.total}  {shown}  elapsed {clock(elapsed)}  "
                f"ETA {clock(rate * (self.total - done))}")
        print(line.replace("    ", "  "), file=self.stream or sys.stderr, flush=True)


CHECK_EVERY = 20  # training steps between read-backs of their losses (each read-back waits for the device)


def drain(pending: list, done: int) -> tuple[list, int | None]:
    """The last steps' values (device tensors: a loss, or a row led by the loss) as Python numbers, read back at once
    (one wait for the device instead of one per step), `pending` emptied; and the number of the first of those steps
    whose loss is not finite (None when all are). `done`: steps done so far, the last of them included."""
    import math

    import torch

    values = torch.stack(pending).tolist()
    pending.clear()
    first = done - len(values)
    bad = next((first + i + 1 for i, v in enumerate(values) if not math.isfinite(v[0] if isinstance(v, list) else v)),
               None)
    return values, bad

