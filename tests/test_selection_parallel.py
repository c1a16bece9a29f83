"""`fscil select --jobs N`: a key's candidate runs go to N processes (one GPU each when several are visible), each
base model trained once and each feature store extracted once, with the results of one process."""

from __future__ import annotations

import json

from pipeline.config import load_config
from pipeline.research.selection import select
from pipeline.research.selection_config import SelectionConfig
from tests.selection_fixtures import TINY_SELECTION


def _without_time(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def test_select_over_two_processes_chooses_as_one_and_builds_each_base_and_store_once(real_pack, tmp_path):
    params, paths = real_pack
    sets = SelectionConfig(**{**TINY_SELECTION, "protocols": 2, "freeze_base": [True], "memory": ["mean", "sampled"],
                              "lambda1": [1.0, 10.0]})
    cfg = load_config(params)
    one = select(cfg, paths.pack, tmp_path / "one", sets, work_dir=tmp_path / "work1")
    two = select(cfg, paths.pack, tmp_path / "two", sets, work_dir=tmp_path / "work2", jobs=2)
    assert _without_time(two["rows"]) == _without_time(one["rows"]) and two["chosen"] == one["chosen"]
    results = [json.loads((tmp_path / w / "results.json").read_text()) for w in ("work1", "work2")]
    assert results[1].keys() == results[0].keys()
    bases = sorted((tmp_path / "work2" / "bases").iterdir())
    assert len(bases) == 2  # one pseudo base model per protocol, as with one process
    assert all(sorted(p.name for p in (b / "stores").iterdir()) == sorted(p.name for p in (
        tmp_path / "work1" / "bases" / b.name / "stores").iterdir()) for b in bases)  # mean's and sampled's
    leftovers = [p.name for p in (tmp_path / "work2").iterdir() if p.name.startswith(("scratch.", "runs.part"))]
    leftovers += [p.name for b in bases for p in b.iterdir() if p.name.startswith(".") or p.name == "base.resume"]
    assert leftovers == []


def test_the_runs_go_in_phases_one_base_model_then_one_store_then_the_rest(real_pack, tmp_path, monkeypatch):
    """Two memory rules on two protocols: first one run per protocol (each trains its pseudo base model), then the
    other rule's run per protocol (each extracts its store from a base that exists by then)."""
    import pipeline.research.parallel as parallel
    import pipeline.research.selection as selection

    params, paths = real_pack
    phases: list[tuple[int, ...]] = []

    def in_process(batches, work, jobs, reuse_stale, on_done):
        phases.append(tuple(len(batch) for batch in batches))
        for i, batch in enumerate(batches):
            on_done(parallel._run_batch(batch, work, i, reuse_stale), len(batch))

    monkeypatch.setattr(selection, "run_batches", in_process)
    sets = SelectionConfig(**{**TINY_SELECTION, "protocols": 2, "freeze_base": [True], "memory": ["mean", "sampled"],
                              "lambda1": [10.0]})
    select(load_config(params), paths.pack, tmp_path / "out", sets, work_dir=tmp_path / "work", jobs=2)
    assert phases[:3] == [(1, 1), (1, 1), ()]  # extract.memory, its first key: bases, then stores
    # later keys: nothing new (their candidate was stored), or new runs on the stored bases and stores, all at once
    later = list(zip(*[iter(phases[3:])] * 3, strict=True))
    assert set(later) <= {((), (), ()), ((1, 1), (), ())} and ((1, 1), (), ()) in later
