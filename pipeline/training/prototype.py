"""Prototype baseline: cosine nearest-class-mean (NCM) on the seen classes, next to every session's own metrics.

Two feature spaces, each with no training and no classifier head:
- "backbone":  the frozen backbone maps, global-average pooled, (N, C, H, W) -> (N, C);
- "projector": the projector's output mu (N, D') after the session (mode "incremental"; "base" for session 0).
Class k's prototype is its class-mean map mapped into that space. The store keeps only the class-mean map of a base
class, so the projector prototypes are the projector's output on the class-mean maps (of every class, base or
novel, for one rule), not the mean of the projected samples.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.models.projector import Projector
from pipeline.store.feature_store import FeatureStore
from pipeline.store.memory import ClassMemory
from pipeline.training.checkpoint import unprefixed
from pipeline.training.evaluate import session_metrics


def ncm_predict(prototypes: torch.Tensor, test: torch.Tensor) -> np.ndarray:
    """Cosine NCM. prototypes (K, D), row k = class k; test (N, D) -> predicted classes (N,) in 0..K-1."""
    cosines = F.normalize(test.float(), dim=1) @ F.normalize(prototypes.float(), dim=1).T  # (N, K)
    return cosines.argmax(dim=1).cpu().numpy()


def pooled(maps: np.ndarray) -> torch.Tensor:
    """Global average pooling: (N, C, H, W) numpy -> (N, C) tensor."""
    return torch.from_numpy(maps.mean(axis=(2, 3), dtype=np.float32))


@torch.no_grad()
def projected(projector: Projector, maps: np.ndarray, mode: str, device, batch_size: int) -> torch.Tensor:
    """Projector output mu on the CPU: (N, C, H, W) numpy -> (N, D')."""
    projector.eval()
    parts = [projector(torch.from_numpy(maps[i:i + batch_size]).to(device), mode=mode).mu.cpu()
             for i in range(0, len(maps), batch_size)]
    return torch.cat(parts)


def session_ordered(memory: ClassMemory, num_seen: int) -> np.ndarray:
    """The memory's class-mean maps (num_seen, C, H, W), row k = class k; the classes must be 0..num_seen-1."""
    order = np.argsort(memory.classes)
    if not np.array_equal(memory.classes[order], np.arange(num_seen)):
        raise ValueError(f"class-mean maps cover classes {sorted(memory.classes.tolist())}, not 0..{num_seen - 1}")
    return memory.maps[order]


def ncm_metrics(class_maps: np.ndarray, projector: Projector, mode: str, store: FeatureStore, num_base: int,
                device, batch_size: int) -> dict:
    """{"backbone": metrics, "projector": metrics} of NCM with class_maps (K, C, H, W), row k = class k, on the
    test maps of classes 0..K-1. Metrics are `session_metrics` without the per-class list."""
    num_seen = len(class_maps)
    test_maps, labels = store.test_set(max_label=num_seen)
    spaces = {
        "backbone": (pooled(class_maps), pooled(test_maps)),
        "projector": (projected(projector, class_maps, mode, device, batch_size),
                      projected(projector, test_maps, mode, device, batch_size)),
    }
    result = {}
    for name, (prototypes, test) in spaces.items():
        metrics = session_metrics(ncm_predict(prototypes, test), labels, num_base, num_seen)
        metrics.pop("per_class_acc")
        result[name] = metrics
    return result


def prototype_metrics(projector: Projector, store: FeatureStore, session: int, num_seen: int, num_base: int, device,
                      batch_size: int) -> dict:
    """NCM after incremental session t: every seen class's prototype is its class-mean map (the base classes' from
    the store, each novel class's the mean of its stored shots), whatever the sessions' memory rule."""
    maps, labels = store.shots_before(session + 1)
    means = ClassMemory(*store.base_means()).added(maps, labels)
    return ncm_metrics(session_ordered(means, num_seen), projector, "incremental", store, num_base, device,
                       batch_size)


def base_prototype_metrics(model_cfg, base_tensors: dict[str, torch.Tensor], store: FeatureStore, device,
                           batch_size: int) -> dict:
    """NCM after the base session (session 0): base classes only, the frozen base projector (rebuilt from the base
    checkpoint's tensors, since single_ssm adapts g_base later) in mode "base"."""
    c, h, w = store.map_shape
    projector = Projector.from_config(model_cfg, c, (h, w)).to(device)
    projector.load_state_dict(unprefixed(base_tensors, "projector"))
    base = ClassMemory(*store.base_means())
    num_base = len(base.classes)
    return ncm_metrics(session_ordered(base, num_base), projector, "base", store, num_base, device, batch_size)
