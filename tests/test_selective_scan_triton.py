"""Our Triton selective scan against the float64 loop of test_selective_scan: output and the gradient of every input,
over the shapes SS2D passes (l 1-64, n 1-256, K 1/2/4 groups, each option on and off), bf16 inputs, and reruns that
give the same bits. Without CUDA the kernels run on CPU tensors through Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from tests.test_selective_scan import (
    CASES,
    NAMES,
    assert_close_scaled,
    case_id,
    make_inputs,
    naive_scan,
    output_and_grads,
)

triton_scan = pytest.importorskip("pipeline.ops.selective_scan_triton", reason="needs triton (make test installs it)")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the checkpoint interval and its neighbours, the longest SS2D sequence (8 x 8), the paper's d_state
EDGES = [
    (triton_scan.CHUNK, 16, 4, True, True, True, True),
    (triton_scan.CHUNK + 1, 16, 4, True, True, True, True),
    (2 * triton_scan.CHUNK + 1, 16, 2, True, True, True, True),
    (64, 16, 4, True, True, True, True),
    (4, 256, 4, True, True, True, True),
    (25, 256, None, True, True, True, True),
    (9, 5, 1, False, True, False, True),
]


def on_device(inputs):
    return {k: v.to(DEVICE) if v is not None else None for k, v in inputs.items()}


@pytest.mark.parametrize("case", CASES + EDGES, ids=case_id)
def test_triton_scan_matches_oracle(case):
    length, n, groups, use_z, use_D, use_bias, softplus = case
    inputs = make_inputs(length, n, groups, use_z, use_D, use_bias)
    grad_out = torch.randn(inputs["u"].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref_out, ref_grads = output_and_grads(naive_scan, inputs, torch.float64, softplus, grad_out)
    out, grads = output_and_grads(triton_scan.selective_scan_triton, on_device(inputs), torch.float32, softplus,
                                  grad_out.to(DEVICE))
    errors = {"out": assert_close_scaled(out.cpu(), ref_out, "output")}
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        errors[name] = assert_close_scaled(grads[name].cpu(), ref_grads[name], f"grad of {name}")
    print(case_id(case), " ".join(f"{k}={a:.1e}/{r:.1e}" for k, (a, r) in errors.items()))


def test_more_batch_than_one_program_sums():
    """b > BATCH_PER_PROGRAM: dA, dD, ddelta_bias are summed over several batch chunks, in a fixed order."""
    b = 2 * triton_scan.BATCH_PER_PROGRAM + 3
    inputs = make_inputs(9, 4, 2, b=b, d=4)
    grad_out = torch.randn(inputs["u"].shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ref_out, ref_grads = output_and_grads(naive_scan, inputs, torch.float64, True, grad_out)
    out, grads = output_and_grads(triton_scan.selective_scan_triton, on_device(inputs), torch.float32, True,
                                  grad_out.to(DEVICE))
    assert_close_scaled(out.cpu(), ref_out, "output")
    for name in NAMES:
        assert_close_scaled(grads[name].cpu(), ref_grads[name], f"grad of {name}")


def test_bf16_inputs_keep_their_dtype_and_float32_state():
    """bf16 u, delta, z, B, C: output and their gradients in bf16, as close to the float64 oracle as bf16 inputs
    allow (the state and arithmetic are float32, so the error is the inputs' rounding, not the scan's)."""
    inputs = make_inputs(25, 16, 4)
    low = {k: (v.to(torch.bfloat16) if k in ("u", "delta", "z", "B", "C") else v.float()) for k, v in inputs.items()}
    rounded = {k: v.double() for k, v in low.items()}  # the oracle sees the same rounded inputs
    leaves = {k: v.to(DEVICE).requires_grad_(True) for k, v in low.items()}
    out = triton_scan.selective_scan_triton(**leaves, delta_softplus=True)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    for k in ("u", "delta", "z", "B", "C"):
        assert leaves[k].grad.dtype == torch.bfloat16, k
    ref = naive_scan(**rounded, delta_softplus=True)
    scale = ref.abs().max().item()
    assert (out.detach().cpu().double() - ref).abs().max().item() <= 1e-2 * scale  # bf16 output rounding: 2^-8


def test_reruns_give_the_same_bits():
    inputs = on_device({k: v.float() if v is not None else None for k, v in make_inputs(17, 16, 4, b=4).items()})
    grad_out = torch.randn(inputs["u"].shape, dtype=torch.float64, device=DEVICE)
    first = output_and_grads(triton_scan.selective_scan_triton, inputs, torch.float32, True, grad_out)
    second = output_and_grads(triton_scan.selective_scan_triton, inputs, torch.float32, True, grad_out)
    assert torch.equal(first[0], second[0])
    assert all(torch.equal(first[1][k], second[1][k]) for k in NAMES)


def test_block_sizes_keep_one_group_per_program():
    assert [triton_scan._block_d(k) for k in (1, 2, 3, 12, 64, 640, 96)] == [1, 2, 1, 4, 32, 32, 32]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_ss2d_branch_through_the_triton_scan(monkeypatch, k):
    """The shapes SS2DBranch passes (K paths as groups, its A, D, delta_bias, softplus): output and every
    parameter's gradient equal to the branch on the PyTorch scan."""
    from pipeline.config.sections import ModelConfig
    from pipeline.models import ss2d
    from pipeline.models.ss2d import BranchDims, SS2DBranch

    torch.manual_seed(0)
    dims = BranchDims.from_config(ModelConfig(dim=16, d_state=8, dt_rank=3, k_paths=k))
    branch = SS2DBranch(8, (3, 3), dims).to(DEVICE)
    maps = torch.randn(4, 8, 3, 3, device=DEVICE)

    def run():
        branch.zero_grad()
        out = branch(maps)
        out.square().sum().backward()
        return out.detach(), {name: p.grad.clone() for name, p in branch.named_parameters()}

    ref_out, ref_grads = run()
    monkeypatch.setattr(ss2d, "selective_scan", triton_scan.selective_scan_triton)
    out, grads = run()
    assert_close_scaled(out.double().cpu(), ref_out.double().cpu(), "branch output")
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        assert_close_scaled(grads[name].double().cpu(), ref_grads[name].double().cpu(), f"grad of {name}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_scan_triton_dispatches_cuda_tensors(monkeypatch):
    """params `scan: triton`: `selective_scan` sends CUDA tensors to our kernel, in training under torch's
    deterministic mode too."""
    from pipeline.ops import selective_scan as scan_module

    calls = []
    monkeypatch.setattr(scan_module, "_scan_choice", "triton")
    monkeypatch.setattr(triton_scan, "selective_scan_triton", lambda *a: calls.append(1) or
                        triton_scan.SelectiveScanTriton.apply(*a))
    inputs = on_device({k: v.float() if v is not None else None for k, v in make_inputs(4, 16, 4).items()})
    out, _ = output_and_grads(scan_module.selective_scan, inputs, torch.float32, True,
                              torch.ones_like(inputs["u"]))
    assert calls == [1]
