"""`fscil study` through DVC's queue (README "Compare runs"): 2 variants x 2 seeds of the tiny pipeline queued as
experiments and run by two queue workers, with nothing activated; each run is a finished experiment in `dvc exp
show`, the printed table is each variant's mean +- SE of the experiments' own metrics (worked out here from `dvc exp
show`), with the paired difference; a second call queues nothing and prints the same."""

from __future__ import annotations

import csv
import io
import math

import pytest

from pipeline.config import session_map
from pipeline.research.seeds import vs_own_cell
from tests.pipeline_fixtures import TINY_PARAMS
from tests.test_dvc_queue import BIN, _run, tiny_repository

pytestmark = pytest.mark.skipif(not (BIN / "dvc").exists(), reason="dvc is not installed in this environment")


def _mean_se(values: list[float]) -> str:
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return f"{mean:.2f} +- {sd / math.sqrt(len(values)):.2f}"


def test_a_study_is_a_grid_of_queued_experiments_compared_over_seeds(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    params = {k: v for k, v in TINY_PARAMS.items() if k != "variant_params"}
    params["incremental"] = {k: v for k, v in params["incremental"].items()
                             if k not in ("lambda1", "lambda2", "lambda3", "freeze_base")}  # the variants' own
    params.update({"variant": "mamba_fscil", "threads": 1, "sessions": session_map(3)})
    dvc = tiny_repository(project, params)

    study = [str(BIN / "fscil"), "study", "--variants", "mamba_fscil,mlp_baseline", "--seeds", "0,1", "--jobs", "2",
             "-m", "avg", "-m", "final", "-m", "class_means_avg"]
    printed = _run(study, project)
    rows = {r["Experiment"]: r for r in csv.DictReader(io.StringIO(_run([dvc, "exp", "show", "--csv"], project)))}
    names = [f"study-{v}-s{s}" for v in ("mamba_fscil", "mlp_baseline") for s in (0, 1)]
    assert all(rows[n]["State"] == "Success" for n in names), {n: rows.get(n, {}).get("State") for n in names}
    assert [rows[n]["variant"] for n in names] == ["mamba_fscil"] * 2 + ["mlp_baseline"] * 2
    assert [rows[n]["seed"] for n in names] == ["0", "1", "0", "1"]

    print(printed)  # docs/experiments.md shows it
    lines = printed.splitlines()
    own_at = lines.index("AVG minus the class means of each run's own backbone, paired by seed:")
    table = {line.split()[0]: line for line in lines[:own_at] if line.startswith("variant=")}
    own = {line.split()[0]: line.split(None, 1)[1] for line in lines[own_at + 1:] if line.startswith("variant=")}
    for variant in ("mamba_fscil", "mlp_baseline"):
        line = table[f"variant={variant}"]
        assert "0,1" in line and "study" not in line
        for metric in ("avg", "final"):
            assert _mean_se([float(rows[f"study-{variant}-s{s}"][metric]) for s in (0, 1)]) in line, (metric, line)
        # each run against the class means of its own backbone (its metrics.json's class_means_avg), paired
        vs = [float(rows[f"study-{variant}-s{s}"]["avg"]) - float(rows[f"study-{variant}-s{s}"]["class_means_avg"])
              for s in (0, 1)]
        assert own[f"variant={variant}"] == vs_own_cell(sum(vs) / 2, abs(vs[0] - vs[1]) / 2,
                                                        sum(v > 0 for v in vs), sum(v < 0 for v in vs), "+-")
    diff = [float(rows[f"study-mlp_baseline-s{s}"]["avg"]) - float(rows[f"study-mamba_fscil-s{s}"]["avg"])
            for s in (0, 1)]
    paired = next(line for line in printed.splitlines() if line.startswith("avg "))
    assert paired.split()[1] == f"{sum(diff) / 2:+.2f}" and "of 2 seeds" in paired
    assert "paired over the seeds both ran, (variant=mlp_baseline) minus (variant=mamba_fscil):" in printed

    again = _run(study, project)  # finished runs are not queued again
    assert "4 of 4 runs already finished, not queued again" in again
    assert [line for line in again.splitlines() if not line.startswith("study:")] == [
        line for line in printed.splitlines() if not line.startswith("study:")]
