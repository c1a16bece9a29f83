"""Selective scan against an independent float64 loop: outputs and the gradient of every input."""

from __future__ import annotations

import pytest
import torch

from pipeline.device import configure_cuda
from pipeline.ops import selective_scan as scan_module
from pipeline.ops.selective_scan import selective_scan, selective_scan_torch

NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
TOL = 1e-4  # float32 arithmetic, errors measured relative to the largest reference value


def naive_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """The recurrence written out channel by channel and step by step (the test oracle).

    u, delta, z: (b, d, l); A: (d, n); B, C: (b, n, l) or (b, g, n, l); D, delta_bias: (d,).
    """
    b, d, length = u.shape
    if B.dim() == 3:
        B, C = B.unsqueeze(1), C.unsqueeze(1)
    channels_per_group = d // B.shape[1]
    channels = []
    for c in range(d):
        group = c // channels_per_group
        h = u.new_zeros(b, A.shape[1])
        ys = []
        for t in range(length):
            dt = delta[:, c, t]
            if delta_bias is not None:
                dt = dt + delta_bias[c]
            if delta_softplus:
                dt = torch.log1p(torch.exp(dt))
            h = torch.exp(dt[:, None] * A[c]) * h + (dt * u[:, c, t])[:, None] * B[:, group, :, t]
            y = (h * C[:, group, :, t]).sum(-1)
            if D is not None:
                y = y + D[c] * u[:, c, t]
            if z is not None:
                y = y * z[:, c, t] * torch.sigmoid(z[:, c, t])
            ys.append(y)
        channels.append(torch.stack(ys, dim=-1))
    return torch.stack(channels, dim=1)


def make_inputs(length, n, groups, use_z=True, use_D=True, use_bias=True, b=2, d=8, seed=0):
    """float64 inputs; groups=None gives ungrouped B, C of shape (b, n, l)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    bc_shape = (b, n, length) if groups is None else (b, groups, n, length)
    return {
        "u": randn(b, d, length),
        "delta": 0.5 * rand(b, d, length),
        "A": -0.5 - 1.5 * rand(d, n),
        "B": randn(*bc_shape),
        "C": randn(*bc_shape),
        "D": randn(d) if use_D else None,
        "z": randn(b, d, length) if use_z else None,
        "delta_bias": 0.5 * rand(d) if use_bias else None,
    }


def output_and_grads(fn, inputs, dtype, softplus, grad_out):
    """fn's output and the gradients of all given inputs, both as float64."""
    leaves = {k: (v.detach().to(dtype).requires_grad_(True) if v is not None else None) for k, v in inputs.items()}
    out = fn(**leaves, delta_softplus=softplus)
    given = [k for k in NAMES if leaves[k] is not None]
    grads = torch.autograd.grad(out, [leaves[k] for k in given], grad_out.to(out.dtype))
    return out.detach().double(), {k: g.double() for k, g in zip(given, grads, strict=True)}


def assert_close_scaled(actual, expected, what):
    """Error within TOL of the reference's scale; returns (max abs error, normalised error)."""
    assert actual.shape == expected.shape, what
    err = (actual - expected).abs().max().item()
    scale = max(expected.abs().max().item(), 1e-6)
    torch.testing.assert_close(actual, expected, atol=TOL * scale, rtol=TOL, msg=lambda m: f"{what}: {m}")
    return err, err / scale


# every l, n and group count with every option on, then each option off alone and all off
GRID = [
    (length, n, groups, True, True, True, True) for length in (1, 4, 25, 49) for n in (1, 16) for groups in (None, 4)
]
TOGGLES = [
    (25, 16, groups, *opts)
    for groups in (None, 4)
    for opts in (
        (False, True, True, True),
        (True, False, True, True),
        (True, True, False, True),
        (True, True, True, False),
        (False, False, False, False),
    )
]
EXTRA = [(4, 16, 1, True, True, True, True), (49, 16, 2, True, False, True, False)]
CASES = GRID + TOGGLES + EXTRA


def case_id(case):
    length, n, groups, z, D, bias, softplus = case
    flags = "".join(name for name, on in (("z", z), ("D", D), ("b", bias), ("sp", softplus)) if on) or "plain"
    return f"l{length}-n{n}-g{groups or 'none'}-{flags}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_torch_scan_matches_oracle(case):
    length, n, groups, use_z, use_D, use_bias, softplus = case
    inputs = make_inputs(length, n, groups, use_z, use_D, use_bias)
    grad_out = torch.randn(inputs["u"].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref_out, ref_grads = output_and_grads(naive_scan, inputs, torch.float64, softplus, grad_out)
    out, grads = output_and_grads(selective_scan_torch, inputs, torch.float32, softplus, grad_out)

    errors = {"out": assert_close_scaled(out, ref_out, "output")}
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        errors[name] = assert_close_scaled(grads[name], ref_grads[name], f"grad of {name}")
    # the inference path (no states kept) must agree too
    with torch.no_grad():
        plain = selective_scan_torch(
            **{k: v.float() if v is not None else None for k, v in inputs.items()}, delta_softplus=softplus
        )
    errors["out_no_grad"] = assert_close_scaled(plain.double(), ref_out, "no-grad output")
    print(case_id(case), " ".join(f"{k}={a:.1e}/{r:.1e}" for k, (a, r) in errors.items()))


def test_dispatch_on_cpu_uses_torch_path():
    inputs = {k: v.float() if v is not None else None for k, v in make_inputs(4, 16, 4).items()}
    torch.testing.assert_close(
        selective_scan(**inputs, delta_softplus=True),
        selective_scan_torch(**inputs, delta_softplus=True),
        atol=0,
        rtol=0,
    )


def test_ungrouped_equals_single_group():
    inputs = {k: v.float() if v is not None else None for k, v in make_inputs(25, 16, None).items()}
    grouped = dict(inputs, B=inputs["B"].unsqueeze(1), C=inputs["C"].unsqueeze(1))
    torch.testing.assert_close(selective_scan_torch(**inputs), selective_scan_torch(**grouped))


def test_grads_when_only_some_inputs_require_grad():
    inputs = make_inputs(25, 16, 4)
    u = inputs["u"].float().requires_grad_(True)
    rest = {k: v.float() for k, v in inputs.items() if k != "u"}
    (grad,) = torch.autograd.grad(selective_scan_torch(u, **rest, delta_softplus=True).sum(), [u])
    u_ref = inputs["u"].clone().requires_grad_(True)
    (grad_ref,) = torch.autograd.grad(
        naive_scan(u_ref, **{k: v for k, v in inputs.items() if k != "u"}, delta_softplus=True).sum(), [u_ref]
    )
    assert_close_scaled(grad.double(), grad_ref, "grad of u")


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_output_and_grads_keep_input_dtypes(dtype):
    inputs = make_inputs(4, 16, 4)
    leaves = {k: v.to(dtype).requires_grad_(True) for k, v in inputs.items()}
    out = selective_scan_torch(**leaves, delta_softplus=True)
    assert out.dtype == dtype
    grads = torch.autograd.grad(out.sum(), list(leaves.values()))
    assert [g.dtype for g in grads] == [dtype] * len(NAMES)
    if dtype == torch.float64:  # computed in float32 internally, so float32 accuracy
        assert_close_scaled(out.detach(), naive_scan(**inputs, delta_softplus=True), "float64 output")


BAD_SHAPES = {
    "u not 3-d": dict(u=torch.zeros(2, 8)),
    "delta mismatch": dict(delta=torch.zeros(2, 8, 5)),
    "A wrong d": dict(A=torch.zeros(7, 16)),
    "B wrong n": dict(B=torch.zeros(2, 15, 4)),
    "B groups do not divide d": dict(B=torch.zeros(2, 3, 16, 4), C=torch.zeros(2, 3, 16, 4)),
    "B and C groups differ": dict(C=torch.zeros(2, 2, 16, 4)),
    "D wrong shape": dict(D=torch.zeros(4)),
    "delta_bias wrong shape": dict(delta_bias=torch.zeros(8, 1)),
    "z mismatch": dict(z=torch.zeros(2, 8, 3)),
    "complex A": dict(A=torch.zeros(8, 16, dtype=torch.complex64)),
}


@pytest.mark.parametrize("bad", BAD_SHAPES.values(), ids=BAD_SHAPES.keys())
def test_bad_shapes_raise(bad):
    inputs = {k: v.float() if v is not None else None for k, v in make_inputs(4, 16, 4).items()}
    with pytest.raises(ValueError):
        selective_scan_torch(**dict(inputs, **bad))


@pytest.mark.cuda
@pytest.mark.skipif(
    not (torch.cuda.is_available() and scan_module._cuda_selective_scan is not None),
    reason="needs a CUDA device and mamba_ssm",
)
class TestCudaKernel:
    """mamba_ssm's kernel (what `selective_scan` dispatches to on cuda) against the PyTorch path."""

    @pytest.mark.parametrize("case", CASES, ids=case_id)
    def test_kernel_matches_torch_path(self, case):
        length, n, groups, use_z, use_D, use_bias, softplus = case
        inputs = {
            k: v.cuda() if v is not None else None
            for k, v in make_inputs(length, n, groups, use_z, use_D, use_bias, b=4, d=64).items()
        }
        grad_out = torch.randn(inputs["u"].shape, dtype=torch.float64, device="cuda")
        out_k, grads_k = output_and_grads(selective_scan, inputs, torch.float32, softplus, grad_out)
        out_t, grads_t = output_and_grads(selective_scan_torch, inputs, torch.float32, softplus, grad_out)
        errors = {"out": assert_close_scaled(out_k, out_t, "output")}
        assert grads_k.keys() == grads_t.keys()
        for name in grads_k:
            errors[name] = assert_close_scaled(grads_k[name], grads_t[name], f"grad of {name}")
        print("cuda", case_id(case), " ".join(f"{k}={a:.1e}/{r:.1e}" for k, (a, r) in errors.items()))

    def test_deterministic_mode_trains_through_the_torch_path(self, monkeypatch, restore_torch_flags):
        """Under params `deterministic` (torch's deterministic mode) training gives the same bits twice, and the
        kernel still serves passes without gradients (its forward has no atomics)."""
        calls = []
        kernel = scan_module._cuda_selective_scan
        monkeypatch.setattr(scan_module, "_cuda_selective_scan", lambda *a, **k: calls.append(1) or kernel(*a, **k))
        inputs = {k: v.cuda() if v is not None else None for k, v in make_inputs(49, 16, 4, b=8, d=64).items()}
        grad_out = torch.randn(inputs["u"].shape, dtype=torch.float64, device="cuda")
        configure_cuda(True)
        first = output_and_grads(selective_scan, inputs, torch.float32, True, grad_out)
        second = output_and_grads(selective_scan, inputs, torch.float32, True, grad_out)
        assert calls == []
        assert torch.equal(first[0], second[0]) and all(torch.equal(first[1][k], second[1][k]) for k in first[1])
        with torch.no_grad():
            out = selective_scan(**{k: v.float() if v is not None else None for k, v in inputs.items()},
                                 delta_softplus=True)
        assert calls == [1]
        assert_close_scaled(out.double(), first[0], "kernel forward vs torch path")
