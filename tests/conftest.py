import os
import subprocess
from pathlib import Path

import pytest

from pipeline.portable import pin_cpu_kernels

# The suite computes what the pipeline computes: the CPU kernels pinned as `fscil` and the stage modules pin them,
# before torch is first imported (pin_cpu_kernels refuses to come later), and inherited by every subprocess a test
# starts. A test that needs native kernels sets them itself (tests/test_portable.py); FSCIL_CPU_KERNELS=native in
# the environment runs the whole suite on this CPU's own paths.
pin_cpu_kernels()
# `make test` runs the suite in parallel workers (pytest-xdist), each with torch's threads, and their subprocesses:
# more threads than cores. Spinning OpenMP threads then made it slower than running the tests one after another
# (test_novel_learning, 2 workers on 2 cores: 330 s, against 162 s in one process); waiting passively, 145 s. The
# wait policy changes no number.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402  (after the pin)

from stages.paths import StagePaths  # noqa: E402
from tests.headroom import TEST_SEED  # noqa: E402
from tests.pipeline_fixtures import run_pipeline, write_params  # noqa: E402
from tests.selection_fixtures import prepared_pack  # noqa: E402

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
REPO = Path(__file__).resolve().parents[1]


def _working_tree() -> str | None:
    """`git status --porcelain` of the repository (untracked and ignored files included), or None outside git."""
    try:
        done = subprocess.run(["git", "status", "--porcelain", "--ignored", "-uall", "--", ".", ":!.venv",
                               ":!**/__pycache__", ":!.pytest_cache", ":!.ruff_cache", ":!*.egg-info"],
                              cwd=REPO, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout


def pytest_sessionstart(session):
    session.config._tree_before = _working_tree()


def pytest_sessionfinish(session, exitstatus):
    """No test writes into the repository's working tree: every output goes under the test's temporary folder."""
    before = getattr(session.config, "_tree_before", None)
    after = _working_tree()
    if before is None or after is None or before == after:
        return
    changed = sorted(set(after.splitlines()) ^ set(before.splitlines()))
    session.config.get_terminal_writer().line(f"the tests changed the working tree: {changed[:10]}", red=True)
    session.exitstatus = 1


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(TEST_SEED)
    yield


@pytest.fixture
def restore_torch_flags():
    """configure_cuda sets process-wide torch flags; put them back for the tests after this one."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,
             torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved[1:4]
    if saved[4] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[4]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One complete tiny pipeline run (prepare .. report), shared by the stage and reliability tests."""
    root = tmp_path_factory.mktemp("run")
    params = write_params(root / "params.yaml")
    run_pipeline(params, root / "data", root / "metrics.json")
    return root, params, StagePaths(root / "data")


@pytest.fixture(scope="module")
def real_pack(tmp_path_factory):
    """(params.yaml, paths) of a prepared tiny pack for the `fscil select` tests (one per test module)."""
    return prepared_pack(tmp_path_factory.mktemp("selection"))
