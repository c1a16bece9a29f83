"""The lr schedules (pipeline/registry.py): a multiplier of the peak lr per step. A new schedule is its function in
pipeline/training/schedule.py plus one line here."""

from __future__ import annotations

from pipeline.registry import Registry

# incremental.schedule: (incremental section, step, steps) -> multiplier
SCHEDULES = Registry("session schedule", {
    "warmup_cosine": ("pipeline.training.schedule:session_warmup_cosine", "linear warm-up, then cosine (the paper)"),
    "mmcv_cosine_cooldown": ("pipeline.training.schedule:session_mmcv_cosine_cooldown",
                             "the authors' mmcv cosine with warm-up factor and cool-down steps"),
})

# base.schedule: (base section, step, total steps, epoch) -> multiplier
BASE_SCHEDULES = Registry("base schedule", {
    "warmup_cosine": ("pipeline.training.schedule:base_warmup_cosine", "linear warm-up, then cosine"),
    "mmcv_cosine_cooldown": ("pipeline.training.schedule:base_mmcv_cosine_cooldown",
                             "mmcv's cosine by iteration with cool-down (the authors' CIFAR-100, CUB-200)"),
    "mmcv_step": ("pipeline.training.schedule:base_mmcv_step", "mmcv's step decay by epoch (the authors' mini)"),
})
