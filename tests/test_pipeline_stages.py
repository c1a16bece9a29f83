"""Each stage's outputs, checked against direct computations on a tiny synthetic run."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.config import load_config
from pipeline.data.augment import test_transform
from pipeline.data.pack import ImagePack
from pipeline.data.presets import get_preset
from pipeline.models.fscil import build_head
from pipeline.store.feature_store import FeatureStore
from pipeline.store.memory import ClassMemory
from pipeline.training.base_model import load_base_model
from pipeline.training.checkpoint import load_checkpoint, unprefixed
from pipeline.training.evaluate import session_metrics
from pipeline.training.incremental_session import frozen_digest, session_training_set
from tests.pipeline_fixtures import NUM_SESSIONS, cli, run_stage


def test_store_equals_direct_backbone_forward(tiny_run):
    root, params, paths = tiny_run
    cfg = load_config(params)
    store = FeatureStore.open(paths.features)
    with ImagePack.open(paths.pack) as pack:
        model, _, _ = load_base_model(cfg, paths.base, pack.content_hash)
        model.eval()
        preset = get_preset(pack.preset, pack.image_size)
        ids = np.asarray(store.root["test/ids"][:])
        assert np.array_equal(np.sort(ids), np.sort(pack.protocol.test_ids))
        with torch.no_grad():
            direct = model.backbone(test_transform(torch.from_numpy(pack.read_images(ids[:20])), preset)).numpy()
        # the store may come from a GPU (FSCIL_TEST_DEVICE=cuda): float32 rounding relative to the maps' scale
        np.testing.assert_allclose(store.root["test/maps"][:20], direct, rtol=1e-5, atol=1e-5 * np.abs(direct).max())
        np.testing.assert_array_equal(store.root["test/labels"][:], pack.labels[ids])
        # the class-mean memory of the base classes
        base = pack.protocol.sessions[0]
        means, classes = store.base_means()
        assert np.array_equal(classes, base.classes)
        with torch.no_grad():
            for c in (0, len(classes) - 1):
                cid = base.train_ids[pack.labels[base.train_ids] == classes[c]]
                maps = model.backbone(test_transform(torch.from_numpy(pack.read_images(cid)), preset)).numpy()
                np.testing.assert_allclose(means[c], maps.mean(axis=0), rtol=1e-5, atol=1e-6)
        # the few-shot maps of session 2 and its augmented view
        maps, labels, views = store.fewshot(2)
        assert np.array_equal(labels, pack.labels[pack.protocol.sessions[2].train_ids])
        assert views.shape == (1, *maps.shape) and not np.allclose(views[0], maps)
    assert store.attrs["pack_hash"] and store.attrs["checkpoint_sha256"] and store.map_shape == (16, 2, 2)


def test_session_metrics_cover_exactly_the_seen_classes(tiny_run):
    root, _, paths = tiny_run
    store = FeatureStore.open(paths.features)
    all_labels = store.root["test/labels"][:]
    for session in range(1, NUM_SESSIONS + 1):
        m = json.loads((paths.session(session) / "metrics.json").read_text())
        num_seen = 8 + 2 * session
        assert m["num_seen_classes"] == num_seen and len(m["per_class_acc"]) == num_seen
        assert m["num_test"] == int((all_labels < num_seen).sum())
        per = np.array(m["per_class_acc"], dtype=float)
        counts = np.bincount(all_labels[all_labels < num_seen], minlength=num_seen)
        assert m["acc"] == pytest.approx(float((per * counts).sum() / counts.sum()), abs=1e-3)
        assert m["base_acc"] == pytest.approx(float((per[:8] * counts[:8]).sum() / counts[:8].sum()), abs=1e-3)


def test_session_metrics_say_where_the_errors_cross_between_base_and_novel():
    # 3 base classes (0-2), 2 novel (3, 4). Base: 0 right, 1 -> novel 3, 2 -> base 1; novel: 3 -> base 0, 4 right,
    # 4 -> novel 3, 3 -> novel 4
    labels = np.array([0, 1, 2, 3, 4, 4, 3])
    pred = np.array([0, 3, 1, 0, 4, 3, 4])
    m = session_metrics(pred, labels, num_base=3, num_seen=5)
    assert m["base_acc"] == pytest.approx(100 / 3, abs=1e-3) and m["novel_acc"] == pytest.approx(25.0)
    assert m["base_as_novel"] == pytest.approx(100 / 3, abs=1e-3)  # one of three base samples
    assert m["novel_as_base"] == pytest.approx(25.0)  # one of four novel samples; the other two errors stay novel
    base_only = session_metrics(np.array([0, 1, 1]), np.array([0, 1, 2]), num_base=3, num_seen=3)
    assert base_only["base_as_novel"] == 0.0 and base_only["novel_as_base"] is None


def test_memory_grows_by_the_new_classes_under_the_store_rule(tiny_run):
    _, _, paths = tiny_run
    store = FeatureStore.open(paths.features)
    kind, k = store.memory_rule
    state, meta = load_checkpoint(paths.session(2) / "state.safetensors")
    mem_maps, mem_classes = state["memory.maps"].numpy(), state["memory.classes"].numpy()
    assert sorted(set(mem_classes.tolist())) == [8, 9, 10, 11]
    for session in (1, 2):
        maps, labels, _ = store.fewshot(session)
        for c in np.unique(labels):
            kept, shots = mem_maps[mem_classes == c], maps[labels == c]
            if kind == "mean":  # eq. memory: one class-mean map
                assert len(kept) == 1
                np.testing.assert_allclose(kept[0], shots.mean(0), rtol=1e-6)
            else:  # random / sampled: min(k, shots) distinct shots of the class, as stored
                assert len(kept) == min(1 if kind == "random" else k, len(shots))
                hits = [int(np.flatnonzero((shots == row).all(axis=(1, 2, 3)))[0]) for row in kept]
                assert len(set(hits)) == len(kept)


def test_frozen_parts_unchanged_bit_for_bit(tiny_run):
    _, params, paths = tiny_run
    cfg = load_config(params)
    tensors, _ = load_checkpoint(paths.base / "model.safetensors")
    projector, _ = build_head(cfg.model, 16, (2, 2), 14)
    projector.load_state_dict(unprefixed(tensors, "projector"))
    expected = frozen_digest(projector)
    for session in range(1, NUM_SESSIONS + 1):
        _, meta = load_checkpoint(paths.session(session) / "state.safetensors")
        assert meta["frozen_sha256"] == expected
        m = json.loads((paths.session(session) / "metrics.json").read_text())
        assert m["frozen_sha256"] == expected
    # and g_inc did train: its state differs between sessions
    s1, _ = load_checkpoint(paths.session(1) / "state.safetensors")
    s3, _ = load_checkpoint(paths.session(3) / "state.safetensors")
    assert not torch.equal(s1["adapting.in_proj.weight"], s3["adapting.in_proj.weight"])


def test_report_matches_session_metrics(tiny_run):
    root, _, paths = tiny_run
    summary = json.loads((paths.report / "details.json").read_text())
    accs = [json.loads((paths.base / "metrics.json").read_text())["acc"]]
    accs += [json.loads((paths.session(s) / "metrics.json").read_text())["acc"] for s in range(1, NUM_SESSIONS + 1)]
    assert list(summary["sessions"].values()) == pytest.approx(accs)
    assert summary["avg"] == pytest.approx(sum(accs) / len(accs), abs=1e-3)
    assert summary["pd"] == pytest.approx(accs[0] - accs[-1], abs=1e-3)
    assert summary["final"] == pytest.approx(accs[-1])
    last = json.loads((paths.session(NUM_SESSIONS) / "metrics.json").read_text())
    assert [summary["final_novel_as_base"], summary["final_base_as_novel"]] == pytest.approx(
        [last["novel_as_base"], last["base_as_novel"]], abs=1e-4)
    # metrics.json (what `dvc exp show` lists first): the headline alone, in order, as the details have it
    headline = json.loads((root / "metrics.json").read_text())
    assert list(headline) == ["avg", "final", "pd", "base", "novel", "class_means_avg"]
    assert headline == {"avg": summary["avg"], "final": summary["final"], "pd": summary["pd"], "base": accs[0],
                        "novel": last["novel_acc"], "class_means_avg": summary["prototype"]["backbone"]["avg"]}
    csv = (paths.report / "sessions.csv").read_text().splitlines()
    assert csv[0].startswith("session,acc,base_acc,novel_acc,novel_as_base,base_as_novel")
    assert len(csv) == NUM_SESSIONS + 2
    table = pd.read_csv(paths.report / "sessions.csv")
    for session in range(1, NUM_SESSIONS + 1):  # the crossings as each session's metrics.json has them
        m = json.loads((paths.session(session) / "metrics.json").read_text())
        row = table[table["session"] == session].iloc[0]
        assert [row["novel_as_base"], row["base_as_novel"]] == pytest.approx([m["novel_as_base"], m["base_as_novel"]])
    assert (paths.report / "accuracy.png").read_bytes()[:4] == b"\x89PNG"


def test_the_report_says_what_ran_and_refuses_sessions_of_another_variant(tiny_run, tmp_path):
    """data/report/details.json and every sessions.csv row carry preset, variant, method and seed (those of the params
    the sessions were made with); a report asked for another variant than the sessions' is a one-line error."""
    root, params, paths = tiny_run
    summary = json.loads((paths.report / "details.json").read_text())
    assert (summary["preset"], summary["variant"], summary["seed"]) == ("synthetic", None, 0)
    assert summary["method"] == "preset values on synthetic"
    table = pd.read_csv(paths.report / "sessions.csv")
    assert set(table["preset"]) == {"synthetic"} and set(table["seed"]) == {0}
    result = cli("stage", "report", "--params", str(params), "--data-dir", str(paths.data_dir),
                 "--metrics", str(tmp_path / "m.json"), "-S", "variant=mamba_fscil")
    assert result.exit_code == 2 and "session 1 was made by" in result.output and "'mamba_fscil'" in result.output
    assert not (tmp_path / "m.json").exists()


def test_incremental_runs_without_the_image_pack(tiny_run, tmp_path):
    root, params, paths = tiny_run
    data = tmp_path / "data"
    shutil.copytree(paths.data_dir, data)
    (data / "pack.h5").unlink()
    shutil.rmtree(data / "sessions")
    run_stage("incremental", params, data, "--session", "1")
    again = json.loads((data / "sessions" / "session_1" / "metrics.json").read_text())
    before = json.loads((paths.session(1) / "metrics.json").read_text())
    assert again["acc"] == before["acc"] and again["history"] == before["history"]  # deterministic too


def test_session_order_is_enforced(tiny_run, tmp_path):
    _, params, paths = tiny_run
    data = tmp_path / "data"
    shutil.copytree(paths.data_dir, data)
    shutil.rmtree(data / "sessions" / "session_2")
    shutil.rmtree(data / "sessions" / "session_3")
    result = cli("stage", "incremental", "--session", "3", "--params", str(params), "--data-dir", str(data), "-q")
    assert result.exit_code == 2
    assert "session 2 is not done" in result.output and "--session 2" in result.output
    assert not (data / "sessions" / "session_3").exists()
    for bad in ("0", "4"):
        result = cli("stage", "incremental", "--session", bad, "--params", str(params), "--data-dir", str(data))
        assert result.exit_code == 2 and "out of range" in result.output
        assert not (data / "sessions" / f"session_{bad}").exists()


@pytest.mark.parametrize("replay", ["mean", "shots"])
def test_session_training_set_is_eq_batch_split(tiny_run, replay):
    """Session 3's training set, rebuilt by hand from the store: its shots + stored views, each earlier novel class
    `copy` times (its mean map, or its own shots), each base mean `base_copy` times; only the base means are base."""
    _, params, paths = tiny_run
    cfg = load_config(params)
    inc = dataclasses.replace(cfg.incremental, copy=2, base_copy=[1, 1, 3], replay=replay)
    store = FeatureStore.open(paths.features)
    base_maps, base_classes = store.base_memory()
    memory = ClassMemory.empty(store.map_shape)
    for session in (1, 2):
        memory = memory.added(*store.fewshot(session)[:2])
    x, y, is_base = session_training_set(store, 3, store.fewshot(3), memory, base_maps, base_classes, inc)

    shots, labels, views = store.fewshot(3)
    if replay == "shots":
        earlier = [store.fewshot(k)[:2] for k in (1, 2)]
        old_maps, old_labels = np.concatenate([e[0] for e in earlier]), np.concatenate([e[1] for e in earlier])
        assert len(old_labels) == 2 * 2 * 2  # 2 sessions x 2 ways x 2 shots
    else:
        old_maps, old_labels = memory.maps, memory.classes
    want_x = [shots, *views, old_maps, old_maps, base_maps, base_maps, base_maps]
    want_y = [labels] * (1 + len(views)) + [old_labels, old_labels] + [base_classes] * 3
    want_xs, want_ys = np.concatenate(want_x), np.concatenate(want_y)
    assert x.shape == want_xs.shape and x.dtype == np.float32
    rows = sorted((int(label), row.tobytes()) for label, row in zip(y, x, strict=True))
    assert rows == sorted((int(label), row.tobytes()) for label, row in zip(want_ys, want_xs, strict=True))
    assert is_base.sum() == 3 * len(base_classes) and (y[is_base] < 8).all() and (y[~is_base] >= 8).all()
