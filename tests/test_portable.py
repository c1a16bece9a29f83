"""The same numbers on every x86-64 machine (pipeline/portable.py, docs/reliability.md): a tiny pipeline run by the
`fscil` command under two of ATen's capability settings gives byte-identical checkpoints, stores and metrics, because
the command pins the CPU kernels; without the pin (FSCIL_CPU_KERNELS=native) the same two settings differ."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.portable import PORTABLE, pin_cpu_kernels
from tests.pipeline_fixtures import write_params

REPO = Path(__file__).resolve().parents[1]
STAGES = (["prepare"], ["base"], ["extract"], *(["incremental", "--session", str(s)] for s in (1, 2, 3)), ["report"])


def _run(tmp: Path, params: Path, stages: tuple = STAGES, **env: str) -> dict[str, str]:
    data = tmp / "data"
    clean = {k: v for k, v in os.environ.items() if k not in PORTABLE and k != "FSCIL_CPU_KERNELS"}
    for stage in stages:
        # what dvc.yaml runs (stages/run): the stage's own module, which must pin the kernels before torch loads
        cmd = [sys.executable, "-m", f"stages.{stage[0]}", *stage[1:], "--params", str(params), "--data-dir", str(data)]
        if stage[0] == "report":
            cmd += ["--metrics", str(tmp / "metrics.json")]
        done = subprocess.run(cmd, cwd=REPO, env={**clean, **env}, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    # every file a stage writes, the stages' metrics and the pictures included (what dvc.lock hashes; the wall times
    # stay out of them): a rerun leaves dvc.lock as it was
    files = [p for p in sorted(data.rglob("*")) if p.is_file() and "config" not in p.parts]
    files += [tmp / "metrics.json"] if (tmp / "metrics.json").exists() else []
    return {str(p.relative_to(tmp)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_two_capability_settings_give_byte_identical_runs(tmp_path):
    params = write_params(tmp_path / "params.yaml", device="cpu")
    plain = _run(tmp_path / "scalar", params, ATEN_CPU_CAPABILITY="default")
    vector = _run(tmp_path / "avx512", params, ATEN_CPU_CAPABILITY="avx512")
    assert {"data/base/metrics.json", "data/sessions/session_3/metrics.json", "metrics.json"} <= plain.keys()
    assert any("features.zarr" in k for k in plain) and any(k.endswith(".png") for k in plain)
    assert plain == vector, {k for k in plain if plain[k] != vector.get(k)}
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU has no vector capability: the unpinned control cannot differ")
    # the control: the same two settings without the pin change the base model (the test can fail)
    native = [_run(tmp_path / name, params, STAGES[:2], ATEN_CPU_CAPABILITY=capability, FSCIL_CPU_KERNELS="native")
              for name, capability in (("n-scalar", "default"), ("n-avx512", "avx512"))]
    assert native[0]["data/base/model.safetensors"] != native[1]["data/base/model.safetensors"]


def test_a_stage_module_pins_the_kernels_before_its_imports_load_torch():
    clean = {k: v for k, v in os.environ.items() if k not in PORTABLE and k != "FSCIL_CPU_KERNELS"}
    code = "import os, stages.base, torch; print(os.environ.get('MKL_CBWR'), os.environ.get('ATEN_CPU_CAPABILITY'))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=clean, capture_output=True, text=True, check=True)
    assert done.stdout.split() == [PORTABLE["MKL_CBWR"], PORTABLE["ATEN_CPU_CAPABILITY"]]


def test_the_pin_sets_every_library_and_refuses_to_come_too_late():
    env: dict[str, str] = {"ATEN_CPU_CAPABILITY": "default"}
    assert pin_cpu_kernels(env) == PORTABLE and env == PORTABLE  # the user's value replaced
    assert pin_cpu_kernels({"FSCIL_CPU_KERNELS": "native"}) == {}
    with pytest.raises(RuntimeError, match="before torch is imported"):
        pin_cpu_kernels()  # this process imported torch above: too late for its own environment
