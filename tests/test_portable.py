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


def _run(tmp: Path, params: Path, stages: tuple = STAGES, fork: bool = False, **env: str) -> dict[str, str]:
    data = tmp / "data"
    clean = _clean_env()
    for stage in stages:
        # the stage's own module, which must pin the kernels before torch loads, in a new process; fork: what dvc.yaml
        # runs (stages/run), the same module forked from the server that imported torch (stages/launch.py)
        module = ["stages.launch", stage[0]] if fork else [f"stages.{stage[0]}"]
        cmd = [sys.executable, "-m", *module, *stage[1:], "--params", str(params), "--data-dir", str(data)]
        if stage[0] == "report":
            cmd += ["--metrics", str(tmp / "metrics.json")]
        done = subprocess.run(cmd, cwd=REPO, env={**clean, **env}, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    # every file a stage writes, the stages' metrics and the pictures included (what dvc.lock hashes; the wall times
    # stay out of them): a rerun leaves dvc.lock as it was
    files = [p for p in sorted(data.rglob("*")) if p.is_file() and "config" not in p.parts]
    files += [tmp / "metrics.json"] if (tmp / "metrics.json").exists() else []
    return {str(p.relative_to(tmp)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in PORTABLE and k != "FSCIL_CPU_KERNELS"}


def native_capability() -> str:
    """This CPU's highest ATen capability as ATEN_CPU_CAPABILITY names it (default / avx2 / avx512), asked of a
    process without the pin (this one is pinned)."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    done = subprocess.run([sys.executable, "-c", code], env={**_clean_env(), "FSCIL_CPU_KERNELS": "native"},
                          capture_output=True, text=True, check=True)
    return done.stdout.strip().lower()


def test_two_capability_settings_give_byte_identical_runs(tmp_path):
    """Pinned: ATen's scalar code asked for in new processes and this CPU's highest capability asked for in stages
    forked from the server (what dvc.yaml runs) give the same bytes. The control, unpinned, runs the same two
    settings, only ever a capability this CPU has (avx512 on an AVX2-only CPU dies of SIGILL)."""
    params = write_params(tmp_path / "params.yaml", device="cpu")
    highest = native_capability()
    plain = _run(tmp_path / "scalar", params, ATEN_CPU_CAPABILITY="default")
    vector = _run(tmp_path / "highest", params, fork=True, ATEN_CPU_CAPABILITY=highest)
    assert {"data/base/metrics.json", "data/sessions/session_3/metrics.json", "metrics.json"} <= plain.keys()
    assert any("features.zarr" in k for k in plain) and any(k.endswith(".png") for k in plain)
    assert plain == vector, {k for k in plain if plain[k] != vector.get(k)}
    if highest == "default":
        pytest.skip("this CPU has no vector capability: the unpinned control has only one setting to run")
    # the control: the same two settings without the pin change the base model (the test can fail)
    native = [_run(tmp_path / name, params, STAGES[:2], ATEN_CPU_CAPABILITY=capability, FSCIL_CPU_KERNELS="native")
              for name, capability in (("n-scalar", "default"), ("n-highest", highest))]
    assert native[0]["data/base/model.safetensors"] != native[1]["data/base/model.safetensors"]


def test_the_test_process_runs_the_pipelines_kernels():
    """tests/conftest.py pins the kernels before torch loads: the suite computes what `fscil` computes."""
    if os.environ.get("FSCIL_CPU_KERNELS") == "native":
        pytest.skip("FSCIL_CPU_KERNELS=native: the suite was asked to run this CPU's own kernels")
    assert {k: os.environ.get(k) for k in PORTABLE} == PORTABLE
    assert torch.backends.cpu.get_cpu_capability() == PORTABLE["ATEN_CPU_CAPABILITY"].upper()


def test_a_stage_module_pins_the_kernels_before_its_imports_load_torch():
    clean = _clean_env()
    code = "import os, stages.base, torch; print(os.environ.get('MKL_CBWR'), os.environ.get('ATEN_CPU_CAPABILITY'))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=clean, capture_output=True, text=True, check=True)
    assert done.stdout.split() == [PORTABLE["MKL_CBWR"], PORTABLE["ATEN_CPU_CAPABILITY"]]


def test_the_pin_sets_every_library_and_refuses_to_come_too_late():
    env: dict[str, str] = {"ATEN_CPU_CAPABILITY": "default"}
    assert pin_cpu_kernels(env) == PORTABLE and env == PORTABLE  # the user's value replaced
    assert pin_cpu_kernels({"FSCIL_CPU_KERNELS": "native"}) == {}
    with pytest.raises(RuntimeError, match="before torch is imported"):
        pin_cpu_kernels()  # this process imported torch above: too late for its own environment
