"""`fscil model cost`: the projector's parameters against sessions (one g_inc stays flat, the expanding baseline
grows by one branch per session) and against tokens, with timings, as a CSV and a plot."""

from __future__ import annotations

import re

import pandas as pd

from pipeline.config import preset_model_config
from pipeline.models.projector import Projector
from pipeline.models.ss2d import BranchDims
from pipeline.research.benchmark import paper_profile, preset_map
from tests.pipeline_fixtures import cli


def test_cost_curves_csv_and_plot(tmp_path):
    out = tmp_path / "cost"
    result = cli("model", "cost", "--preset", "synthetic", "--projectors", "dual_ssm,expanding_mlp", "--sessions", "3",
                 "--sides", "1,3", "--batch", "4", "--repeats", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "cost.csv")
    assert (out / "cost.png").read_bytes()[:4] == b"\x89PNG"
    assert len(table) == 2 * (3 + 2) and (table[["inference_ms", "train_step_ms"]] > 0).all().all()
    sessions = table[table["curve"] == "sessions"].set_index(["projector", "sessions"])["parameters"]
    assert sessions["dual_ssm"].nunique() == 1  # one g_inc whatever the number of sessions
    cfg, _ = preset_model_config("synthetic", {"projector": "mlp"})
    channels, side = preset_map("synthetic")
    assert (table["channels"] == channels).all()
    one = Projector("mlp", channels, (side, side), BranchDims.from_config(cfg))
    branch = sum(p.numel() for p in one.g_inc.parameters())
    grown = sessions["expanding_mlp"].diff().dropna()
    assert (grown == branch).all()  # exactly one more MLP branch per session
    tokens = table[table["curve"] == "tokens"]
    assert tokens["tokens"].tolist() == [1, 9, 1, 9] and (tokens["sessions"] == 1).all()


def test_cost_rejects_bad_sides(tmp_path):
    result = cli("model", "cost", "--sides", "1,x", "--out", str(tmp_path / "c"))
    assert result.exit_code == 2 and "--sides" in result.output and not (tmp_path / "c").exists()


def test_cost_times_each_scan_asked_for_and_rejects_gpu_scans_on_the_cpu(tmp_path):
    out = tmp_path / "cost"
    result = cli("model", "cost", "--preset", "synthetic", "--projectors", "dual_ssm", "--sessions", "1",
                 "--sides", "2", "--batch", "2", "--repeats", "1", "--scans", "auto,torch", "--out", str(out))
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "cost.csv")
    assert table["scan"].tolist() == ["auto", "auto", "torch", "torch"]
    result = cli("model", "cost", "--scans", "torch,triton", "--out", str(tmp_path / "c"))
    assert result.exit_code == 2 and "need --device cuda" in result.output and not (tmp_path / "c").exists()


def test_paper_profile_table_rows_and_ratios():
    """The paper's table layout (Dual-MLP, Mamba-FSCIL, Expanding-MLP-S<last>) per setting, each row's times over
    Dual-MLP's, and parameters that follow the methods (the expanding MLP in its last session the largest), at
    small widths (the paper's are for a GPU)."""
    settings = (("tiny 16x2x2", "synthetic", 16, 2, 3), ("tiny 8x3x3", "synthetic", 8, 3, 4))
    table = paper_profile(1, "cpu", settings=settings, batch=2)
    assert table["method"].tolist() == ["Dual-MLP", "Mamba-FSCIL", "Expanding-MLP-S3"] + [
        "Dual-MLP", "Mamba-FSCIL", "Expanding-MLP-S4"]
    dual = table[table["method"] == "Dual-MLP"]
    assert (dual["inference_vs_dual_mlp"] == 1.0).all() and (dual["train_step_vs_dual_mlp"] == 1.0).all()
    ratio = table["train_step_ms"] / table.groupby("setting")["train_step_ms"].transform("first")
    assert (abs(table["train_step_vs_dual_mlp"] - ratio) <= 0.01).all()
    for _, rows in table.groupby("setting", sort=False):
        assert rows["parameters"].iloc[2] > rows["parameters"].iloc[0]
    assert table["peak_train_mb"].isna().all()  # measured on CUDA only


def test_cost_profile_fast_runs_bf16_and_bad_profile_is_rejected(tmp_path):
    out = tmp_path / "cost"
    result = cli("model", "cost", "--preset", "synthetic", "--projectors", "dual_ssm", "--sessions", "1",
                 "--sides", "2", "--batch", "2", "--repeats", "1", "--profile", "fast", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert (pd.read_csv(out / "cost.csv")["profile"] == "fast").all()
    result = cli("model", "cost", "--profile", "quick", "--out", str(tmp_path / "c"))
    assert result.exit_code == 2 and "--profile must be one of exact, fast" in result.output
    assert not (tmp_path / "c").exists()


def test_cost_paper_table_prints_and_writes_the_table(tmp_path, monkeypatch):
    from pipeline.research import benchmark

    monkeypatch.setattr(benchmark, "PAPER_SETTINGS", (("tiny 16x2x2", "synthetic", 16, 2, 2),))
    out = tmp_path / "cost"
    result = cli("model", "cost", "--paper-table", "--repeats", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert re.search(r"\| tiny 16x2x2 +\| Mamba-FSCIL +\|", result.output)
    assert pd.read_csv(out / "paper_table.csv")["method"].tolist() == ["Dual-MLP", "Mamba-FSCIL", "Expanding-MLP-S2"]
