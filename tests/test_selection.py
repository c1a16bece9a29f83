"""`fscil select`: the pseudo pack holds base-session training images only, the paper's selection order, and
incremental.freeze_base=false training p_iden/g_base across sessions."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

import pipeline.selection as selection
from pipeline.config import build_config, load_config
from pipeline.config_sections import SelectionConfig
from pipeline.data.pack import ImagePack
from pipeline.errors import FSCILError, TrainingDiverged
from pipeline.models.fscil import build_head
from pipeline.store.feature_store import FeatureStore
from pipeline.training.base_model import MODEL_FILE
from pipeline.training.checkpoint import load_checkpoint, unprefixed
from pipeline.training.incremental_session import STATE_FILE, frozen_digest, train_session
from stages.paths import StagePaths
from tests.pipeline_fixtures import cli, run_stage, write_params

# of the 8 base classes: 4 pseudo-base + 2 pseudo sessions x 2 ways; one candidate per factor but two for
# freeze_base, so the whole selection trains one tiny base model and four candidates
TINY_SELECTION = {"sessions": 2, "protocols": 1, "freeze_base": [True, False], "suppression": ["z"], "k_paths": [4],
                  "inc_init": ["random"], "steps": [], "mixup_prob": [], "memory": [], "memory_k": [], "replay": [],
                  "copy": [], "base_copy": [], "lambda1": [10.0], "lambda2": [0.1], "lambda3": [0.1]}


@pytest.fixture(scope="module")
def real_pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("selection")
    # suppression pinned to z: the expected candidate orders below do not follow the preset's value
    params = write_params(root / "params.yaml", selection=TINY_SELECTION, incremental={"suppression": "z"})
    run_stage("prepare", params, root / "data")
    return params, StagePaths(root / "data")


@pytest.fixture(scope="module")
def selection_run(real_pack, tmp_path_factory):
    """One real tiny selection, recording every image id read from any pack and every candidate config run."""
    params, paths = real_pack
    root = tmp_path_factory.mktemp("select")
    requested: list[tuple[str, np.ndarray]] = []
    runs: list = []
    read_images, run_candidate = ImagePack.read_images, selection.run_candidate

    def spy(self, ids):
        requested.append((str(self.path.resolve()), np.asarray(ids).copy()))
        return read_images(self, ids)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ImagePack, "read_images", spy)
        mp.setattr(selection, "run_candidate", lambda *args: runs.append(args[0]) or run_candidate(*args))
        result = selection.select(load_config(params), paths.pack, root / "out", work_dir=root / "work")
    return SimpleNamespace(result=result, requested=requested, runs=runs, out=root / "out", work=root / "work")


def _fake_candidate(scores: dict[str, dict], calls: list):
    """A run_candidate whose AVG adds up the per-key scores of the candidate's values; records every call."""
    keys = list(scores)

    def run(cfg, pseudo_pack_path, work_dir, base_cache):
        values = tuple(selection._get(cfg, key) for key in keys)
        calls.append((values, cfg.seed, cfg.base.epochs))
        avg = float(sum(scores[key].get(v, 0.0) for key, v in zip(keys, values, strict=True)))
        return {"avg": avg, "final": avg - 1, "pd": 1.0, "base": 50.0, "sessions": {}}

    return run


def test_selection_reads_only_base_training_images(real_pack, selection_run):
    _, paths = real_pack
    run = selection_run
    requested, runs, result, work = run.requested, run.runs, run.result, run.work

    with ImagePack.open(paths.pack) as parent:
        base_train = set(parent.protocol.sessions[0].train_ids.tolist())
        incremental_classes = set(parent.protocol.novel_classes_upto(parent.protocol.num_incremental).tolist())
        parent_images, parent_labels, parent_hash = parent.images[:], parent.labels, parent.content_hash
    from_parent = np.concatenate([ids for path, ids in requested if path == str(paths.pack.resolve())])
    assert len(from_parent) and set(from_parent.tolist()) <= base_train  # no test id, no incremental sample
    assert {path for path, _ in requested} == {str(paths.pack.resolve()), str((work / "pseudo_pack.h5").resolve())}

    with ImagePack.open(work / "pseudo_pack.h5") as pseudo:
        parent_of = np.array([int(key.split("/")[1]) for key in pseudo.source_keys])
        assert set(parent_of.tolist()) <= base_train
        np.testing.assert_array_equal(pseudo.images[:], parent_images[parent_of])
        # every pseudo class is one parent base class, never a class of a real incremental session
        pairs = set(zip(pseudo.labels.tolist(), parent_labels[parent_of].tolist(), strict=True))
        assert len(pairs) == len({c for c, _ in pairs}) == len({p for _, p in pairs}) == pseudo.protocol.num_classes
        assert not {p for _, p in pairs} & incremental_classes
        assert pseudo.provenance["parent_pack"] == parent_hash

    # freeze_base true/false, then the suppression .. lambda1 candidates repeat the chosen one (not rerun), while
    # lambda2 (with lambda3 = 0) and lambda3 each add one run; all on the same base model
    assert len(runs) == 4 and len(result["rows"]) == 8
    assert [r.incremental.lambda3 for r in runs] == [0.0, 0.0, 0.0, 0.1]
    assert len(list((work / "bases").iterdir())) == 1
    assert all(np.isfinite(row["avg"]) and 0 <= row["avg"] <= 100 for row in result["rows"])
    table = (selection_run.out / "selection.csv").read_text().splitlines()
    assert table[0] == "stage,key,value,avg,final,pd,base,seconds,diverged,chosen" and len(table) == 9


def test_pseudo_pack_shape_and_seed(real_pack, tmp_path):
    _, paths = real_pack
    info = selection.pseudo_pack(paths.pack, tmp_path / "a.h5", seed=0)
    with ImagePack.open(paths.pack) as parent, ImagePack.open(tmp_path / "a.h5") as pseudo:
        proto = pseudo.protocol
        assert (proto.num_base_classes, proto.num_incremental, proto.ways, proto.shots) == (6, 1, 2, 2)
        proto.validate(pseudo.labels, ways=2, shots=2)
        assert np.bincount(pseudo.labels[proto.test_ids]).tolist() == [2] * 8  # round(0.2 * 12) per class
        assert len(proto.sessions[0].train_ids) == 6 * 10
        assert (pseudo.dataset, pseudo.preset, pseudo.image_size) == (parent.dataset, parent.preset,
                                                                      parent.image_size)
        assert pseudo.provenance["selection"]["seed"] == 0 and info["content_hash"] == pseudo.content_hash
    assert selection.pseudo_pack(paths.pack, tmp_path / "b.h5", seed=0)["content_hash"] == info["content_hash"]
    assert selection.pseudo_pack(paths.pack, tmp_path / "c.h5", seed=1)["content_hash"] != info["content_hash"]

    other = selection.pseudo_pack(paths.pack, tmp_path / "d.h5", base_fraction=0.5, ways=1, shots=3, sessions=2,
                                  val_fraction=0.25)
    with ImagePack.open(tmp_path / "d.h5") as pseudo:
        proto = pseudo.protocol
        assert (proto.num_base_classes, proto.num_incremental, proto.ways, proto.shots) == (4, 2, 1, 3)
        assert np.bincount(pseudo.labels[proto.test_ids]).tolist() == [3] * 6
    assert other["base_classes"] == 4
    with pytest.raises(FSCILError, match="do not fit"):
        selection.pseudo_pack(paths.pack, tmp_path / "e.h5", sessions=4)


def test_selection_follows_the_paper_order(real_pack, tmp_path, monkeypatch):
    params, paths = real_pack
    cfg = load_config(params)  # configured: freeze_base true, z, K = 4, lambda1 10, lambda2 0.1, lambda3 0.1
    scores = {
        "incremental.freeze_base": {True: 0.0, False: 1.0},
        "incremental.suppression": {"z": 2.0, "silu_z": 0.0, "mu_inc": 2.0},  # tie: the configured z stays
        "model.k_paths": {1: 0.0, 2: 3.0, 4: 1.0},
        "incremental.lambda1": {1.0: 5.0, 10.0: 5.0, 30.0: 0.0},  # tie: the configured 10 stays
        "incremental.lambda2": {0.001: 4.0, 0.01: 0.0, 0.1: 1.0, 1.0: 4.0},  # tie without 0.1: the earliest
        "incremental.lambda3": {0.05: 0.0, 0.1: 0.0, 0.3: 2.0, 0.5: 1.0},
    }
    calls: list = []
    monkeypatch.setattr(selection, "run_candidate", _fake_candidate(scores, calls))
    sets = SelectionConfig(seed=3, base_epochs=[2], k_paths=[1, 2, 4], inc_init=["random"],
                           lambda1=[1.0, 10.0, 30.0])
    result = selection.select(cfg, paths.pack, tmp_path / "out", sets, work_dir=tmp_path / "work")

    expected = [(True, "z", 4, 10.0, 0.0, 0.0), (False, "z", 4, 10.0, 0.0, 0.0),  # stage 1a
                (False, "silu_z", 4, 10.0, 0.0, 0.0), (False, "mu_inc", 4, 10.0, 0.0, 0.0),  # 1b (z is cached)
                (False, "z", 1, 10.0, 0.0, 0.0), (False, "z", 2, 10.0, 0.0, 0.0),  # 1c
                (False, "z", 2, 1.0, 0.0, 0.0), (False, "z", 2, 30.0, 0.0, 0.0)]  # lambda1, lambda2 = lambda3 = 0
    expected += [(False, "z", 2, 10.0, v, 0.0) for v in (0.001, 0.01, 0.1, 1.0)]  # lambda2, lambda3 = 0
    expected += [(False, "z", 2, 10.0, 0.001, v) for v in (0.05, 0.1, 0.3, 0.5)]  # lambda3
    assert [values for values, _, _ in calls] == expected
    assert {(seed, epochs) for _, seed, epochs in calls} == {(3, 2)}
    chosen = {"base.epochs": 2, "incremental.freeze_base": False, "incremental.suppression": "z",
              "model.k_paths": 2, "incremental.inc_init": "random", "incremental.lambda1": 10.0,
              "incremental.lambda2": 0.001, "incremental.lambda3": 0.3}
    assert result["chosen"] == chosen

    out = tmp_path / "out"
    table = (out / "selection.csv").read_text().splitlines()
    assert len(table) == 1 + 1 + 2 + 3 + 3 + 1 + 3 + 4 + 4
    assert sum(line.endswith(",True") for line in table) == 8
    text = (out / "selected.yaml").read_text()
    assert text.startswith("# fscil select") and "seed 3" in text
    fragment = yaml.safe_load(text)
    assert fragment == {"base": {"epochs": 2},
                        "incremental": {"freeze_base": False, "suppression": "z", "inc_init": "random",
                                        "lambda1": 10.0, "lambda2": 0.001, "lambda3": 0.3}, "model": {"k_paths": 2}}
    merged = load_config(write_params(tmp_path / "merged.yaml", **fragment))
    assert (merged.model.k_paths, merged.incremental.freeze_base, merged.incremental.lambda3) == (2, False, 0.3)
    assert merged.model.dim == cfg.model.dim  # the fragment touches nothing else

    # a second selection recomputes nothing and chooses the same
    again = selection.select(cfg, paths.pack, tmp_path / "out2", sets, work_dir=tmp_path / "work")
    assert len(calls) == len(expected) and again["chosen"] == chosen


def test_unfrozen_base_parts_train_and_carry_over(selection_run, tmp_path):
    cfg = selection_run.runs[0]  # freeze_base true: the config the pseudo base model was trained with
    cache = next((selection_run.work / "bases").iterdir())
    base_dir, (store,) = cache / "base", [s / "features.zarr" for s in (cache / "stores").iterdir()]
    tensors, meta = load_checkpoint(base_dir / MODEL_FILE)
    c, h, w = FeatureStore.open(store).map_shape
    projector, _ = build_head(cfg.model, c, (h, w), meta["num_classes"])
    projector.load_state_dict(unprefixed(tensors, "projector"))
    base_digest = frozen_digest(projector)

    frozen = train_session(cfg, 1, store, base_dir, None, tmp_path / "f1", show_progress=False)
    state, _ = load_checkpoint(tmp_path / "f1" / STATE_FILE)
    assert frozen["frozen_sha256"] == base_digest and not unprefixed(state, "projector")

    unfrozen = dataclasses.replace(cfg, incremental=dataclasses.replace(cfg.incremental, freeze_base=False))
    first = train_session(unfrozen, 1, store, base_dir, None, tmp_path / "u1", show_progress=False)
    state, _ = load_checkpoint(tmp_path / "u1" / STATE_FILE)
    g_base = unprefixed(state, "projector.g_base")
    assert g_base and any(not torch.equal(v, tensors[f"projector.g_base.{k}"]) for k, v in g_base.items())
    projector.load_state_dict({**projector.state_dict(), **unprefixed(state, "projector")})
    after_first = frozen_digest(projector)
    assert first["frozen_sha256"] == base_digest != after_first
    # session 2 starts from session 1's p_iden / g_base (frozen_sha256 is the digest at the session's start)
    second = train_session(unfrozen, 2, store, base_dir, tmp_path / "u1", tmp_path / "u2",
                           show_progress=False)
    assert second["frozen_sha256"] == after_first


def test_cli_select(real_pack, tmp_path, monkeypatch):
    params, paths = real_pack
    result = cli("select", "--params", str(params), "--data-dir", str(tmp_path / "none"), "-q")
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "fscil stage prepare" in errors[0]
    assert not (tmp_path / "none" / "selection").exists()

    bad = write_params(tmp_path / "bad.yaml", selection={"k_paths": [3]})
    result = cli("select", "--params", str(bad), "--data-dir", str(paths.data_dir))
    assert result.exit_code == 2 and "selection.k_paths" in result.output

    calls: list = []
    monkeypatch.setattr(selection, "run_candidate", _fake_candidate({"incremental.lambda3": {0.1: 1.0}}, calls))
    out = tmp_path / "chosen"
    result = cli("select", "--params", str(params), "--data-dir", str(paths.data_dir), "--out", str(out), "-q")
    assert result.exit_code == 0, result.output
    assert "chosen: incremental.freeze_base=True" in result.output and "incremental.lambda3=0.1" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["selected.yaml", "selection.csv", "selection.json"]
    assert (tmp_path / "chosen.work" / "pseudo_pack.h5").is_file() and len(calls) == 4


def test_schedule_stage_comes_first_and_only_when_asked():
    keys = [key for _, key, _, _ in selection.selection_order(SelectionConfig())]
    assert keys[0] == "incremental.freeze_base" and "incremental.steps" not in keys  # the paper's protocol
    sets = SelectionConfig(steps=[[100], [200]], mixup_prob=[0.5, 0.0])
    order = selection.selection_order(sets)
    assert [(stage, key) for stage, key, _, _ in order[:3]] == [
        ("schedule", "incremental.steps"), ("schedule", "incremental.mixup_prob"),
        ("architecture", "incremental.freeze_base")]
    assert order[0][2] == [[100], [200]] and order[0][3] == {"incremental.lambda2": 0.0, "incremental.lambda3": 0.0}
    # the base stage (ours) precedes everything: each later candidate runs on the chosen base model
    sets = SelectionConfig(base_epochs=[20, 40], base_dr_scale=[1.0, 10.0], base_cutmix_alpha=[0.0, 1.0],
                           base_mixup_alpha=[0.0, 0.2], base_mix_prob=[0.5, 1.0], steps=[[100], [200]])
    assert [(stage, key) for stage, key, _, _ in selection.selection_order(sets)[:7]] == [
        ("base", "base.epochs"), ("base", "base.dr_scale"), ("base", "base.mixup_alpha"),
        ("base", "base.cutmix_alpha"), ("base", "base.mix_prob"), ("schedule", "incremental.steps"),
        ("architecture", "incremental.freeze_base")]
    # the memory (paper's memory ablation) is part of the training set: before replay / base_copy, which act on its
    # rows, and before the architecture
    sets = SelectionConfig(base_copy=[[1], [5]], replay=["mean", "shots"], memory=["mean", "sampled"],
                           memory_k=[2, 4])
    assert [key for _, key, _, _ in selection.selection_order(sets)[:5]] == [
        "extract.memory", "extract.memory_k", "incremental.replay", "incremental.base_copy",
        "incremental.freeze_base"]


def test_training_set_keys_repeat_until_a_pass_changes_nothing(real_pack, tmp_path, monkeypatch):
    """Interacting training-set keys: one greedy pass would stop at (mean, mean, [5]); the repeated passes reach
    (sampled, k 4, shots, [1]), memory_k is not tried while the memory is the class mean, and a pass that changes
    nothing ends the stage."""
    params, paths = real_pack
    cfg = load_config(params)
    cfg = dataclasses.replace(  # start from memory mean, replay mean, base_copy [1], whatever the preset says
        cfg, extract=dataclasses.replace(cfg.extract, memory="mean", memory_k=1),
        incremental=dataclasses.replace(cfg.incremental, replay="mean", base_copy=[1]))
    table = {("mean", "mean", (1,)): 0.0, ("sampled", "mean", (1,)): -1.0, ("mean", "shots", (1,)): -0.5,
             ("mean", "mean", (5,)): 1.0, ("sampled", "mean", (5,)): 2.0, ("sampled", "shots", (5,)): 4.0,
             ("sampled", "shots", (1,)): 5.0, ("mean", "shots", (5,)): 0.5}
    calls: list = []

    def run(cand, pseudo_pack_path, work_dir, base_cache):
        inc, ext = cand.incremental, cand.extract
        key = (ext.memory, inc.replay, tuple(inc.base_copy))
        calls.append((*key, ext.memory_k, json.dumps(cand.to_dict(), sort_keys=True)))
        avg = table[key] + (ext.memory_k == 4 if ext.memory == "sampled" else 0.0)
        return {"avg": avg, "final": avg, "pd": 0.0, "base": 50.0, "sessions": {}}

    monkeypatch.setattr(selection, "run_candidate", run)
    sets = SelectionConfig(memory=["mean", "sampled"], memory_k=[2, 4], replay=["mean", "shots"],
                           base_copy=[[1], [5]], freeze_base=[False], suppression=["z"], k_paths=[4],
                           inc_init=["random"], lambda1=[10.0], lambda2=[0.0], lambda3=[0.0])
    result = selection.select(cfg, paths.pack, tmp_path / "out", sets, work_dir=tmp_path / "work")

    chosen = result["chosen"]
    assert (chosen["extract.memory"], chosen["extract.memory_k"], chosen["incremental.replay"],
            chosen["incremental.base_copy"]) == ("sampled", 4, "shots", [1])
    stages = [(row["stage"], row["key"]) for row in result["rows"]]
    # pass 1 skips memory_k (the memory is the mean); pass 2 changes every key; pass 3 changes none and ends it
    assert stages[:6] == [("schedule", "extract.memory")] * 2 + [("schedule", "incremental.replay")] * 2 + [
        ("schedule", "incremental.base_copy")] * 2
    assert [s for s, _ in stages].count("schedule (pass 2)") == 8
    assert [s for s, _ in stages].count("schedule (pass 3)") == 8
    assert not any(s.startswith("schedule (pass 4") for s, _ in stages)
    assert all(memory == "sampled" or k == cfg.extract.memory_k for memory, _, _, k, _ in calls)
    assert len(calls) == len(set(calls))  # a candidate seen in an earlier pass is read from the cache


def test_a_first_pass_that_keeps_the_configured_training_set_is_the_only_one(real_pack, tmp_path, monkeypatch):
    """When every training-set key keeps its configured value in pass 1, no second pass runs."""
    params, paths = real_pack
    cfg = load_config(params)
    cfg = dataclasses.replace(cfg, extract=dataclasses.replace(cfg.extract, memory="mean", memory_k=1),
                              incremental=dataclasses.replace(cfg.incremental, replay="shots", base_copy=[5]))
    scores = {"extract.memory": {"mean": 1.0}, "incremental.replay": {"shots": 1.0},
              "incremental.base_copy": {(5,): 1.0}}

    def run(cand, pseudo_pack_path, work_dir, base_cache):
        values = {"extract.memory": cand.extract.memory, "incremental.replay": cand.incremental.replay,
                  "incremental.base_copy": tuple(cand.incremental.base_copy)}
        avg = sum(scores[key].get(value, 0.0) for key, value in values.items())
        return {"avg": avg, "final": avg, "pd": 0.0, "base": 50.0, "sessions": {}}

    monkeypatch.setattr(selection, "run_candidate", run)
    sets = SelectionConfig(memory=["mean", "sampled"], memory_k=[4], replay=["mean", "shots"],
                           base_copy=[[1], [5]], freeze_base=[False], suppression=["z"], k_paths=[4],
                           inc_init=["random"], lambda1=[10.0], lambda2=[0.0], lambda3=[0.0])
    result = selection.select(cfg, paths.pack, tmp_path / "out", sets, work_dir=tmp_path / "work")
    stages = [row["stage"] for row in result["rows"]]
    assert stages.count("schedule") == 6 and not any(s.startswith("schedule (pass") for s in stages)
    assert (result["chosen"]["extract.memory"], result["chosen"]["incremental.replay"],
            result["chosen"]["incremental.base_copy"]) == ("mean", "shots", [5])


def test_memory_candidates_share_the_base_model_and_get_their_own_store(real_pack, tmp_path, monkeypatch):
    """extract.memory candidates train one pseudo base model between them (the base does not depend on the memory)
    and each extracts its own feature store, whose memory follows the candidate's rule."""
    params, paths = real_pack
    trained = []
    train_base = selection.train_base
    monkeypatch.setattr(selection, "train_base", lambda cfg, *a, **k: trained.append(cfg) or train_base(cfg, *a, **k))
    sets = SelectionConfig(**{**TINY_SELECTION, "freeze_base": [True], "memory": ["mean", "sampled"]})
    result = selection.select(load_config(params), paths.pack, tmp_path / "out", sets, work_dir=tmp_path / "work")
    assert len(trained) == 1
    (base,) = (tmp_path / "work" / "bases").iterdir()
    stores = sorted((base / "stores").iterdir())
    assert len(stores) == 2  # mean, sampled
    rules = sorted(FeatureStore.open(s / "features.zarr").memory_rule[0] for s in stores)
    assert rules == ["mean", "sampled"]
    assert [r["value"] for r in result["rows"] if r["key"] == "extract.memory"] == ["mean", "sampled"]
    assert result["chosen"]["extract.memory"] in ("mean", "sampled")


def test_base_stage_candidates_each_train_their_own_base_model(real_pack, tmp_path):
    """A real tiny base stage: each base.lr candidate is its own pseudo base model (own cache entry, own
    weights); the later stages run on the chosen one without training another."""
    params, paths = real_pack
    sets = SelectionConfig(**{**TINY_SELECTION, "freeze_base": [True], "base_lr": [0.01, 0.2]})
    result = selection.select(load_config(params), paths.pack, tmp_path / "out", sets, work_dir=tmp_path / "work")
    bases = sorted((tmp_path / "work" / "bases").iterdir())
    assert len(bases) == 2  # one per base.lr candidate, none more for the later stages
    weights = [load_checkpoint(b / "base" / MODEL_FILE)[0] for b in bases]
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    rows = [r for r in result["rows"] if r["key"] == "base.lr"]
    assert [r["value"] for r in rows] == [0.01, 0.2]
    best = max(rows, key=lambda r: r["avg"])["value"]
    assert result["chosen"]["base.lr"] == best
    later = [r for r in result["rows"] if r["key"] != "base.lr"]
    assert later and all(r["avg"] == max(row["avg"] for row in rows) for r in later)  # the chosen base, cached


def test_a_diverging_candidate_loses_and_the_selection_goes_on(real_pack, tmp_path, monkeypatch):
    params, paths = real_pack
    cfg = load_config(params)

    def run(cand, *args):
        if cand.incremental.lambda1 == 30.0:
            raise TrainingDiverged("session 1: non-finite loss at step 10; nothing written")
        return {"avg": 50.0 + cand.incremental.lambda1, "final": 1.0, "pd": 1.0, "base": 1.0, "sessions": {}}

    monkeypatch.setattr(selection, "run_candidate", run)
    sets = SelectionConfig(freeze_base=[True], suppression=["z"], k_paths=[4], inc_init=["random"],
                           lambda1=[1.0, 10.0, 30.0], lambda2=[0.0], lambda3=[0.0])
    result = selection.select(cfg, paths.pack, tmp_path / "out", sets, work_dir=tmp_path / "work")
    assert result["chosen"]["incremental.lambda1"] == 10.0  # 30 would score highest had it not diverged
    rows = [r for r in result["rows"] if r["key"] == "incremental.lambda1"]
    assert [r["diverged"] for r in rows] == [False, False, True] and math.isnan(rows[2]["avg"])


def test_session_lr_and_clipping_are_schedule_keys_reaching_the_candidates(real_pack, tmp_path, monkeypatch):
    """selection.lr / grad_clip_norm (a variant such as linear + CE may need its own): chosen first in the schedule
    stage, each candidate runs with that value, and a chosen `null` (no clipping) survives the params fragment."""
    params, paths = real_pack
    cfg = load_config(params)
    sets = SelectionConfig(**{**TINY_SELECTION, "freeze_base": [True], "lr": [0.1, 0.01],
                              "grad_clip_norm": [1.0, None], "steps": [[5], [10]]})
    assert [key for _, key, _, _ in selection.selection_order(sets)[:4]] == [
        "incremental.lr", "incremental.grad_clip_norm", "incremental.steps", "incremental.freeze_base"]
    seen: list = []

    def run(cand, *args):
        inc = cand.incremental
        seen.append((inc.lr, inc.grad_clip_norm, inc.steps[0]))
        if inc.lr == 0.1 and inc.grad_clip_norm is None:  # the configured lr without clipping diverges
            raise TrainingDiverged("session 1: non-finite loss at step 3; nothing written")
        avg = 60.0 + 5.0 * (inc.lr == 0.01) + 1.0 * (inc.grad_clip_norm is None) + 0.5 * (inc.steps == [10])
        return {"avg": avg, "final": 1.0, "pd": 1.0, "base": 1.0, "sessions": {}}

    monkeypatch.setattr(selection, "run_candidate", run)
    result = selection.select(dataclasses.replace(cfg, incremental=dataclasses.replace(cfg.incremental, lr=0.1)),
                              paths.pack, tmp_path / "out", sets, work_dir=tmp_path / "work")
    assert result["chosen"]["incremental.lr"] == 0.01
    assert result["chosen"]["incremental.grad_clip_norm"] is None  # 0.01 without clipping beats 0.01 with it
    assert result["chosen"]["incremental.steps"] == [10]
    assert {(0.1, None), (0.01, None), (0.01, 1.0)} <= {(lr, clip) for lr, clip, _ in seen}
    fragment = yaml.safe_load((tmp_path / "out" / "selected.yaml").read_text())
    assert fragment["incremental"]["lr"] == 0.01 and fragment["incremental"]["grad_clip_norm"] is None
    assert "grad_clip_norm" in fragment["incremental"]


def test_a_variants_selection_holds_its_own_keys_and_writes_variant_params(real_pack, tmp_path, monkeypatch):
    """`fscil select` with `variant: dual_ssm_frozen`: the keys the row fixes (freeze_base, lambda1-3) are not
    selected (every candidate runs with the row's values), and selected.yaml nests the choice under
    variant_params.dual_ssm_frozen, so merged into params.yaml it changes that row alone."""
    params, paths = real_pack
    values = yaml.safe_load(params.read_text())
    cfg = build_config({**values, "variant": "dual_ssm_frozen"})
    seen: list = []

    def run(cand, *args):
        inc = cand.incremental
        seen.append((inc.lr, inc.freeze_base, inc.lambda1, inc.lambda2, inc.lambda3))
        return {"avg": 60.0 + 5.0 * (inc.lr == 0.03), "final": 1.0, "pd": 1.0, "base": 1.0, "sessions": {}}

    monkeypatch.setattr(selection, "run_candidate", run)
    sets = SelectionConfig(**{**TINY_SELECTION, "lr": [0.1, 0.03], "lambda1": [1.0, 10.0]})
    result = selection.select(cfg, paths.pack, tmp_path / "out", sets, work_dir=tmp_path / "work")
    assert set(result["chosen"]) == {"incremental.lr", "incremental.suppression", "model.k_paths",
                                     "incremental.inc_init"}
    assert result["chosen"]["incremental.lr"] == 0.03
    assert {s[1:] for s in seen} == {(True, 0.0, 0.0, 0.0)}  # the row's own values throughout
    fragment = yaml.safe_load((tmp_path / "out" / "selected.yaml").read_text())
    assert list(fragment) == ["variant_params"] and fragment["variant_params"]["dual_ssm_frozen"]["incremental"][
        "lr"] == 0.03
    merged = {**values, **fragment}
    assert build_config({**merged, "variant": "dual_ssm_frozen"}).incremental.lr == 0.03
    assert build_config({**merged, "variant": "dual_ssm"}).incremental.lr == cfg.incremental.lr != 0.03


def test_several_pseudo_protocols_score_the_mean(real_pack, tmp_path, monkeypatch):
    """protocols=2: every candidate runs on both pseudo packs (seeds 5 and 6, each seeding its own training) and the
    choice follows the mean AVG, not the first protocol alone; stage 0 takes replay, copy, base_copy in order."""
    params, paths = real_pack
    cfg = load_config(params)
    calls: list = []

    def run(cand, pack_path, work_dir, base_cache):
        with ImagePack.open(pack_path) as pack:
            seed = pack.provenance["selection"]["seed"]
        calls.append((cand.seed, seed, cand.incremental.replay, cand.incremental.copy,
                      tuple(cand.incremental.base_copy)))
        # seed 5 prefers replay=mean by 1 point, seed 6 prefers shots by 3: the mean prefers shots
        avg = 50.0 + {("mean", 5): 1.0, ("shots", 6): 3.0}.get((cand.incremental.replay, seed), 0.0)
        avg += 2.0 * (cand.incremental.copy == 3) + 1.0 * (cand.incremental.base_copy == [2])
        return {"avg": avg, "final": avg, "pd": 0.0, "base": 50.0, "sessions": {}}

    monkeypatch.setattr(selection, "run_candidate", run)
    sets = SelectionConfig(seed=5, protocols=2, replay=["mean", "shots"], copy=[1, 3], base_copy=[[1], [2]],
                           freeze_base=[True], suppression=["z"], k_paths=[4], inc_init=["random"],
                           lambda1=[10.0], lambda2=[0.0], lambda3=[0.0])
    result = selection.select(cfg, paths.pack, tmp_path / "out", sets, work_dir=tmp_path / "work")
    assert {(c[0], c[1]) for c in calls} == {(5, 5), (6, 6)}  # each run's training seed is its protocol's
    assert [c[2:] for c in calls[:4]] == [("mean", 1, (1,))] * 2 + [("shots", 1, (1,))] * 2
    assert result["chosen"]["incremental.replay"] == "shots"
    assert result["chosen"]["incremental.copy"] == 3 and result["chosen"]["incremental.base_copy"] == [2]
    assert [p["seed"] for p in result["pseudo_protocols"]] == [5, 6]
    assert result["pseudo_protocols"][0]["content_hash"] != result["pseudo_protocols"][1]["content_hash"]
    row = result["rows"][1]
    assert (row["value"], row["avg"], row["avg_seed5"], row["avg_seed6"]) == ("shots", 51.5, 50.0, 53.0)
    assert "seeds 5, 6" in (tmp_path / "out" / "selected.yaml").read_text()


def test_a_key_whose_every_candidate_diverges_is_an_error(real_pack, tmp_path, monkeypatch):
    """A diverging candidate loses; when all of a key's candidates diverge (on any protocol) nothing can be chosen,
    and the selection says so instead of keeping a value that diverged."""
    params, paths = real_pack
    cfg = load_config(params)

    def run(cand, pack_path, work_dir, base_cache):
        with ImagePack.open(pack_path) as pack:
            seed = pack.provenance["selection"]["seed"]
        if cand.incremental.lambda3 > 0 and seed == 1:  # diverges on the second protocol only
            raise TrainingDiverged("session 2: non-finite loss at step 3; nothing written")
        return {"avg": 50.0, "final": 50.0, "pd": 0.0, "base": 50.0, "sessions": {}}

    monkeypatch.setattr(selection, "run_candidate", run)
    sets = SelectionConfig(seed=0, protocols=2, freeze_base=[True], suppression=["z"], k_paths=[4],
                           inc_init=["random"], lambda1=[10.0], lambda2=[0.0], lambda3=[0.1, 0.5])
    with pytest.raises(FSCILError, match=r"every candidate of incremental.lambda3 \(0.1, 0.5\) diverged"):
        selection.select(cfg, paths.pack, tmp_path / "out", sets, work_dir=tmp_path / "work")
    sets = dataclasses.replace(sets, lambda3=[0.0, 0.1])
    assert selection.select(cfg, paths.pack, tmp_path / "out", sets,
                            work_dir=tmp_path / "work2")["chosen"]["incremental.lambda3"] == 0.0


def test_memory_k_keys_a_store_only_under_the_sampled_rule(real_pack):
    cfg = load_config(real_pack[0])
    key = {(memory, k): selection._key(selection.with_values(cfg, {"extract.memory": memory, "extract.memory_k": k}),
                                       selection.STORE_SECTIONS, "pack")
           for memory in ("mean", "random", "sampled") for k in (2, 4)}
    assert key["mean", 2] == key["mean", 4] and key["random", 2] == key["random", 4]
    assert key["sampled", 2] != key["sampled", 4] and len({key["mean", 2], key["random", 2], key["sampled", 2]}) == 3
