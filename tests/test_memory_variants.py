"""Memory variants (paper's memory ablation): the class memory as the mean map, one random map or k sampled maps,
chosen by extract.memory, written by extract for the base classes and followed by every session for its own."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from pipeline.config import load_config
from pipeline.config.sections import ExtractConfig
from pipeline.data.augment import test_transform
from pipeline.data.pack import ImagePack
from pipeline.data.presets import get_preset
from pipeline.errors import FSCILError
from pipeline.seeding import seeded_generator
from pipeline.store.feature_store import FeatureStore
from pipeline.store.memory import ClassMemory
from pipeline.store.registry import MEMORY_RULES
from pipeline.training.base_model import load_base_model
from pipeline.training.checkpoint import load_checkpoint
from pipeline.training.extract import extract_features
from pipeline.training.incremental_session import STATE_FILE, train_session


def test_memory_rows_per_class_and_seeded():
    labels = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 2])
    rows = MEMORY_RULES["random"](labels, 4, seeded_generator(0, 1))
    assert labels[rows].tolist() == [0, 1, 2]
    rows = MEMORY_RULES["sampled"](labels, 3, seeded_generator(0, 1))
    assert labels[rows].tolist() == [0, 0, 0, 1, 1, 2, 2, 2] and len(set(rows.tolist())) == 8
    again = MEMORY_RULES["sampled"](labels, 3, seeded_generator(0, 1))
    other = MEMORY_RULES["sampled"](labels, 3, seeded_generator(1, 1))
    assert np.array_equal(rows, again) and not np.array_equal(rows, other)
    maps = np.arange(10, dtype=np.float32)[:, None, None, None] * np.ones((10, 2, 1, 1), dtype=np.float32)
    means, classes = ClassMemory.select(maps, labels)
    np.testing.assert_allclose(means[:, 0, 0, 0], [1.0, 3.5, 7.0])
    with pytest.raises(FSCILError, match="extract.memory"):
        ExtractConfig(memory="median")


def _rows_in(kept: np.ndarray, pool: np.ndarray) -> list[int]:
    """For each kept map, the index of the identical map in `pool` (fails when there is none)."""
    flat = pool.reshape(len(pool), -1)
    out = []
    for m in kept.reshape(len(kept), -1):
        hits = np.flatnonzero((flat == m).all(axis=1))
        assert len(hits) >= 1
        out.append(int(hits[0]))
    return out


@pytest.mark.parametrize("kind,k", [("random", 1), ("sampled", 2)])
def test_extract_and_sessions_follow_the_memory_rule(tiny_run, tmp_path, kind, k):
    root, params, paths = tiny_run
    cfg = load_config(params)
    cfg = dataclasses.replace(cfg, extract=dataclasses.replace(cfg.extract, memory=kind, memory_k=k,
                                                                augmented_views=0))
    store_path = tmp_path / "features.zarr"
    extract_features(cfg, paths.pack, paths.base, store_path, show_progress=False)
    store, mean_store = FeatureStore.open(store_path), FeatureStore.open(paths.features)
    assert store.memory_rule == (kind, k)
    maps, classes = store.base_memory()
    means, mean_classes = store.base_means()
    np.testing.assert_allclose(means, mean_store.base_means()[0], rtol=1e-5, atol=1e-6)  # NCM keeps the means
    counts = np.bincount(classes, minlength=len(mean_classes))
    assert (counts == k).all()  # k maps per base class (each has more than k training images)
    # each memory map is one of its class's base training maps: a sample, not a mean
    with torch.no_grad():
        with ImagePack.open(paths.pack) as pack:
            model, _, _ = load_base_model(cfg, paths.base, pack.content_hash)
            ids = np.asarray(pack.protocol.sessions[0].train_ids)
            direct = model.eval().backbone(test_transform(torch.from_numpy(pack.read_images(ids)),
                                                          get_preset(pack.preset, pack.image_size))).numpy()
            labels = pack.labels[ids]
    for m, c in zip(maps, classes, strict=True):
        pool = direct[labels == c]
        assert np.abs(pool - m).reshape(len(pool), -1).max(axis=1).min() < 1e-4
    assert not np.allclose(maps[::k], means, atol=1e-3)

    out = tmp_path / "s1"
    result = train_session(cfg, 1, store_path, paths.base, None, out, show_progress=False)
    shots, shot_labels, _ = store.fewshot(1)
    # the training set: the shots + each base class's k memory rows, base_copy times (eq. batch_split)
    assert result["train_samples"] == len(shot_labels) + len(classes) * cfg.incremental.session_value("base_copy", 1)
    memory = ClassMemory.from_tensors(load_checkpoint(out / STATE_FILE)[0])
    assert sorted(np.unique(memory.classes).tolist()) == sorted(np.unique(shot_labels).tolist())
    assert (np.bincount(memory.classes)[np.unique(shot_labels)] == min(k, np.bincount(shot_labels).max())).all()
    _rows_in(memory.maps, shots)  # each novel memory map is one of the session's own shots
    # a session of another memory rule does not continue from this one
    with pytest.raises(FSCILError, match="memory does not match"):
        train_session(cfg, 2, paths.features, paths.base, out, tmp_path / "s2", show_progress=False)
    # the prototype baseline still uses class means: it equals the one of the mean-rule run
    mean_metrics = json.loads((paths.session(1) / "metrics.json").read_text())
    assert result["prototype"]["backbone"]["acc"] == mean_metrics["prototype"]["backbone"]["acc"]
