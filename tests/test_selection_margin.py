"""Selection by a margin: a candidate's paired gain over the configured value in standard errors, and
`selection.min_gain_se` keeping the configured value unless a candidate beats it by that much."""

from __future__ import annotations

import dataclasses
import math

import pytest

import pipeline.research.selection as selection
from pipeline.config import load_config
from pipeline.data.pack import ImagePack
from pipeline.errors import FSCILError
from pipeline.research.selection_config import SelectionConfig


def test_paired_gain_in_standard_errors_against_a_hand_computation():
    # differences 2, 3, 4: mean 3, sample std 1, standard error 1/sqrt(3) -> 3 sqrt(3)
    assert selection.paired_gain_se([3.0, 4.0, 5.0], [1.0, 1.0, 1.0]) == pytest.approx(3 * math.sqrt(3), rel=1e-12)
    assert selection.paired_gain_se([1.0, 2.0], [0.0, 1.0]) == math.inf  # the same gain on every protocol
    assert math.isnan(selection.paired_gain_se([1.0, 2.0], [1.0, 2.0]))
    assert math.isnan(selection.paired_gain_se([float("nan"), 2.0], [1.0, 1.0]))  # a diverged run


def test_min_gain_se_keeps_the_configured_value_unless_a_candidate_beats_it_by_the_margin():
    # stop 33's vertex_match on ten pseudo protocols: +0.26 mean gain, 1.4 standard errors
    configured = [91.0225, 92.1998, 90.8673, 94.5226, 94.4626, 90.2389, 94.4876, 92.5804, 93.668, 92.8174]
    matched = [90.6471, 92.144, 91.234, 94.8719, 94.3323, 91.2664, 94.5177, 92.5318, 93.6902, 94.2198]
    diff = [m - c for m, c in zip(matched, configured, strict=True)]
    se = math.sqrt(sum((d - sum(diff) / 10) ** 2 for d in diff) / 9 / 10)
    assert selection.paired_gain_se(matched, configured) == pytest.approx(sum(diff) / 10 / se, rel=1e-9)
    scores = [sum(configured) / 10, sum(matched) / 10]
    gains = [math.nan, selection.paired_gain_se(matched, configured)]
    assert selection.choose([False, True], scores, False, gains) is True  # the paper's rule
    assert selection.choose([False, True], scores, False, gains, min_gain_se=1.0) is True
    assert selection.choose([False, True], scores, False, gains, min_gain_se=2.0) is False
    # of the candidates past the margin the highest mean wins, not a noisier one above them
    runs = {"a": [50.0, 50.0, 50.0], "noisy": [53.0, 48.0, 53.0], "steady": [50.5, 50.6, 50.4],
            "steadier": [50.3, 50.3, 50.31]}
    values = list(runs)
    scores = [sum(r) / 3 for r in runs.values()]
    gains = [math.nan, *(selection.paired_gain_se(r, runs["a"]) for r in list(runs.values())[1:])]
    assert selection.choose(values, scores, "a", gains) == "noisy"
    assert selection.choose(values, scores, "a", gains, min_gain_se=2.0) == "steady"
    assert selection.choose(values, scores, "a", gains, min_gain_se=50.0) == "steadier"  # 91 SE
    # the configured value diverged (or is not a candidate): nothing to pair with, the highest mean
    assert selection.choose(values, [-math.inf, *scores[1:]], "a", gains, 2.0) == "noisy"
    assert selection.choose(values[1:], scores[1:], "a", gains[1:], 2.0) == "noisy"


def test_a_selection_with_a_margin_records_the_paired_gain_and_keeps_a_noisy_winner_out(real_pack, tmp_path,
                                                                                         monkeypatch):
    params, paths = real_pack
    cfg = load_config(params)
    gains = {0: (3.0, 0.5), 1: (-2.0, 0.6), 2: (3.0, 0.4)}  # per protocol: lambda3 0.1 (noisy), 0.01 (steady)

    def run(cand, pack_path, base_cache, work_dir):
        with ImagePack.open(pack_path) as pack:
            seed = pack.provenance["selection"]["seed"]
        avg = 50.0 + {0.1: gains[seed][0], 0.01: gains[seed][1]}.get(cand.incremental.lambda3, 0.0)
        return {"avg": avg, "final": avg, "pd": 0.0, "base": 50.0, "sessions": {}}

    monkeypatch.setattr(selection, "run_candidate", run)
    sets = SelectionConfig(seed=0, protocols=3, freeze_base=[True], suppression=["z"], k_paths=[4],
                           inc_init=["random"], lambda1=[10.0], lambda2=[0.0], lambda3=[0.0, 0.1, 0.01])
    cfg = selection.with_values(cfg, {"incremental.lambda3": 0.0})
    plain = selection.select(cfg, paths.pack, tmp_path / "plain", sets, work_dir=tmp_path / "work")
    assert plain["chosen"]["incremental.lambda3"] == 0.1
    rows = {row["value"]: row for row in plain["rows"] if row["key"] == "incremental.lambda3"}
    assert "gain_se" not in rows[0.0]
    assert rows[0.1]["gain_se"] == pytest.approx(selection.paired_gain_se([53.0, 48.0, 53.0], [50.0] * 3))
    assert rows[0.01]["gain_se"] == pytest.approx(0.5 / (0.1 / math.sqrt(3)))
    said: list[str] = []
    margin = selection.select(cfg, paths.pack, tmp_path / "margin", dataclasses.replace(sets, min_gain_se=2.0),
                              work_dir=tmp_path / "work", log=said.append)
    assert margin["chosen"]["incremental.lambda3"] == 0.01
    assert ("chosen incremental.lambda3=0.01 (0.1 had the highest mean but gained 0.80 standard errors over 0.0, not "
            "more than selection.min_gain_se 2)") in said
    assert "lambda3: 0.01" in (tmp_path / "margin" / "selected.yaml").read_text()
    with pytest.raises(FSCILError, match=r"selection\.min_gain_se.*protocols >= 2"):
        SelectionConfig(min_gain_se=2.0)
