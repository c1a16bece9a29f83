"""One helper for every random stream: the seeds it gives are the documented formula, distinct per stream."""

from __future__ import annotations

import torch

from pipeline.seeding import BASE_EPOCH_ORDER, BASE_STEP_AUGMENT, BASE_STEP_MIX, EXTRACT_VIEW, SESSION, seeded_generator


def test_seeds_follow_the_formula_and_streams_differ():
    for seed in (0, 1, 7):
        offsets = [BASE_EPOCH_ORDER + e for e in range(50)] + [BASE_STEP_AUGMENT + s for s in range(50)]
        offsets += [BASE_STEP_MIX + s for s in range(50)]
        offsets += [EXTRACT_VIEW + v for v in range(4)] + [SESSION * t for t in range(1, 11)]
        seeds = [seeded_generator(seed, off).initial_seed() for off in offsets]
        assert seeds == [(seed * 1_000_003 + off) % 2**62 for off in offsets]
        assert len(set(seeds)) == len(seeds)  # no two streams of a run share a generator
    a, b = seeded_generator(0, SESSION), seeded_generator(0, SESSION)
    assert torch.equal(torch.rand(5, generator=a), torch.rand(5, generator=b))
