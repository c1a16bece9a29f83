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


def mmcv_cosine_cooldown(iteration: int, max_iters: int, warmup_iters: int, warmup_ratio: float, min_ratio: float,
                         cooldown_iters: int, cooldown_ratio: float) -> float:
    """Multiplier of the peak lr under mmcv's `CosineAnnealingCooldownLrUpdaterHook` by iteration with linear
    warm-up (the authors' `mmcls/core/hook/lr_updater.py` on mmcv's `LrUpdaterHook`), at mmcv's iteration count:

        regular = min + (1 - min) (1 + cos(pi iteration / (max_iters - cooldown_iters))) / 2,
                  or cooldown_ratio * min for iteration > max_iters - cooldown_iters;
        iteration < warmup_iters: regular * (1 - (1 - iteration / warmup_iters) (1 - warmup_ratio)),

    the warm-up multiplying the cosine value (not replacing it). The authors' session loop counts iterations from 1
    (its runner steps before the hook), so session step s (0-based) is iteration s + 1.
    """
    span = max_iters - cooldown_iters
    if iteration > span:
        regular = cooldown_ratio * min_ratio
    else:
        regular = min_ratio + 0.5 * (1.0 - min_ratio) * (math.cos(math.pi * iteration / span) + 1)
    return regular * mmcv_warmup(iteration, warmup_iters, warmup_ratio)


def mmcv_warmup(iteration: int, warmup_iters: int, warmup_ratio: float) -> float:
    """mmcv's linear warm-up factor (`LrUpdaterHook.get_warmup_lr`): 1 - (1 - iteration / warmup_iters) (1 -
    warmup_ratio) before warmup_iters, then 1; it multiplies the scheduled value."""
    if iteration < warmup_iters:
        return 1.0 - (1.0 - iteration / warmup_iters) * (1.0 - warmup_ratio)
    return 1.0


def mmcv_step(iteration: int, epoch: int, warmup_iters: int, warmup_ratio: float, step_epochs: list[int],
              gamma: float) -> float:
    """Multiplier of the peak lr under mmcv's `StepLrUpdaterHook` by epoch with linear warm-up by iteration (the
    authors' miniImageNet base schedule): gamma ** (the step epochs reached by `epoch`, 0-based) times
    `mmcv_warmup` at mmcv's iteration count (0-based in base training)."""
    return gamma ** sum(epoch >= s for s in step_epochs) * mmcv_warmup(iteration, warmup_iters, warmup_ratio)


# ---- the lr multiplier of incremental step `step` (0-based) of `steps` (`SCHEDULES`, incremental.schedule) ----
def session_warmup_cosine(inc, step: int, steps: int) -> float:
    """Ours: steps from 0, warm-up to the peak, then cosine."""
    return warmup_cosine(step, steps, inc.warmup_steps, inc.warmup_ratio, inc.min_lr_ratio)


def session_mmcv_cosine_cooldown(inc, step: int, steps: int) -> float:
    """The authors' session loop: mmcv's hook at iteration step + 1, cool-down at the end."""
    return mmcv_cosine_cooldown(step + 1, steps, inc.warmup_steps, inc.warmup_ratio, inc.min_lr_ratio,
                                inc.cooldown_steps, inc.cooldown_ratio)


# ---- the lr multiplier of base step `step` (0-based, mmcv's iteration) of `total` in `epoch` (`BASE_SCHEDULES`) ----
def base_warmup_cosine(base, step: int, total: int, epoch: int) -> float:
    return warmup_cosine(step, total, base.warmup_steps, base.warmup_ratio, base.min_lr_ratio)


def base_mmcv_cosine_cooldown(base, step: int, total: int, epoch: int) -> float:
    return mmcv_cosine_cooldown(step, total, base.warmup_steps, base.warmup_ratio, base.min_lr_ratio,
                                base.cooldown_steps, base.cooldown_ratio)


def base_mmcv_step(base, step: int, total: int, epoch: int) -> float:
    return mmcv_step(step, epoch, base.warmup_steps, base.warmup_ratio, base.step_epochs, base.step_gamma)


def set_lr(optimizer, factor: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] * factor
