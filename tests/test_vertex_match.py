"""incremental.vertex_match (ours): a session's new classes take the free ETF vertices their shots point to.

Oracles: a brute force over every injective choice of free vertices, in float64; the ETF's closed-form Gram matrix
after the columns move; the saved classifier state of real sessions against cosines recomputed from the base model.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch

from pipeline.config import load_config
from pipeline.errors import FSCILError
from pipeline.models.classifier import ETFClassifier
from pipeline.models.fscil import build_head
from pipeline.store.feature_store import FeatureStore
from pipeline.training.base_model import MODEL_FILE
from pipeline.training.checkpoint import load_checkpoint, unprefixed
from pipeline.training.incremental_session import STATE_FILE, train_session
from tests.pipeline_fixtures import write_params


def brute_force(cos: np.ndarray, labels: np.ndarray, start: int, new: int) -> tuple[int, ...]:
    """The free columns (absolute indices) of the best injective assignment of classes start.. start + new - 1."""
    mean = np.stack([cos[labels == start + i].mean(axis=0) for i in range(new)])  # (new, K)
    free = range(start, cos.shape[1])
    return max(itertools.permutations(free, new), key=lambda cols: sum(mean[i, c] for i, c in enumerate(cols)))


@pytest.mark.parametrize("start,new", [(6, 3), (10, 2), (4, 4)])
def test_new_classes_take_the_best_free_vertices_and_nothing_else_moves(start, new):
    dim, k = 16, 12
    head = ETFClassifier(dim, k, seed=3)
    before = head.weight.clone()
    gen = torch.Generator().manual_seed(start)
    labels = torch.arange(start, start + new).repeat_interleave(5)
    mu = torch.randn(len(labels), dim, generator=gen, dtype=torch.float64)
    cos = (mu / mu.norm(dim=1, keepdim=True)) @ before.double()
    want = brute_force(cos.numpy(), labels.numpy(), start, new)

    order = head.match_vertices(mu.float(), labels, start)

    assert tuple(order[:new]) == want
    torch.testing.assert_close(head.weight[:, :start], before[:, :start], rtol=0, atol=0)  # earlier classes keep theirs
    torch.testing.assert_close(head.weight[:, start:], before[:, order], rtol=0, atol=0)
    assert sorted(order) == list(range(start, k))
    rest = [j for j in range(start, k) if j not in want]
    assert order[new:] == rest  # the displaced vertices keep their order
    # still a simplex ETF: unit columns, pairwise cosine -1/(K-1)
    gram = head.weight.double().T @ head.weight.double()
    want_gram = torch.full((k, k), -1.0 / (k - 1), dtype=torch.float64).fill_diagonal_(1.0)
    torch.testing.assert_close(gram, want_gram, rtol=0, atol=1e-5)
    # the matched classes' mean cosine to their vertex is the best any assignment gives
    got = head(mu.float())[:, start:start + new].double()
    mine = sum(got[labels == start + i, i].mean() for i in range(new))
    assert mine >= sum(cos[labels == start + i, start + i].mean() for i in range(new)) - 1e-6
    assert math.isclose(float(mine), sum(cos[labels == start + i, c].mean().item() for i, c in enumerate(want)),
                        rel_tol=0, abs_tol=1e-5)


def test_labels_of_earlier_classes_are_refused():
    head = ETFClassifier(8, 6)
    with pytest.raises(ValueError, match=">= 4"):
        head.match_vertices(torch.randn(4, 8), torch.tensor([3, 4, 4, 5]), 4)


def test_vertex_match_needs_the_etf_head(tmp_path):
    params = write_params(tmp_path / "params.yaml", model={"classifier": "linear"},
                          incremental={"vertex_match": True})
    with pytest.raises(FSCILError, match="incremental.vertex_match needs model.classifier etf"):
        load_config(params)


def test_sessions_fix_their_classes_vertices_from_the_base_features(tiny_run, tmp_path):
    _, params, paths = tiny_run
    cfg = load_config(params)
    cfg = dataclasses.replace(cfg, incremental=dataclasses.replace(cfg.incremental, vertex_match=True))
    store = FeatureStore.open(paths.features)
    tensors, meta = load_checkpoint(paths.base / MODEL_FILE)
    c, h, w = store.map_shape
    projector, classifier = build_head(cfg.model, c, (h, w), int(meta["num_classes"]))
    projector.load_state_dict(unprefixed(tensors, "projector"))
    classifier.load_state_dict(unprefixed(tensors, "classifier"))
    etf = classifier.weight.clone()
    shots, labels, _ = store.fewshot(1)
    with torch.no_grad():  # session 1 starts from the base model: g_inc's gate is zero, mu = mu_iden + mu_base
        mu = projector.eval()(torch.from_numpy(shots), mode="incremental").mu.double()
    cos = ((mu / mu.norm(dim=1, keepdim=True)) @ etf.double()).numpy()
    start, new = int(labels.min()), int(labels.max()) + 1 - int(labels.min())
    want = brute_force(cos, labels, start, new)

    first = train_session(cfg, 1, paths.features, paths.base, None, tmp_path / "s1", show_progress=False)
    assert tuple(first["vertices"]) == want
    saved = unprefixed(load_checkpoint(tmp_path / "s1" / STATE_FILE)[0], "classifier")["weight"]
    torch.testing.assert_close(saved[:, :start], etf[:, :start], rtol=0, atol=0)
    torch.testing.assert_close(saved[:, start:start + new], etf[:, list(want)], rtol=0, atol=0)

    second = train_session(cfg, 2, paths.features, paths.base, tmp_path / "s1", tmp_path / "s2", show_progress=False)
    later = unprefixed(load_checkpoint(tmp_path / "s2" / STATE_FILE)[0], "classifier")["weight"]
    torch.testing.assert_close(later[:, :start + new], saved[:, :start + new], rtol=0, atol=0)  # session 1's stay
    assert all(j >= start + new for j in second["vertices"])
    assert sorted(later.T.tolist()) == sorted(etf.T.tolist())  # the same vertices, only given to other classes
