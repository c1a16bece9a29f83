"""Session diagnostics (paper Fig. selective_scan): recomputed sample by sample with numpy from the tiny run's store
and checkpoints, and the report's pictures and columns that carry them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.config import load_config
from pipeline.models.fscil import build_head
from pipeline.report import ARRAYS_FILE, DIAGNOSTICS
from pipeline.store.feature_store import FeatureStore
from pipeline.training.checkpoint import load_checkpoint, unprefixed
from tests.pipeline_fixtures import NUM_SESSIONS


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _session_model(params, paths, session):
    """The projector and classifier as they are after `session`, rebuilt from the checkpoints."""
    cfg = load_config(params)
    store = FeatureStore.open(paths.features)
    tensors, meta = load_checkpoint(paths.base / "model.safetensors")
    projector, classifier = build_head(cfg.model, *store.map_shape[:1], store.map_shape[1:], meta["num_classes"])
    projector.load_state_dict(unprefixed(tensors, "projector"))
    state, _ = load_checkpoint(paths.session(session) / "state.safetensors")
    if not cfg.incremental.freeze_base:
        projector.load_state_dict({**projector.state_dict(), **unprefixed(state, "projector")})
    projector.adapting_branch.load_state_dict(unprefixed(state, "adapting"))
    classifier.load_state_dict(unprefixed(state, "classifier"))
    return projector.eval(), classifier.eval(), store


@pytest.mark.parametrize("session", [1, NUM_SESSIONS])
def test_diagnostics_equal_a_sample_by_sample_recomputation(tiny_run, session):
    root, params, paths = tiny_run
    metrics = json.loads((paths.session(session) / "metrics.json").read_text())
    projector, classifier, store = _session_model(params, paths, session)
    num_seen = metrics["num_seen_classes"]
    num_base = len(store.base_means()[1])
    maps, labels = store.test_set(max_label=num_seen)
    feats, energy, params_mean = [], [], {k: [] for k in ("B", "C", "delta")}
    with torch.no_grad():
        for i in range(len(labels)):  # one sample at a time, float64 numpy from here on
            out = projector.session_outputs(torch.from_numpy(maps[i:i + 1]))
            feats.append(out.mu[0].double().numpy())
            z = out.aux.z[0].double().numpy()
            energy.append((z ** 2).sum() / z.size)
            for key in params_mean:
                generated = getattr(out.aux, key)[0].double().numpy()
                params_mean[key].append(generated.reshape(-1, generated.shape[-1]).mean(0))
    mu, energy = np.stack(feats), np.array(energy)
    protos = classifier.prototypes(num_seen).double().numpy()
    base = labels < num_base
    expected = {"alignment": np.mean([_cos(mu[i], protos[labels[i]]) for i in np.flatnonzero(base)])}
    means = {c: mu[labels == c].mean(0) for c in range(num_seen)}
    expected["base_novel_similarity"] = np.mean([_cos(means[b], means[n]) for b in range(num_base)
                                                 for n in range(num_base, num_seen)])
    expected["z_energy_base"], expected["z_energy_novel"] = energy[base].mean(), energy[~base].mean()
    for key, values in params_mean.items():
        values = np.stack(values)
        expected[f"{key}_cosine"] = _cos(values[base].mean(0), values[~base].mean(0))
    got = metrics["diagnostics"]
    assert set(got) == set(expected) == set(DIAGNOSTICS)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert -1 <= got["alignment"] <= 1 and got["z_energy_base"] > 0

    arrays = np.load(paths.session(session) / ARRAYS_FILE)
    np.testing.assert_array_equal(arrays["labels"], labels)
    np.testing.assert_allclose(arrays["features"], mu, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(arrays["z_rms"], np.sqrt(energy), rtol=1e-4)
    assert int(arrays["num_base"]) == num_base
    # B activation maps: per token ||B_t|| of g_base and g_inc, each path's token back at its (row, column)
    shown = arrays["b_labels"]
    assert (shown < num_base).sum() >= 1 and (shown >= num_base).sum() >= 1
    rows = [int(np.flatnonzero(labels == c)[0]) for c in shown]
    f = torch.from_numpy(maps[rows])
    h, w = maps.shape[2:]
    for col, branch in enumerate((projector.g_base, projector.g_inc)):
        with torch.no_grad():
            b = branch(f, return_aux=True)[1].B.double().numpy()  # (n, K, L, d_state), scan order
        k = b.shape[1]
        expected = np.zeros((len(rows), h, w))
        for path in range(k):
            for t in range(h * w):  # the token path `path` visits at step t (pipeline/ops/cross_scan.py)
                i = t if path == 0 else h * w - 1 - t if path == 1 else None
                if path >= 2:
                    j = t if path == 2 else h * w - 1 - t
                    r, c = j % h, j // h
                else:
                    r, c = i // w, i % w
                expected[:, r, c] += np.linalg.norm(b[:, path, t], axis=-1) / k
        np.testing.assert_allclose(arrays["b_maps"][:, col], expected, rtol=1e-4, atol=1e-6)


def test_report_carries_the_diagnostics_and_draws_every_picture(tiny_run):
    root, _, paths = tiny_run
    import pandas as pd

    table = pd.read_csv(paths.report / "sessions.csv")
    for session in range(1, NUM_SESSIONS + 1):
        got = json.loads((paths.session(session) / "metrics.json").read_text())["diagnostics"]
        row = table[table["session"] == session].iloc[0]
        assert all(row[f"diag_{k}"] == pytest.approx(v) for k, v in got.items())
    assert table.loc[table["session"] == 0, [f"diag_{k}" for k in DIAGNOSTICS]].isna().all().all()
    for name in ("accuracy.png", "diagnostics.png", "z_histogram.png", "tsne.png", "b_maps.png"):
        assert (paths.report / name).read_bytes()[:4] == b"\x89PNG", name


def test_tsne_is_seeded_and_subsamples():
    from pipeline.plots import tsne_embedding

    features = np.random.default_rng(0).normal(size=(60, 8))
    rows, xy = tsne_embedding(features, seed=1, max_points=40)
    assert len(rows) == 40 == len(np.unique(rows)) and xy.shape == (40, 2)
    rows2, xy2 = tsne_embedding(features, seed=1, max_points=40)
    np.testing.assert_array_equal(rows, rows2)
    np.testing.assert_allclose(xy, xy2)
