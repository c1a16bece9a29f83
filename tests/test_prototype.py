"""The prototype (cosine nearest-class-mean) baseline: hand-computed NCM, session metrics recomputed from the
store with numpy, and the report's columns / summary."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.config import load_config
from pipeline.models.fscil import build_head
from pipeline.report import write_report
from pipeline.store.feature_store import FeatureStore
from pipeline.training.checkpoint import load_checkpoint, unprefixed
from pipeline.training.prototype import ncm_predict
from tests.pipeline_fixtures import NUM_SESSIONS

NUM_BASE, WAYS = 8, 2
PROTO_COLUMNS = [f"proto_{space}_{name}" for space in ("backbone", "projector")
                 for name in ("acc", "base_acc", "novel_acc", "novel_as_base", "base_as_novel")]


def test_ncm_is_cosine_not_euclidean():
    prototypes = torch.tensor([[10.0, 0.0], [1.0, 1.0], [0.0, 5.0]])
    test = torch.tensor([[5.0, 1.0], [0.3, 2.0], [-1.0, 0.2]])
    # angles: prototypes at 0, 45 and 90 degrees; tests at 11.3, 81.5 and 168.7 degrees (cosines with p0, p1, p2:
    # 0.98/0.83/0.20, 0.15/0.77/0.99, -0.98/-0.55/0.20), while p1 = (1, 1) is the Euclidean-nearest of all three
    assert ncm_predict(prototypes, test).tolist() == [0, 2, 2]
    assert torch.cdist(test, prototypes).argmin(dim=1).tolist() == [1, 1, 1]
    assert ncm_predict(prototypes * torch.tensor([[0.1], [7.0], [3.0]]), 5 * test).tolist() == [0, 2, 2]


def _cosine_metrics(prototypes: np.ndarray, test: np.ndarray, labels: np.ndarray) -> dict:
    """Cosine argmax in numpy; accuracies in % (all / base / novel) and the errors across the base / novel line."""
    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    pred = (unit(test) @ unit(prototypes).T).argmax(axis=1)
    correct = pred == labels
    base = labels < NUM_BASE
    novel = ~base
    return {"acc": 100 * correct.mean(), "base_acc": 100 * correct[base].mean(),
            "novel_acc": 100 * correct[novel].mean() if novel.any() else None,
            "novel_as_base": 100 * (pred[novel] < NUM_BASE).mean() if novel.any() else None,
            "base_as_novel": 100 * (pred[base] >= NUM_BASE).mean()}


def _class_mean_maps(store: FeatureStore, session: int) -> np.ndarray:
    """(num_seen, C, H, W): the base classes' stored means, then the mean shot map of each novel class so far."""
    base_means, base_classes = store.base_means()
    means = dict(zip(base_classes.tolist(), base_means, strict=True))
    for s in range(1, session + 1):
        maps, labels, _ = store.fewshot(s)
        means.update({int(c): maps[labels == c].astype(np.float64).mean(axis=0) for c in np.unique(labels)})
    return np.stack([means[c] for c in range(NUM_BASE + WAYS * session)])


def _test_maps(store: FeatureStore, num_seen: int) -> tuple[np.ndarray, np.ndarray]:
    labels = np.asarray(store.root["test/labels"][:])
    keep = labels < num_seen
    return np.asarray(store.root["test/maps"][:], dtype=np.float32)[keep], labels[keep]


def _assert_metrics(stored: dict, expected: dict, num_test: int, num_seen: int) -> None:
    assert stored["num_test"] == num_test and stored["num_seen_classes"] == num_seen
    assert "per_class_acc" not in stored
    for key, value in expected.items():
        assert stored[key] == (None if value is None else pytest.approx(value, abs=1e-3)), key


def test_session_backbone_ncm_equals_numpy_recomputation(tiny_run):
    _, _, paths = tiny_run
    store = FeatureStore.open(paths.features)
    for session in (1, 2):
        num_seen = NUM_BASE + WAYS * session
        test, labels = _test_maps(store, num_seen)
        expected = _cosine_metrics(_class_mean_maps(store, session).mean(axis=(2, 3)), test.mean(axis=(2, 3)), labels)
        stored = json.loads((paths.session(session) / "metrics.json").read_text())
        _assert_metrics(stored["prototype"]["backbone"], expected, len(labels), num_seen)
        assert ("prototype_session0" in stored) == (session == 1)
    # session 0: base prototypes and base test maps only
    test, labels = _test_maps(store, NUM_BASE)
    expected = _cosine_metrics(store.base_means()[0].mean(axis=(2, 3)), test.mean(axis=(2, 3)), labels)
    session0 = json.loads((paths.session(1) / "metrics.json").read_text())["prototype_session0"]
    _assert_metrics(session0["backbone"], expected, len(labels), NUM_BASE)


def test_session_projector_ncm_equals_recomputation(tiny_run):
    _, params, paths = tiny_run
    cfg = load_config(params)
    store = FeatureStore.open(paths.features)
    tensors, _ = load_checkpoint(paths.base / "model.safetensors")
    projector, _ = build_head(cfg.model, 16, (2, 2), 14)
    projector.load_state_dict(unprefixed(tensors, "projector"))
    projector.eval()

    def mu(maps: np.ndarray, mode: str) -> np.ndarray:
        with torch.no_grad():
            return projector(torch.from_numpy(maps.astype(np.float32)), mode=mode).mu.double().numpy()

    test, labels = _test_maps(store, NUM_BASE)
    session0 = json.loads((paths.session(1) / "metrics.json").read_text())["prototype_session0"]
    expected = _cosine_metrics(mu(store.base_means()[0], "base"), mu(test, "base"), labels)
    _assert_metrics(session0["projector"], expected, len(labels), NUM_BASE)

    state, _ = load_checkpoint(paths.session(2) / "state.safetensors")
    projector.adapting_branch.load_state_dict(unprefixed(state, "adapting"))
    num_seen = NUM_BASE + WAYS * 2
    test, labels = _test_maps(store, num_seen)
    expected = _cosine_metrics(mu(_class_mean_maps(store, 2), "incremental"), mu(test, "incremental"), labels)
    stored = json.loads((paths.session(2) / "metrics.json").read_text())["prototype"]["projector"]
    _assert_metrics(stored, expected, len(labels), num_seen)


def _results(paths) -> list[dict]:
    return [json.loads((paths.base / "metrics.json").read_text())] + [
        json.loads((paths.session(s) / "metrics.json").read_text()) for s in range(1, NUM_SESSIONS + 1)]


def test_report_has_the_prototype_columns_and_summary(tiny_run):
    root, _, paths = tiny_run
    table = pd.read_csv(paths.report / "sessions.csv")
    assert [c for c in table.columns if c.startswith("proto_")] == PROTO_COLUMNS
    assert table[PROTO_COLUMNS][1:].notna().all(axis=None)
    results = _results(paths)
    session0 = results[1]["prototype_session0"]
    expected = [session0["backbone"]["acc"]] + [r["prototype"]["backbone"]["acc"] for r in results[1:]]
    assert table["proto_backbone_acc"].tolist() == pytest.approx(expected)
    assert np.isnan(table["proto_backbone_novel_acc"][0]) and table["proto_backbone_novel_acc"][1:].notna().all()
    summary = json.loads((paths.report / "details.json").read_text())
    assert json.loads((root / "metrics.json").read_text())["class_means_avg"] == summary["prototype"]["backbone"]["avg"]
    for space in ("backbone", "projector"):
        proto = summary["prototype"][space]
        column = table[f"proto_{space}_acc"]
        assert proto["avg"] == pytest.approx(column.mean(), abs=1e-3)
        assert proto["pd"] == pytest.approx(column.iloc[0] - column.iloc[-1], abs=1e-3)
        assert proto["final"] == pytest.approx(column.iloc[-1]) and proto["base"] == pytest.approx(column.iloc[0])
        assert list(proto["sessions"]) == [f"s{s}" for s in range(NUM_SESSIONS + 1)]
        for name in ("novel_as_base", "base_as_novel"):
            assert proto[f"final_{name}"] == pytest.approx(results[-1]["prototype"][space][name], abs=1e-4)
    assert summary["avg"] == pytest.approx(table["acc"].mean(), abs=1e-3)  # the method's summary is unchanged


def test_report_of_older_session_metrics_without_prototype(tiny_run, tmp_path):
    _, _, paths = tiny_run
    results = [{k: v for k, v in r.items() if not k.startswith("prototype")} for r in _results(paths)]
    summary = write_report(results, tmp_path / "metrics.json", tmp_path / "report")
    details = json.loads((tmp_path / "report" / "details.json").read_text())
    assert "prototype" not in summary and "prototype" not in details
    assert "class_means_avg" not in json.loads((tmp_path / "metrics.json").read_text())  # no baseline: no key
    table = pd.read_csv(tmp_path / "report" / "sessions.csv")
    assert table[PROTO_COLUMNS].isna().all(axis=None) and table["acc"].notna().all()
    assert (tmp_path / "report" / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    # metrics from before the base / novel crossings: the summary leaves them out instead of writing NaN
    assert "final_novel_as_base" in summary
    older = [{k: v for k, v in r.items() if k not in ("novel_as_base", "base_as_novel")} for r in results]
    summary = write_report(older, tmp_path / "metrics.json", tmp_path / "report")
    assert not any(key.startswith("final_") and key.endswith(("_as_base", "_as_novel")) for key in summary)
