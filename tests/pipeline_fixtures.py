"""A tiny end-to-end configuration shared by the stage, reliability and CLI tests (seconds on a CPU)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import yaml
from typer.testing import CliRunner

from pipeline.config.sections import ModelConfig
from stages.cli import app
from tests.headroom import TEST_SEED

# the stage tests run on the CPU; FSCIL_TEST_DEVICE=cuda runs them on a GPU (the same assertions)
TEST_DEVICE = os.environ.get("FSCIL_TEST_DEVICE", "cpu")
# the smallest network the tests build: a slim ResNet-12, D' 16, d_state 4
TINY_MODEL = {"backbone_widths": [8, 8, 16, 16], "dim": 16, "d_state": 4, "dt_rank": 4}
TINY_PARAMS = {
    "preset": "synthetic",
    "variant": None,
    "variant_params": None,
    "seed": TEST_SEED,  # 0; FSCIL_TEST_SEED measures the learned thresholds' headroom (tests/headroom.py)
    "device": TEST_DEVICE,
    "threads": 2,
    "data": {"base_classes": 8, "ways": 2, "shots": 2, "sessions": 3, "train_per_class": 12,
             "novel_pool_per_class": 4, "test_per_class": 4},
    "model": {**TINY_MODEL, "k_paths": 4},
    "base": {"epochs": 3, "batch_size": 32, "lr": 0.1, "warmup_steps": 1, "checkpoint_every": 1,
             "eval_batch_size": 64},
    "extract": {"batch_size": 64, "augmented_views": 1, "chunk_samples": 16},
    "incremental": {"steps": [4], "batch_size": 8, "freeze_base": True, "lambda1": 10.0, "lambda2": 0.1, "lambda3": 0.1,
                    "mixup_prob": 0.5, "eval_batch_size": 64},
}
NUM_SESSIONS = 3


def tiny_model_config() -> ModelConfig:
    return ModelConfig(**TINY_MODEL)


runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]


def project_copy(root: Path, *files: str) -> None:
    """The pipeline as a DVC project in `root` (dvc.yaml, .dvcignore, pipeline/, stages/, data/raw/README.md and
    `files` of the repository), for tests that run `dvc` on it: its stages run the copied code."""
    (root / "data" / "raw").mkdir(parents=True, exist_ok=True)
    for name in ("dvc.yaml", ".dvcignore", "data/raw/README.md", *files):
        shutil.copy(REPO / name, root / name)
    for name in ("pipeline", "stages"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))


def write_params(path: Path, **sections) -> Path:
    params = {k: (dict(v) if isinstance(v, dict) else v) for k, v in TINY_PARAMS.items()}
    for name, values in sections.items():
        if isinstance(values, dict):
            params[name] = {**params.get(name, {}), **values}
        else:
            params[name] = values
    path.write_text(yaml.safe_dump(params))
    return path


def cli(*args: str):
    return runner.invoke(app, list(args))


def run_stage(name: str, params: Path, data_dir: Path, *extra: str):
    args = ["stage", name, "--params", str(params), "--data-dir", str(data_dir), *extra]
    if name not in ("prepare", "report"):
        args.append("--quiet")
    result = cli(*args)
    assert result.exit_code == 0, f"{name} failed: {result.output}"
    return result


def run_pipeline(params: Path, data_dir: Path, metrics: Path) -> None:
    run_stage("prepare", params, data_dir)
    run_stage("base", params, data_dir)
    run_stage("extract", params, data_dir)
    for session in range(1, NUM_SESSIONS + 1):
        run_stage("incremental", params, data_dir, "--session", str(session))
    run_stage("report", params, data_dir, "--metrics", str(metrics))
