"""Base deviations lent to the shots (ours): extract.deviations keeps base training maps minus their class mean, and
incremental.deviation_prob adds one of them to novel rows of a session's batches, never to base rows."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from pipeline.config import load_config
from pipeline.data.augment import test_transform
from pipeline.data.mixing import deviation_draws, lend_deviations
from pipeline.data.pack import ImagePack
from pipeline.data.presets import get_preset
from pipeline.errors import FSCILError
from pipeline.research.selection import select, selection_order
from pipeline.research.selection_config import SelectionConfig
from pipeline.seeding import seeded_generator
from pipeline.store.feature_store import FeatureStore
from pipeline.training.base_model import load_base_model
from pipeline.training.checkpoint import load_checkpoint
from pipeline.training.extract import extract_features
from pipeline.training.incremental_session import STATE_FILE, train_session
from tests.pipeline_fixtures import write_params


def _lend(prob: float, seed: int = 0):
    x = torch.arange(8 * 2, dtype=torch.float32).reshape(8, 2, 1, 1)
    is_base = torch.tensor([True, False, True, False, False, True, False, False])
    deviations = torch.tensor([[1000.0, 0.0], [0.0, 2000.0], [-3000.0, 3000.0]])[:, :, None, None]
    draws = deviation_draws(8, prob, len(deviations), seeded_generator(seed, 5))
    return x, is_base, deviations, lend_deviations(x, is_base, deviations, draws)


def test_lend_deviations_adds_one_stored_deviation_to_novel_rows_only():
    x, is_base, deviations, out = _lend(1.0)
    assert torch.equal(out[is_base], x[is_base])  # the base group is never changed
    added = (out - x)[~is_base].reshape(-1, 2)
    stored = deviations.reshape(-1, 2)
    # every novel row got exactly one stored deviation (each distinct, so the match is unique)
    assert all(int((stored == row).all(dim=1).sum()) == 1 for row in added)
    assert len({tuple(r.tolist()) for r in added}) > 1  # drawn per row, not one for the batch
    x, is_base, _, out = _lend(0.0)
    assert torch.equal(out, x)
    _, _, _, half = _lend(0.5)
    changed = ((half - x).reshape(8, -1) != 0).any(dim=1)
    assert not changed[is_base].any() and 0 < int(changed.sum()) < int((~is_base).sum())
    assert torch.equal(half, _lend(0.5)[3]) and not torch.equal(half, _lend(0.5, seed=1)[3])  # seeded


def test_deviation_params_are_checked(tmp_path):
    with pytest.raises(FSCILError, match="incremental.deviation_prob needs base deviations"):
        load_config(write_params(tmp_path / "p.yaml", incremental={"deviation_prob": 0.5}))
    with pytest.raises(FSCILError, match="incremental.deviation_prob must be in"):
        load_config(write_params(tmp_path / "p.yaml", extract={"deviations": 2}, incremental={"deviation_prob": 1.5}))
    with pytest.raises(FSCILError, match="extract.deviations must be >= 0"):
        load_config(write_params(tmp_path / "p.yaml", extract={"deviations": -1}))
    cfg = load_config(write_params(tmp_path / "p.yaml", extract={"deviations": 2}, incremental={"deviation_prob": 0.5}))
    assert (cfg.extract.deviations, cfg.incremental.deviation_prob) == (2, 0.5)
    # every digest hashes them, at their defaults too (a run reads them)
    plain = load_config(write_params(tmp_path / "q.yaml"))
    assert plain.to_dict(for_digest=True)["extract"]["deviations"] == 0
    assert plain.to_dict(for_digest=True)["incremental"]["deviation_prob"] == 0.0


def test_selection_tries_deviation_prob_in_its_schedule_stage(tiny_run, tmp_path):
    order = [key for _, key, _, _ in selection_order(SelectionConfig(mixup_prob=[0.0, 0.5],
                                                                     deviation_prob=[0.0, 0.5]))]
    assert order[:3] == ["incremental.mixup_prob", "incremental.deviation_prob", "incremental.freeze_base"]
    _, params, paths = tiny_run
    cfg = load_config(params)  # extract.deviations 0: a candidate > 0 could not run
    with pytest.raises(FSCILError, match=r"selection candidate incremental.deviation_prob=0.5: "
                                         "incremental.deviation_prob needs base deviations"):
        select(cfg, paths.pack, tmp_path / "out", SelectionConfig(deviation_prob=[0.0, 0.5]),
               work_dir=tmp_path / "work")
    assert not (tmp_path / "work").exists()


def test_extract_keeps_base_deviations_and_sessions_lend_them(tiny_run, tmp_path):
    _, params, paths = tiny_run
    cfg = load_config(params)
    cfg = dataclasses.replace(cfg, extract=dataclasses.replace(cfg.extract, deviations=2))
    store_path = tmp_path / "features.zarr"
    extract_features(cfg, paths.pack, paths.base, store_path, show_progress=False)
    store, plain = FeatureStore.open(store_path), FeatureStore.open(paths.features)
    assert plain.base_deviations() is None
    deviations = store.base_deviations()
    classes = np.asarray(store.root["memory/base_deviation_classes"])
    means, mean_classes = store.base_means()
    assert (np.bincount(classes, minlength=len(mean_classes)) == 2).all()  # 2 per base class
    # oracle: each deviation plus its class mean is one of that class's own base training maps (a direct forward of
    # the base images under the test transform): nothing from a test image or a novel class
    with torch.no_grad(), ImagePack.open(paths.pack) as pack:
        model, _, _ = load_base_model(cfg, paths.base, pack.content_hash)
        ids = np.asarray(pack.protocol.sessions[0].train_ids)
        direct = model.eval().backbone(test_transform(torch.from_numpy(pack.read_images(ids)),
                                                      get_preset(pack.preset, pack.image_size))).numpy()
        labels = pack.labels[ids]
    slot = {int(c): i for i, c in enumerate(mean_classes)}
    matched = []
    for d, c in zip(deviations, classes, strict=True):
        gaps = np.abs(direct[labels == c] - (d + means[slot[int(c)]])).reshape(int((labels == c).sum()), -1).max(1)
        assert gaps.min() < 1e-4
        matched.append((int(c), int(gaps.argmin())))
    assert len(set(matched)) == len(matched)  # two different maps per class
    assert np.abs(deviations).max() > 1e-3  # real spread, not zeros

    # a session at deviation_prob 0 on this store trains exactly as on the plain store (the option draws nothing
    # then); at 1 every novel row is lent a deviation, so the trained weights differ
    def session(prob: float, store_at, out):
        run = dataclasses.replace(cfg, incremental=dataclasses.replace(cfg.incremental, deviation_prob=prob))
        result = train_session(run, 1, store_at, paths.base, None, out, show_progress=False)
        return result, load_checkpoint(out / STATE_FILE)[0]

    reference = json.loads((paths.session(1) / "metrics.json").read_text())
    zero, zero_state = session(0.0, store_path, tmp_path / "p0")
    assert zero["history"] == reference["history"] and zero["acc"] == reference["acc"]
    lent, lent_state = session(1.0, store_path, tmp_path / "p1")
    assert lent["train_samples"] == zero["train_samples"]  # the same rows, seen with deviations
    assert any(not torch.equal(zero_state[k], lent_state[k]) for k in zero_state if k.startswith("adapting."))
    with pytest.raises(FSCILError, match="extracted without base deviations"):
        session(0.5, paths.features, tmp_path / "p2")
    assert not (tmp_path / "p2").exists()
