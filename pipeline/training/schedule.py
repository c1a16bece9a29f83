"""Learning-rate schedules as pure functions of the step, so a resumed run continues the same curve."""

from __future__ import annotations

import math


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, warmup_ratio: float = 0.0,
                  min_ratio: float = 0.0) -> float:
    """Multiplier of the peak lr at `step` (0-based): linear warm-up from warmup_ratio to 1, then cosine down to
    min_ratio at total_steps."""
    if warmup_steps > 0 and step < warmup_steps:
        return warmup_ratio + (1.0 - warmup_ratio) * step / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer, factor: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] * factor
