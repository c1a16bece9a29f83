"""params `device` and `deterministic`: which device a run takes, and how CUDA computes there (pipeline.device),
and when the selective scan may use mamba_ssm's kernel (pipeline.ops.selective_scan.use_kernel)."""

from __future__ import annotations

import os

import pytest
import torch

import pipeline.device as device_module
from pipeline.config import build_config
from pipeline.device import configure_cuda, resolve_device
from pipeline.errors import FSCILError
from pipeline.ops import selective_scan as scan_module
from pipeline.training.runtime import run_device


@pytest.fixture
def one_fake_gpu(monkeypatch):
    """A machine with one CUDA device, as far as resolve_device can tell; records configure_cuda's calls."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(device_module, "configure_cuda", calls.append)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return calls


def test_cpu_needs_no_set_up(one_fake_gpu):
    assert resolve_device("cpu") == torch.device("cpu") and one_fake_gpu == []


def test_cuda_takes_the_local_rank_and_is_set_up(one_fake_gpu, monkeypatch):
    assert resolve_device("auto", deterministic=False) == torch.device("cuda:0")
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    assert one_fake_gpu == [False, True]
    monkeypatch.setenv("LOCAL_RANK", "1")  # a second torchrun process on a one-GPU machine: a clear error
    with pytest.raises(FSCILError, match=r"device cuda:1 .* 1 CUDA device\(s\) .*--nproc-per-node 1 at most"):
        resolve_device("cuda")
    with pytest.raises(FSCILError, match="cuda:3"):
        resolve_device("cuda:3")


def test_cuda_without_a_gpu_is_an_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(FSCILError, match="no CUDA device is available"):
        resolve_device("cuda")


@pytest.mark.parametrize("deterministic", [True, False])
def test_configure_cuda_sets_the_torch_flags(restore_torch_flags, monkeypatch, deterministic):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    configure_cuda(deterministic)
    assert torch.are_deterministic_algorithms_enabled() is deterministic
    assert torch.backends.cudnn.benchmark is not deterministic
    assert torch.backends.cudnn.allow_tf32 is not deterministic  # full float32, like the CPU
    assert torch.backends.cuda.matmul.allow_tf32 is not deterministic
    assert (os.environ.get("CUBLAS_WORKSPACE_CONFIG") == ":4096:8") is deterministic


def test_kernel_only_where_it_is_reproducible(restore_torch_flags, monkeypatch):
    monkeypatch.setattr(scan_module, "_cuda_selective_scan", None)
    assert not scan_module.use_kernel(needs_grad=False)  # not installed
    monkeypatch.setattr(scan_module, "_cuda_selective_scan", object())
    torch.use_deterministic_algorithms(True)
    assert [scan_module.use_kernel(grad) for grad in (True, False)] == [False, True]
    torch.use_deterministic_algorithms(False)
    assert [scan_module.use_kernel(grad) for grad in (True, False)] == [True, True]
    # CPU tensors never reach the kernel, whatever use_kernel says
    calls = []
    monkeypatch.setattr(scan_module, "_cuda_selective_scan", lambda *a, **k: calls.append(1))
    u = torch.zeros(1, 2, 3)
    scan_module.selective_scan(u, u, torch.zeros(2, 1), torch.zeros(1, 1, 3), torch.zeros(1, 1, 3))
    assert calls == []


def test_deterministic_param_is_validated_and_keys_only_gpu_runs():
    assert build_config({}).deterministic is True
    assert build_config({"deterministic": False}).deterministic is False
    with pytest.raises(FSCILError, match="deterministic"):
        build_config({"deterministic": "yes"})
    # a CPU run does not read it: its digest (study keys, stored runs) leaves it out; a GPU run's keeps it
    assert "deterministic" not in build_config({"device": "cpu"}).to_dict(for_digest=True)
    on_gpu = [build_config({"device": d, "deterministic": v}).to_dict(for_digest=True) for d in ("cuda", "auto")
              for v in (True, False)]
    assert [d["deterministic"] for d in on_gpu] == [True, False, True, False]


def test_scan_param_is_validated_keys_only_gpu_runs_and_reaches_the_scan(one_fake_gpu, monkeypatch):
    assert build_config({}).scan == "auto" and build_config({"scan": "torch"}).scan == "torch"
    with pytest.raises(FSCILError, match="scan must be one of auto, torch, triton, mamba"):
        build_config({"scan": "fast"})
    assert "scan" not in build_config({"device": "cpu"}).to_dict(for_digest=True)
    assert build_config({"device": "cuda", "scan": "torch"}).to_dict(for_digest=True)["scan"] == "torch"
    monkeypatch.setattr(scan_module, "_scan_choice", "auto")
    run_device(build_config({"device": "cpu", "scan": "torch"}))
    assert scan_module._scan_choice == "auto"  # the CPU always takes the PyTorch scan: nothing is set
    run_device(build_config({"device": "cuda", "scan": "torch"}))
    assert scan_module._scan_choice == "torch"
    monkeypatch.setattr(scan_module, "_cuda_selective_scan", None)
    with pytest.raises(FSCILError, match="scan: mamba needs mamba_ssm"):
        run_device(build_config({"device": "cuda", "scan": "mamba"}))
    assert scan_module._scan_choice == "torch"
