"""Comparing runs as a user does (README "Compare runs"): in a git repository with the pipeline at a tiny preset,
the default run committed, then `dvc exp run --temp -S variant=mlp_baseline`: `dvc exp show`, `dvc params diff` and
`dvc plots diff` show the params and metrics of every row (the commit's too, with no DVC cache of it), no '!', no
load errors; `fscil compare` prints the params and resolved values that differ."""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.config import session_map
from tests.pipeline_fixtures import TINY_PARAMS, project_copy

BIN = Path(sys.executable).parent
needs_dvc = pytest.mark.skipif(not (BIN / "dvc").exists(), reason="dvc is not installed in this environment")


def _run(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(cwd), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


@needs_dvc
def test_every_row_has_the_resolved_values_and_plots_diff_needs_no_cache(tmp_path):
    project_copy(tmp_path, ".gitignore")
    params = {k: v for k, v in TINY_PARAMS.items() if k != "variant_params"}
    params["variant"] = "mamba_fscil"
    params["incremental"] = {k: v for k, v in params["incremental"].items()
                             if k not in ("lambda1", "lambda2", "lambda3", "freeze_base")}  # the variants' own
    params["sessions"] = session_map(3)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    dvc = str(BIN / "dvc")
    _run(["git", "init", "-q", "-b", "main"], tmp_path)
    _run([dvc, "init", "-q"], tmp_path)
    _run([dvc, "repro", "-q"], tmp_path)
    tracked = _run(["git", "status", "--porcelain", "-uall"], tmp_path)
    assert "data/config/run.yaml" in tracked and "data/report/sessions.csv" in tracked  # recorded by git
    _run(["git", "add", "-A"], tmp_path)
    _run(["git", "commit", "-qm", "default run"], tmp_path)
    shutil.rmtree(tmp_path / ".dvc" / "cache", ignore_errors=True)  # main's outputs in no cache, as on a fresh clone
    _run([dvc, "exp", "run", "--temp", "-q", "-n", "try-mlp", "-S", "variant=mlp_baseline"], tmp_path)

    rows = list(csv.DictReader(io.StringIO(_run([dvc, "exp", "show", "--csv"], tmp_path))))
    named = {r["Experiment"] or r["rev"]: r for r in rows}
    assert set(named) == {"workspace", "main", "try-mlp"}
    assert {k: named[k]["variant"] for k in named} == {"workspace": "mamba_fscil", "main": "mamba_fscil",
                                                       "try-mlp": "mlp_baseline"}
    for name, row in named.items():
        assert "!" not in row.values(), name
        # params.yaml's keys, each once (the stages depend on their resolved values as files, not as params)
        assert float(row["avg"]) > 0 and row["base.epochs"] == "3", name
        assert not [c for c in row if ":" in c], name  # no key under two files' names
        assert "method" not in row and "incremental.dr_scale" not in row, name  # run.yaml's own: not DVC params
    headline = [c for c in rows[0] if c in ("avg", "final", "pd", "base", "novel", "class_means_avg")]
    assert headline == ["avg", "final", "pd", "base", "novel", "class_means_avg"]  # metrics.json: the headline alone
    assert not [c for c in rows[0] if c.startswith(("sessions.s", "prototype.", "final_"))]  # in details.json

    diff = _run([dvc, "params", "diff", "main", "try-mlp"], tmp_path)
    assert "variant" in diff and "mamba_fscil" in diff and "mlp_baseline" in diff and " - " not in diff

    plots = _run([dvc, "plots", "diff", "main", "try-mlp", "-o", str(tmp_path / "plots")], tmp_path)
    assert "error" not in plots.lower() and "warning" not in plots.lower(), plots
    assert (tmp_path / "plots" / "index.html").is_file()

    assert (tmp_path / "data" / "curves" / "base.csv").is_file()
    html = (tmp_path / "plots" / "index.html").read_text()  # the training curves drawn, for both revisions
    assert "\"text\": \"base training loss\"" in html and "\"text\": \"base training accuracy\"" in html
    for rev in ("main", "try-mlp"):  # each plot of one field holds that field's rows of both revisions
        assert re.search(rf'"train_acc": "[0-9.]+", "rev": "{rev}"', html), rev
    for group in ("loss", "suppression", "separation"):  # each session's term groups on their own plots
        assert f"curves/sessions/{group}/session_3.csv" in html, group

    fscil = str(BIN / "fscil")
    table = _run([fscil, "compare", "main", "try-mlp"], tmp_path)
    lines = {line.split()[0]: line.split()[1:] for line in table.splitlines()[1:]}
    # the params that differ, then the resolved values that differ (run.yaml of each row), then the metrics
    assert lines["variant"] == ["mamba_fscil", "mlp_baseline"] and lines["model.projector"] == ["dual_ssm", "mlp"]
    assert "avg" in lines and "base.epochs" not in lines
    sessions = _run([fscil, "compare", "main", "try-mlp", "-m", "sessions.*"], tmp_path)
    assert [line.split()[0] for line in sessions.splitlines()[1:] if line.startswith("sessions.")] == [
        f"sessions.s{s}" for s in range(4)]
    typo = subprocess.run([fscil, "compare", "-m", "avgg"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})
    assert typo.returncode == 2 and typo.stderr.startswith("error: -m avgg: no such metric") and not typo.stdout

    # fscil show: the per-session tables of the workspace, the commit and the experiment side by side, as their
    # sessions.csv hold them, then each run's name, AVG line and standing
    shown = _run([fscil, "show", "workspace", "main", "try-mlp"], tmp_path).splitlines()
    exp = list(csv.DictReader(io.StringIO(_run(["git", "show", f"{named['try-mlp']['rev']}:data/report/sessions.csv"],
                                               tmp_path))))
    assert shown[0].split()[:4] == ["session", "classes", "workspace", "seen"] and "try-mlp class means" in shown[0]
    assert shown[4].split()[-4] == f"{float(exp[-1]['acc']):.2f}"  # try-mlp's seen accuracy in the last session
    at = shown.index("try-mlp: mlp_baseline on synthetic, seed 0  (try-mlp:data/report/sessions.csv)")
    avg = f"AVG {sum(float(r['acc']) for r in exp) / len(exp):.2f}"
    assert shown[at + 1].startswith(f"  {avg}  PD ") and shown[at + 2].startswith(f"  {avg} against the class means")
    assert shown[5] == "workspace: mamba_fscil on synthetic, seed 0  (data/report/sessions.csv)"


def test_fscil_compare_names_the_rows_it_leaves_out_with_their_state(monkeypatch):
    import pipeline.research.compare as compare_module
    from tests.pipeline_fixtures import cli

    text = ("Experiment,rev,typ,Created,parent,State,Executor,avg\n"
            ",main,baseline,2026,,,,50.0\n"
            "queued-one,def5678,branch_commit,2026,,Queued,,50.0\n")
    monkeypatch.setattr(compare_module, "exp_show_csv", lambda all_commits: text)
    result = cli("compare", "-m", "avg")
    assert result.exit_code == 0, result.output
    assert "left out, no results yet: queued-one (queued)" in result.output


def test_compare_leaves_out_running_experiments_and_takes_metric_patterns():
    """From `dvc exp show --csv` text: a running experiment (which dvc lists with the workspace's metrics under its
    name) is left out and named; -m takes shell patterns; a pattern naming no metric is a one-line error."""
    from pipeline.errors import FSCILError
    from pipeline.research.compare import compare

    text = ("Experiment,rev,typ,Created,parent,State,Executor,avg,sessions.s0,sessions.s1,"
            "data/config/run.yaml:variant\n"
            ",main,baseline,2026,,,,50.0,80.0,60.0,mamba_fscil\n"
            "try-mlp,abc1234,branch_base,2026,,Success,,52.0,81.0,62.0,mlp_baseline\n"
            "running-one,def5678,branch_commit,2026,,Running,workspace,50.0,80.0,60.0,mamba_fscil\n")
    params, metrics, unfinished = compare(text, [], ("sessions.*",))
    assert list(params.index) == list(metrics.index) == ["main", "try-mlp"] and unfinished == {"running-one": "running"}
    assert list(params.columns) == ["variant"] and list(metrics.columns) == ["sessions.s0", "sessions.s1"]
    with pytest.raises(FSCILError, match=r"^-m avgg: no such metric \(metrics.json has avg, sessions\.\*\)$"):
        compare(text, [], ("avgg",))
    with pytest.raises(FSCILError, match="no results for running-one"):
        compare(text, ["main", "running-one"])


def test_show_summarises_a_sessions_csv_as_the_report_does():
    """`fscil show`'s table and its AVG / PD / final line (the method's and the class means'), by hand."""
    from pipeline.research.compare import run_table, show_text

    text = ("session,num_seen_classes,acc,base_acc,novel_acc,proto_backbone_acc,proto_backbone_base_acc,"
            "proto_backbone_novel_acc,method,seed\n0,6,80.0,80.0,,78.0,78.0,,m on d,1\n"
            "1,8,60.0,65.0,45.0,58.0,60.0,52.0,m on d,1\n2,10,50.0,55.0,42.5,40.0,45.0,32.5,m on d,1\n")
    name, shown, summary = run_table(text)
    assert name == "m on d, seed 1" and list(shown.columns) == ["session", "classes", "seen", "base", "novel",
                                                                "class means"]
    assert summary == pytest.approx({"AVG": 63.3333, "PD": 30.0, "final": 50.0, "class means AVG": 58.6667,
                                     "class means final": 40.0})
    assert show_text(text, "here").splitlines()[-2:] == [
        "AVG 63.33  PD 30.00  final 50.00  class means AVG 58.67  class means final 40.00",
        "AVG 63.33 against the class means of its own backbone 58.67: +4.67"]


def test_show_sets_several_runs_side_by_side():
    from pipeline.research.compare import show_side_by_side

    a = ("session,num_seen_classes,acc,base_acc,novel_acc,proto_backbone_acc,proto_backbone_base_acc,"
         "proto_backbone_novel_acc,method,seed\n0,6,80.0,80.0,,78.0,78.0,,m on d,1\n"
         "1,8,60.0,65.0,45.0,58.0,60.0,52.0,m on d,1\n")
    b = a.replace("60.0,65.0,45.0", "62.0,66.0,50.0").replace(",1\n", ",2\n")
    lines = show_side_by_side([("main", a, "main:s.csv"), ("lam5", b, "lam5:s.csv")]).splitlines()
    assert lines[0].split() == ["session", "classes", "main", "seen", "main", "base", "main", "novel", "main", "class",
                                "means", "lam5", "seen", "lam5", "base", "lam5", "novel", "lam5", "class", "means"]
    assert lines[2].split() == ["1", "8", "60.00", "65.00", "45.00", "58.00", "62.00", "66.00", "50.00", "58.00"]
    assert lines[3:] == ["main: m on d, seed 1  (main:s.csv)",
                         "  AVG 70.00  PD 20.00  final 60.00  class means AVG 68.00  class means final 58.00",
                         "  AVG 70.00 against the class means of its own backbone 68.00: +2.00",
                         "lam5: m on d, seed 2  (lam5:s.csv)",
                         "  AVG 71.00  PD 18.00  final 62.00  class means AVG 68.00  class means final 58.00",
                         "  AVG 71.00 against the class means of its own backbone 68.00: +3.00"]
