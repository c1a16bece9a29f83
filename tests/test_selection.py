"""`fscil select`: the pseudo pack holds base-session training images only, the paper's selection order, and
incremental.freeze_base=false training p_iden/g_base across sessions. The optional stages before the paper's (base,
schedule, per-variant) are in test_selection_stages.py."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

import pipeline.research.pseudo_pack as pseudo_pack
import pipeline.research.selection as selection
from pipeline.atomic import OWNER_FILE
from pipeline.config import load_config, read_yaml
from pipeline.data.pack import ImagePack
from pipeline.errors import FSCILError
from pipeline.models.fscil import build_head
from pipeline.research.selection_config import SelectionConfig, load_selection
from pipeline.store.feature_store import FeatureStore
from pipeline.training.base_model import MODEL_FILE
from pipeline.training.checkpoint import load_checkpoint, unprefixed
from pipeline.training.incremental_session import STATE_FILE, frozen_digest, train_session
from tests.pipeline_fixtures import cli, write_params


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
        result = selection.select(load_config(params), paths.pack, root / "out", load_selection(read_yaml(params)),
                                  work_dir=root / "work")
    return SimpleNamespace(result=result, requested=requested, runs=runs, out=root / "out", work=root / "work")


def _fake_candidate(scores: dict[str, dict], calls: list):
    """A run_candidate whose AVG adds up the per-key scores of the candidate's values; records every call."""
    keys = list(scores)

    def run(cfg, pseudo_pack_path, base_cache, work_dir):
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
    info = pseudo_pack.pseudo_pack(paths.pack, tmp_path / "a.h5", seed=0)
    with ImagePack.open(paths.pack) as parent, ImagePack.open(tmp_path / "a.h5") as pseudo:
        proto = pseudo.protocol
        assert (proto.num_base_classes, proto.num_incremental, proto.ways, proto.shots) == (6, 1, 2, 2)
        proto.validate(pseudo.labels, ways=2, shots=2)
        assert np.bincount(pseudo.labels[proto.test_ids]).tolist() == [2] * 8  # round(0.2 * 12) per class
        assert len(proto.sessions[0].train_ids) == 6 * 10
        assert (pseudo.dataset, pseudo.preset, pseudo.image_size) == (parent.dataset, parent.preset,
                                                                      parent.image_size)
        assert pseudo.provenance["selection"]["seed"] == 0 and info["content_hash"] == pseudo.content_hash
    assert pseudo_pack.pseudo_pack(paths.pack, tmp_path / "b.h5", seed=0)["content_hash"] == info["content_hash"]
    assert pseudo_pack.pseudo_pack(paths.pack, tmp_path / "c.h5", seed=1)["content_hash"] != info["content_hash"]

    other = pseudo_pack.pseudo_pack(paths.pack, tmp_path / "d.h5", base_fraction=0.5, ways=1, shots=3, sessions=2,
                                  val_fraction=0.25)
    with ImagePack.open(tmp_path / "d.h5") as pseudo:
        proto = pseudo.protocol
        assert (proto.num_base_classes, proto.num_incremental, proto.ways, proto.shots) == (4, 2, 1, 3)
        assert np.bincount(pseudo.labels[proto.test_ids]).tolist() == [3] * 6
    assert other["base_classes"] == 4
    with pytest.raises(FSCILError, match="do not fit"):
        pseudo_pack.pseudo_pack(paths.pack, tmp_path / "e.h5", sessions=4)


def architecture_keys(sets: SelectionConfig) -> list[str]:
    return [key for stage, key, _, _ in selection.selection_order(sets) if stage == "architecture"]


def test_the_linear_p_iden_is_an_architecture_choice_after_k_only_when_listed():
    assert "model.iden_linear" not in architecture_keys(SelectionConfig())
    order = architecture_keys(SelectionConfig(iden_linear=[False, True]))
    at = order.index("model.iden_linear")
    assert order[at - 1:at + 2] == ["model.k_paths", "model.iden_linear", "incremental.inc_init"]
    entry = next(e for e in selection.selection_order(SelectionConfig(iden_linear=[True]))
                 if e[1] == "model.iden_linear")
    assert entry[2] == [True] and entry[3] == {"incremental.lambda2": 0.0, "incremental.lambda3": 0.0}


def test_the_scan_output_norm_is_an_architecture_choice_after_the_linear_p_iden_only_when_listed():
    assert "model.out_norm" not in architecture_keys(SelectionConfig())
    order = architecture_keys(SelectionConfig(iden_linear=[False], out_norm=[False, True]))
    at = order.index("model.out_norm")
    assert order[at - 2:at + 2] == ["model.k_paths", "model.iden_linear", "model.out_norm", "incremental.inc_init"]
    entry = next(e for e in selection.selection_order(SelectionConfig(out_norm=[True])) if e[1] == "model.out_norm")
    assert entry[2] == [True] and entry[3] == {"incremental.lambda2": 0.0, "incremental.lambda3": 0.0}


def test_the_vertex_match_is_an_architecture_choice_after_inc_init_only_when_listed():
    assert "incremental.vertex_match" not in architecture_keys(SelectionConfig())
    order = architecture_keys(SelectionConfig(vertex_match=[False, True]))
    assert order[-2:] == ["incremental.inc_init", "incremental.vertex_match"]
    entry = next(e for e in selection.selection_order(SelectionConfig(vertex_match=[True]))
                 if e[1] == "incremental.vertex_match")
    assert entry[2] == [True] and entry[3] == {"incremental.lambda2": 0.0, "incremental.lambda3": 0.0}


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

    # a second selection recomputes nothing and chooses the same, and says it reuses stored results
    said: list[str] = []
    again = selection.select(cfg, paths.pack, tmp_path / "out2", sets, work_dir=tmp_path / "work", log=said.append)
    assert len(calls) == len(expected) and again["chosen"] == chosen
    assert any(line.startswith(f"select: {len(expected)} candidate results stored in {tmp_path / 'work'} are reused")
               for line in said)


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
    # -q turns off bars, not information: a line per candidate with the count and an ETA
    assert "[8/8 candidates, elapsed" in result.output and "incremental.lambda3=0.1: AVG" in result.output
    assert sorted(p.name for p in out.iterdir()) == [OWNER_FILE, "selected.yaml", "selection.csv", "selection.json"]
    assert (tmp_path / "chosen.work" / "pseudo_pack.h5").is_file() and len(calls) == 4
