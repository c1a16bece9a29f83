"""Every random stream of a run comes from one helper: a torch.Generator seeded by the run's seed and the stream's
offset, so streams never share draws and a result depends on (seed, stream) only."""

from __future__ import annotations

import torch

# offsets of the streams (primes keep them apart for any seed)
BASE_EPOCH_ORDER = 1 * 7919  # + epoch: base-session shuffling
BASE_STEP_AUGMENT = 2 * 7919  # + step: base-session augmentation (and on the CPU its Mixup/CutMix draws)
BASE_STEP_MIX = 86_028_121  # + step: on a GPU, the host-side Mixup/CutMix draws of a base step (a CPU generator)
EXTRACT_VIEW = 104_729  # + view: augmented views of the few-shot images in the feature store
SESSION = 15_485_863  # x session: incremental session shuffling and feature mixup
MEMORY = 32_452_843  # + session (0: the base classes, at extract): the random / sampled class memory
DEVIATION = 49_979_687  # + session (0: which base maps the store keeps, at extract): base deviations lent to shots


def seeded_generator(seed: int, offset: int, device: torch.device | str = "cpu") -> torch.Generator:
    """torch.Generator on `device` seeded with (seed * 1_000_003 + offset) mod 2^62."""
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + offset) % (2**62))
