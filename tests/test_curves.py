"""Training curves (pipeline/training/curves.py): the files `dvc plots` draws hold, row for row, what the stages
trained with: base training's loss per epoch (the losses its metrics.json keeps), the lr the schedule gave the
epoch's last step, the training accuracy in [0, 100]; each session's loss terms per step (its metrics' history) and
the lr of each step."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pipeline.config import load_config
from pipeline.training.curves import session_curve_files
from pipeline.training.registry import BASE_SCHEDULES, SCHEDULES
from tests.headroom import learned
from tests.pipeline_fixtures import NUM_SESSIONS

REPO_DVC = Path(__file__).resolve().parents[1] / "dvc.yaml"


def test_the_base_curve_is_the_base_training(tiny_run):
    _, params, paths = tiny_run
    cfg = load_config(params)
    curve = pd.read_csv(paths.base_curve)
    metrics = json.loads((paths.base / "metrics.json").read_text())
    assert list(curve.columns) == ["epoch", "loss", "lr", "train_acc"]
    assert curve["epoch"].tolist() == list(range(1, cfg.base.epochs + 1))
    assert curve["loss"].tolist() == metrics["train_loss"]
    steps = metrics["steps"] // cfg.base.epochs
    want = [cfg.base.lr * BASE_SCHEDULES[cfg.base.schedule](cfg.base, e * steps - 1, metrics["steps"], e - 1)
            for e in curve["epoch"]]
    assert curve["lr"].tolist() == pytest.approx(want, rel=1e-12)
    assert curve["train_acc"].between(0, 100).all()
    learned("tiny_run.base.train_acc_last_epoch", curve["train_acc"].iloc[-1], ">", 100 / cfg.data.base_classes)
    # what the base stage requires of every run the suite builds on it (base_session.not_learning)
    learned("tiny_run.base.loss_fall_first_to_last_epoch", curve["loss"].iloc[0] - curve["loss"].iloc[-1], ">", 0)


@pytest.mark.parametrize("session", range(1, NUM_SESSIONS + 1))
def test_a_session_curve_is_its_loss_terms_and_lr_per_step(tiny_run, session):
    _, params, paths = tiny_run
    inc = load_config(params).incremental
    files = session_curve_files(paths.session_curves, session)
    curves = {group: pd.read_csv(path) for group, path in files.items()}
    history = json.loads((paths.session(session) / "metrics.json").read_text())["history"]
    steps = inc.session_value("steps", session)
    # each term group its own file (DVC draws each on its own axis): the loss with its classification term, then
    # suppression, then separation, every file with the step
    assert {group: list(curve.columns) for group, curve in curves.items()} == {
        "loss": ["step", "loss", "cls", "lr"], "suppression": ["step", "supp"], "separation": ["step", "sep"]}
    assert files["loss"] == paths.data_dir / "curves" / "sessions" / "loss" / f"session_{session}.csv"
    for group, curve in curves.items():
        assert curve["step"].tolist() == list(range(1, steps + 1)), group
    for group, term in (("loss", "loss"), ("loss", "cls"), ("suppression", "supp"), ("separation", "sep")):
        assert curves[group][term].tolist() == history[term], term
    assert curves["loss"]["lr"].tolist() == pytest.approx([inc.lr * SCHEDULES[inc.schedule](inc, s, steps)
                                                           for s in range(steps)])


def test_dvc_yaml_declares_the_curves_as_git_tracked_outputs_and_plots():
    dvc = yaml.safe_load(REPO_DVC.read_text())
    base_outs = dvc["stages"]["base"]["outs"]
    session_outs = dvc["stages"]["incremental"]["do"]["outs"]
    assert {"data/curves/base.csv": {"cache": False}} in base_outs
    plotted = {next(iter(p)): next(iter(p.values())) for p in dvc["plots"] if isinstance(p, dict)}
    for group, terms in (("loss", ["loss", "cls"]), ("suppression", "supp"), ("separation", "sep")):
        assert {f"data/curves/sessions/{group}/session_${{key}}.csv": {"cache": False}} in session_outs
        assert plotted[f"data/curves/sessions/{group}"]["y"] == terms
    assert any("data/curves/base.csv" in (next(iter(p.values())).get("y") or {}) for p in dvc["plots"])
