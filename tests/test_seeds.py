"""Runs compared over seeds (pipeline/research/seeds.py, `fscil compare`): settings, mean +- SE and the paired
difference, against numbers worked out by hand on made-up `dvc exp show --csv` rows."""

import math

import pandas as pd
import pytest

from pipeline.research.compare import compare, compare_text
from pipeline.research.seeds import by_setting, has_repeated_settings, mean_se, paired, setting_labels

# two settings (lambda1 1 and 5) x seeds 0, 1, 2, a third seed only for lambda1 1, and a queued row
CSV = ("Experiment,rev,typ,Created,parent,State,Executor,avg,final,seed,incremental.lambda1,model.projector,"
       "data/sessions\n"
       ",main,baseline,2026,,,,50.0,40.0,0,1.0,dual_ssm,abc\n"
       "l1-s1,a1,branch_base,2026,,Success,,54.0,41.0,1,1.0,dual_ssm,abd\n"
       "l1-s2,a2,branch_base,2026,,Success,,46.0,39.0,2,1.0,dual_ssm,abe\n"
       "l5-s0,b0,branch_base,2026,,Success,,51.0,40.5,0,5.0,dual_ssm,abf\n"
       "l5-s1,b1,branch_base,2026,,Success,,56.0,41.5,1,5.0,dual_ssm,abg\n"
       "l5-s2,b2,branch_base,2026,,Success,,46.5,38.0,2,5.0,dual_ssm,abh\n"
       "l1-s3,a3,branch_base,2026,,Success,,60.0,45.0,3,1.0,dual_ssm,abi\n"
       "l5-s3,b3,branch_commit,2026,,Queued,,50.0,40.0,3,5.0,dual_ssm,abj\n")


def test_mean_and_standard_error_by_hand():
    mean, se, n = mean_se(pd.Series([50.0, 54.0, 46.0]))
    assert (mean, n) == (50.0, 3) and se == pytest.approx(4.0 / math.sqrt(3))  # sd 4 (deviations 0, 4, -4)
    mean, se, n = mean_se(pd.Series([7.0]))
    assert (mean, n) == (7.0, 1) and math.isnan(se)


def test_rows_that_differ_only_in_seed_are_one_setting():
    params, metrics, unfinished = compare(CSV, [], ("avg", "final"))
    assert unfinished == {"l5-s3": "queued"}
    assert list(params.columns) == ["seed", "incremental.lambda1"]  # model.projector is the same everywhere
    settings = setting_labels(params)
    assert settings.tolist() == ["incremental.lambda1=1.0"] * 3 + ["incremental.lambda1=5.0"] * 3 + [
        "incremental.lambda1=1.0"]
    assert has_repeated_settings(params)
    table = by_setting(settings, params["seed"], metrics)
    assert table.loc["incremental.lambda1=1.0", "seeds"] == "0,1,2,3"
    # avg of lambda1 1 over seeds 0-3: 50, 54, 46, 60: mean 52.5, deviations -2.5, 1.5, -6.5, 7.5: sd sqrt(107/3),
    # SE sd / 2 = 2.99
    assert table.loc["incremental.lambda1=1.0", "avg"] == "52.50 +- 2.99"
    assert table.loc["incremental.lambda1=5.0", "avg"] == f"51.17 +- {mean_se(pd.Series([51, 56, 46.5]))[1]:.2f}"


def test_paired_difference_uses_the_seeds_both_ran():
    params, metrics, _ = compare(CSV, [], ("avg", "final"))
    settings = setting_labels(params)
    avg, final = paired(settings, params["seed"], metrics, "incremental.lambda1=1.0", "incremental.lambda1=5.0")
    # seed 3 ran only with lambda1 1: left out. avg differences (5 minus 1): +1, +2, +0.5
    assert avg.seeds == ("0", "1", "2") and (avg.up, avg.down) == (3, 0)
    assert avg.mean == pytest.approx(3.5 / 3)
    sd = math.sqrt(((1 - 3.5 / 3) ** 2 + (2 - 3.5 / 3) ** 2 + (0.5 - 3.5 / 3) ** 2) / 2)
    assert avg.se == pytest.approx(sd / math.sqrt(3))
    assert not avg.within_2se  # 1.17 against 2 x 0.44
    # final differences: +0.5, +0.5, -1: mean 0, within 2 SE
    assert final.mean == pytest.approx(0.0) and (final.up, final.down) == (2, 1) and final.within_2se
    assert "within 2 SE: no evidence of a difference" in final.line()


def test_compare_text_groups_repeated_settings_and_sets_single_runs_side_by_side():
    params, metrics, _ = compare(CSV, [], ("avg", "final"))
    text = compare_text(params, metrics)
    assert "incremental.lambda1=1.0" in text and "0,1,2,3" in text
    assert "paired over the seeds both ran, (incremental.lambda1=5.0) minus (incremental.lambda1=1.0):" in text
    assert "avg              +1.17 +- 0.44  up 3 / down 0 of 3 seeds  beyond 2 SE" in text
    params, metrics, _ = compare(CSV, ["main", "l5-s0"], ("avg",))
    assert not has_repeated_settings(params)
    side = compare_text(params, metrics).splitlines()
    assert side[0].split() == ["main", "l5-s0"] and side[1].split() == ["incremental.lambda1", "1.0", "5.0"]
    assert side[2].split() == ["avg", "50.0", "51.0"] and len(side) == 3  # seed 0 in both: not shown


def test_metrics_beyond_the_headline_come_from_each_rows_details():
    details = {"main": {"avg": 50.0, "sessions": {"s0": 80.0, "s1": 60.0}, "method": "m"},
               "l5-s0": {"avg": 51.0, "sessions": {"s0": 80.0, "s1": 62.0}, "method": "m"}}
    params, metrics, _ = compare(CSV, ["main", "l5-s0"], ("avg", "sessions.*"), details.__getitem__)
    assert list(metrics.columns) == ["avg", "sessions.s0", "sessions.s1"]
    assert metrics.loc["l5-s0"].tolist() == [51.0, 80.0, 62.0]
    from pipeline.errors import FSCILError

    with pytest.raises(FSCILError, match=r"^-m avgg: no such metric \(metrics.json has avg, final; "
                                         r"data/report/details.json has avg, sessions\.\*\)$"):
        compare(CSV, ["main", "l5-s0"], ("avgg",), details.__getitem__)


def test_each_setting_against_its_runs_own_class_means_paired_by_seed():
    """AVG minus each run's own class_means_avg (both in its metrics.json), per setting, worked out by hand."""
    means = {"": 49.0, "l1-s1": 55.0, "l1-s2": 46.0, "l5-s0": 49.0, "l5-s1": 54.0, "l5-s2": 44.5, "l1-s3": 58.0,
             "l5-s3": 50.0}
    lines = CSV.splitlines()
    rows = [lines[0] + ",class_means_avg"] + [f"{line},{means[line.split(',')[0]]}" for line in lines[1:]]
    params, metrics, _ = compare("\n".join(rows) + "\n", [], ("avg", "class_means_avg"))
    text = compare_text(params, metrics)
    # lambda1 1: 50-49, 54-55, 46-46, 60-58 = +1, -1, 0, +2: mean 0.5, sd sqrt(5/3), SE 0.65: level
    # lambda1 5: +2, +2, +2: SE 0, beyond 2 SE: above
    assert "AVG minus the class means of each run's own backbone, paired by seed:" in text
    assert "incremental.lambda1=1.0  +0.50 +- 0.65 (2 up, 1 down): level" in text
    assert "incremental.lambda1=5.0  +2.00 +- 0.00 (3 up, 0 down): above" in text
    assert "own backbone" not in compare_text(*compare(CSV, [], ("avg", "final"))[:2])  # no class means: no line
