"""ClassMeanMemory: one class-mean backbone map per learned class (paper eq. memory)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class ClassMeanMemory:
    maps: np.ndarray  # (M, C, H, W) float32
    classes: np.ndarray  # (M,) int64

    @classmethod
    def empty(cls, map_shape: tuple[int, int, int]) -> ClassMeanMemory:
        return cls(np.zeros((0, *map_shape), dtype=np.float32), np.zeros(0, dtype=np.int64))

    @staticmethod
    def class_means(maps: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean map of each class present in `labels`, classes sorted: ((k, C, H, W), (k,))."""
        classes = np.unique(labels)
        means = np.stack([maps[labels == c].astype(np.float64).mean(axis=0) for c in classes]).astype(np.float32)
        return means, classes.astype(np.int64)

    def added(self, maps: np.ndarray, labels: np.ndarray) -> ClassMeanMemory:
        """A new memory with the class means of (maps, labels) appended; classes must be new."""
        means, classes = self.class_means(maps, labels)
        if np.isin(classes, self.classes).any():
            raise ValueError("classes already in memory")
        return ClassMeanMemory(np.concatenate([self.maps, means]), np.concatenate([self.classes, classes]))

    def to_tensors(self, prefix: str = "memory") -> dict[str, torch.Tensor]:
        return {f"{prefix}.maps": torch.from_numpy(self.maps), f"{prefix}.classes": torch.from_numpy(self.classes)}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str = "memory") -> ClassMeanMemory:
        return cls(tensors[f"{prefix}.maps"].numpy(), tensors[f"{prefix}.classes"].numpy())
