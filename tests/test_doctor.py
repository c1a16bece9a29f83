"""`fscil doctor` (pipeline/doctor.py): the one-line answer to "does this machine reproduce the committed numbers bit
for bit?", and the cross-vendor claim behind the kernel pin (docs/reliability.md).

One machine cannot be two CPUs, but MKL can be made to believe it runs on an Intel CPU: MKL asks
`mkl_serv_intel_cpu_true`, an exported symbol, and a preloaded library that answers 1 makes it take the Intel code
paths on an AMD CPU. Under the pin MKL_CBWR=COMPATIBLE,STRICT the digests do not move; under the former pin
(AVX2,STRICT, which MKL honours on Intel CPUs only) they do: that is how the Intel Xeon and the AMD EPYC parted ways."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import doctor
from pipeline.errors import FSCILError
from pipeline.portable import PORTABLE

REPO = Path(__file__).resolve().parents[1]


def _doctor(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in PORTABLE and k not in ("FSCIL_CPU_KERNELS", "LD_PRELOAD")}
    return subprocess.run([sys.executable, "-m", "stages.cli", "doctor", *args], cwd=REPO, env={**clean, **env},
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def intel_mkl(tmp_path_factory) -> str:
    """A library that makes MKL take its Intel paths (LD_PRELOAD); skipped where no C compiler is found."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the preloaded library")
    folder = tmp_path_factory.mktemp("intel_mkl")
    (folder / "intel.c").write_text("int mkl_serv_intel_cpu_true(void) { return 1; }\n"
                                    "int mkl_serv_intel_cpu(void) { return 1; }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(folder / "libintel.so"), str(folder / "intel.c")], check=True)
    return str(folder / "libintel.so")


def test_mkl_as_on_an_intel_cpu_gives_the_same_digests_under_the_pin(tmp_path, intel_mkl):
    ref = tmp_path / "ref.txt"
    written = _doctor("--write", "--reference", str(ref))
    assert written.returncode == 0, written.stderr
    assert "wrote" in written.stdout and len(doctor.Probe.read(ref).digests) > 100
    same = _doctor("--reference", str(ref), LD_PRELOAD=intel_mkl)
    assert same.returncode == 0, same.stdout + same.stderr
    assert same.stdout.startswith("this machine reproduces the committed numbers bit for bit")
    assert len(same.stdout.strip().splitlines()) == 1


def test_the_former_pin_parts_ways_where_mkl_sees_another_vendor(tmp_path, intel_mkl):
    """The control (the test above can fail): MKL_CBWR=AVX2,STRICT, set by hand with the pin off."""
    old = {"FSCIL_CPU_KERNELS": "native", **PORTABLE, "MKL_CBWR": "AVX2,STRICT"}
    ref = tmp_path / "ref.txt"
    assert _doctor("--write", "--reference", str(ref), **old).returncode == 0
    if "Intel" in doctor.machine():
        pytest.skip("an Intel CPU: MKL takes its Intel paths with or without the preloaded library")
    differs = _doctor("--reference", str(ref), LD_PRELOAD=intel_mkl, **old)
    assert differs.returncode == 3, differs.stdout + differs.stderr
    assert "the first at kernel gemm" in differs.stdout


def test_the_answer_names_the_first_kernel_that_differs():
    mine = doctor.Probe({"cpu": "A", "threads": 2, "model": "m"},
                        [("kernel conv", "1"), ("kernel gemm", "2"), ("base out backbone.relu", "3")])
    ref = doctor.Probe({"cpu": "B", "threads": 2, "model": "m"},
                       [("kernel conv", "1"), ("kernel gemm", "x"), ("base out backbone.relu", "y")])
    same, line = doctor.verdict(mine, ref)
    assert not same and "2 of 3 digests differ, the first at kernel gemm" in line and "reference: B" in line
    assert doctor.verdict(mine, doctor.Probe(ref.header, mine.digests))[0]
    with pytest.raises(FSCILError, match="made with threads 1"):
        doctor.verdict(mine, doctor.Probe({**ref.header, "threads": 1}, mine.digests))


def test_the_committed_reference_is_current_on_the_machine_that_made_it():
    """The reference goes stale when the network's code changes (as dvc.lock does): on a CPU of the reference's
    model, `fscil doctor` must answer yes (else regenerate it: `fscil doctor --write`, then `make repro`)."""
    ref = doctor.Probe.read(doctor.REFERENCE)
    if ref.header["cpu"] != doctor.machine():
        pytest.skip(f"the reference was made on {ref.header['cpu']}, this is {doctor.machine()}")
    done = _doctor()
    assert done.returncode == 0, done.stdout + done.stderr
