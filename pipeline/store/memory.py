"""ClassMemory: the stored backbone maps that stand for each learned class (paper eq. memory) and the rule that
picks them (params extract.memory, the paper's memory ablation; `MEMORY_RULES`, pipeline/store/registry.py): each
rule maps (labels, k, generator) to the rows it keeps, or None for the class means (so the extract stage draws the
rows before it computes a map).

The extract stage applies the rule to the base classes and records it in the feature store; every incremental
session applies the store's rule to its own classes' shots, with a generator seeded by (seed, session).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.store.registry import MEMORY_RULES


def drawn_rows(labels: np.ndarray, keep: int, gen: torch.Generator | None) -> np.ndarray:
    """Up to `keep` rows of each class of `labels` drawn from `gen`, grouped by class (classes sorted), each class's
    rows in the drawn order."""
    if gen is None:
        raise ValueError("drawing memory rows needs a generator")
    rows = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        order = torch.randperm(len(members), generator=gen).numpy()
        rows.append(members[order[:keep]])
    return np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)


def class_means(maps: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean map of each class present in `labels`, classes sorted: ((k, C, H, W), (k,))."""
    classes = np.unique(labels)
    means = np.stack([maps[labels == c].astype(np.float64).mean(axis=0) for c in classes]).astype(np.float32)
    return means, classes.astype(np.int64)


def mean_rule(labels: np.ndarray, k: int, gen: torch.Generator | None) -> None:
    """eq. memory: no rows kept, each class's mean map instead."""
    return None


def random_rule(labels: np.ndarray, k: int, gen: torch.Generator | None) -> np.ndarray:
    """One of each class's training maps, drawn at random."""
    return drawn_rows(labels, 1, gen)


def sampled_rule(labels: np.ndarray, k: int, gen: torch.Generator | None) -> np.ndarray:
    """k of each class's training maps (all of them when it has fewer), drawn at random."""
    return drawn_rows(labels, k, gen)


@dataclass
class ClassMemory:
    maps: np.ndarray  # (M, C, H, W) float32; one row per class (mean, random) or up to k (sampled)
    classes: np.ndarray  # (M,) int64

    @classmethod
    def empty(cls, map_shape: tuple[int, int, int]) -> ClassMemory:
        return cls(np.zeros((0, *map_shape), dtype=np.float32), np.zeros(0, dtype=np.int64))

    @classmethod
    def select(cls, maps: np.ndarray, labels: np.ndarray, kind: str = "mean", k: int = 1,
               gen: torch.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The maps the `kind` rule (`MEMORY_RULES`) keeps of (maps, labels): ((M, C, H, W), (M,))."""
        rows = MEMORY_RULES[kind](labels, k, gen)
        if rows is None:
            return class_means(maps, labels)
        return maps[rows].astype(np.float32), labels[rows].astype(np.int64)

    def added(self, maps: np.ndarray, labels: np.ndarray, kind: str = "mean", k: int = 1,
              gen: torch.Generator | None = None) -> ClassMemory:
        """A new memory with the `kind` rule's maps of (maps, labels) appended; classes must be new."""
        kept, classes = self.select(maps, labels, kind, k, gen)
        if np.isin(classes, self.classes).any():
            raise ValueError("classes already in memory")
        return ClassMemory(np.concatenate([self.maps, kept]), np.concatenate([self.classes, classes]))

    def to_tensors(self, prefix: str = "memory") -> dict[str, torch.Tensor]:
        return {f"{prefix}.maps": torch.from_numpy(self.maps), f"{prefix}.classes": torch.from_numpy(self.classes)}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str = "memory") -> ClassMemory:
        return cls(tensors[f"{prefix}.maps"].numpy(), tensors[f"{prefix}.classes"].numpy())
