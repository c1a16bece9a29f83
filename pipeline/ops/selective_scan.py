"""Selective scan (the S6 recurrence of Mamba): PyTorch, mamba_ssm's CUDA kernel or our Triton kernel (params `scan`).

Same arguments and semantics as `mamba_ssm.ops.selective_scan_interface.selective_scan_fn`:

    dt  = softplus(delta + delta_bias)            (softplus only if delta_softplus)
    h_t = exp(dt_t * A) * h_{t-1} + dt_t * B_t * u_t   per channel d and state n, h_{-1} = 0
    y_t = sum_n C_t[n] * h_t[n] + D * u_t
    y   = y * silu(z)                             (if z is given)

Shapes (b batch, d channels, l length, n state size, g groups):
    u, delta, z: (b, d, l); A: (d, n) real; D, delta_bias: (d,);
    B, C: (b, n, l) shared by all channels, or (b, g, n, l) where the d channels are split into g
    contiguous groups of d // g channels, group i using B[:, i] / C[:, i].
Returns (b, d, l) in u's dtype; all arithmetic is float32.

The PyTorch path (`selective_scan_torch`) is a sequential loop over l, each step vectorised over
(b, d, n); on cpu this beat associative (doubling) scans. With gradients it is a custom autograd
function with a hand-written reverse-time backward (several times faster than autograd through the
loop) that keeps the decays exp(dt * A) and the states h, two (l, b, d, n) float32 tensors
(recomputing them in backward cost 30-40% more time). Without gradients it keeps no states.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from pipeline.ops.scan_dispatch import KERNELS, MEASURED, SCAN_CHOICES, fastest
from pipeline.registry import load

try:
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn as _cuda_selective_scan
except Exception:  # mamba_ssm raises more than ImportError when its CUDA extension is missing
    _cuda_selective_scan = None


_scan_choice = "auto"  # params `scan`, set for the process by `set_scan` (pipeline.device.resolve_device)


def set_scan(choice: str) -> None:
    """Which scan CUDA tensors take (params `scan`): auto (on a GPU with rows in `scan_dispatch.MEASURED` the
    fastest measured scan per shape, `measured_choice`; else mamba_ssm's kernel where `use_kernel` allows it, else
    PyTorch), torch, triton (ours, `pipeline.ops.selective_scan_triton`: deterministic, so it trains under
    `deterministic: true` too) or mamba (its kernel where `use_kernel` allows it, else PyTorch; mamba_ssm must be
    installed). CPU tensors always take PyTorch."""
    if choice not in SCAN_CHOICES:
        raise ValueError(f"scan must be one of {', '.join(SCAN_CHOICES)}, got {choice!r}")
    if choice == "mamba" and _cuda_selective_scan is None:
        raise ValueError("scan: mamba needs mamba_ssm with its CUDA extension (README \"CUDA machines\")")
    if choice == "triton":
        _triton_scan()  # fails here, with the reason, rather than at the first step
    global _scan_choice
    _scan_choice = choice


@functools.cache  # imported once, not at every scan
def _triton_scan():
    try:  # by name: a GPU kernel, no dependency of a CPU run (scan_dispatch.KERNELS)
        return load(KERNELS["triton"])
    except ImportError as err:
        raise ValueError(f"scan: triton needs the triton package (pip install -e '.[kernels]'): {err}") from None


def selective_scan(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
) -> Tensor:
    """Selective scan; CUDA tensors go where params `scan` says (`set_scan`), CPU tensors to the PyTorch scan.

    u, delta: (b, d, l); A: (d, n); B, C: (b, n, l) or (b, g, n, l); D, delta_bias: (d,);
    z: (b, d, l). Returns (b, d, l) in u's dtype.
    """
    if not u.is_cuda:
        return selective_scan_torch(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    grad = _needs_grad((u, delta, A, B, C, D, z, delta_bias))
    choice = _scan_choice
    if choice == "auto":
        choice = measured_choice(_device_name(u.device), (*u.shape, A.shape[1]), grad) or "auto"
    if choice == "triton":
        _check_shapes(u, delta, A, B, C, D, z, delta_bias)
        return _triton_scan()(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    if choice != "torch" and use_kernel(grad):
        return _cuda_selective_scan(u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus)
    return selective_scan_torch(u, delta, A, B, C, D, z, delta_bias, delta_softplus)


_device_names: dict[int, str] = {}


def _device_name(device: torch.device) -> str:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _device_names:
        _device_names[index] = torch.cuda.get_device_name(index)
    return _device_names[index]


def measured_choice(device_name: str, shape: tuple[int, int, int, int], grad: bool) -> str | None:
    """`scan: auto` on a GPU with timings in `scan_dispatch.MEASURED`: the scan fastest at the nearest measured
    shape (b, d, l, n) among those allowed now (mamba-ssm's kernel when `use_kernel` allows it, ours when triton
    imports); None (the rule without a table) on a GPU with none."""
    rows = MEASURED.get(device_name)
    if not rows:
        return None
    allowed = {"torch"} | ({"mamba"} if use_kernel(grad) else set()) | ({"triton"} if _triton_available() else set())
    return fastest(rows, shape, grad, allowed)


@functools.cache
def _triton_available() -> bool:
    try:
        _triton_scan()
    except ValueError:
        return False
    return True


def _needs_grad(inputs: tuple[Tensor | None, ...]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)


def use_kernel(needs_grad: bool) -> bool:
    """Whether CUDA tensors go to mamba_ssm's kernel: when it is installed, except for training under torch's
    deterministic mode (params `deterministic`): its backward sums the gradients of A, D, delta_bias and of B, C
    shared by channels with atomic adds, whose order, hence rounding, changes from run to run. Its forward has no
    atomics."""
    if _cuda_selective_scan is None:
        return False
    return not (needs_grad and torch.are_deterministic_algorithms_enabled())


def selective_scan_torch(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
) -> Tensor:
    """Pure-PyTorch selective scan (any device); the CPU path and the oracle for the CUDA kernel.

    u, delta: (b, d, l); A: (d, n); B, C: (b, n, l) or (b, g, n, l); D, delta_bias: (d,);
    z: (b, d, l). Returns (b, d, l) in u's dtype.
    """
    _check_shapes(u, delta, A, B, C, D, z, delta_bias)
    inputs = (u, delta, A, B, C, D, z, delta_bias)
    with torch.autocast(u.device.type, enabled=False):  # params precision bf16: the scan itself stays float32
        if _needs_grad(inputs):
            return _SelectiveScan.apply(*inputs, delta_softplus)
        return _scan_no_grad(*inputs, delta_softplus)


def _check_shapes(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
) -> None:
    if u.dim() != 3:
        raise ValueError(f"u must be (b, d, l), got shape {tuple(u.shape)}")
    b, d, L = u.shape
    if delta.shape != u.shape:
        raise ValueError(f"delta must match u {tuple(u.shape)}, got {tuple(delta.shape)}")
    if A.dim() != 2 or A.shape[0] != d:
        raise ValueError(f"A must be (d={d}, n), got shape {tuple(A.shape)}")
    if A.is_complex():
        raise ValueError("complex A is not supported")
    n = A.shape[1]
    for name, t in (("B", B), ("C", C)):
        ok = (t.dim() == 3 and t.shape == (b, n, L)) or (
            t.dim() == 4 and t.shape[0] == b and t.shape[2:] == (n, L) and t.shape[1] >= 1 and d % t.shape[1] == 0
        )
        if not ok:
            raise ValueError(f"{name} must be (b, n, l) or (b, g, n, l) with g dividing d={d}, got {tuple(t.shape)}")
    groups_B, groups_C = (B.shape[1] if B.dim() == 4 else 1), (C.shape[1] if C.dim() == 4 else 1)
    if groups_B != groups_C:
        raise ValueError(f"B and C must have the same number of groups, got {groups_B} and {groups_C}")
    for name, t in (("D", D), ("delta_bias", delta_bias)):
        if t is not None and t.shape != (d,):
            raise ValueError(f"{name} must be (d={d},), got shape {tuple(t.shape)}")
    if z is not None and z.shape != u.shape:
        raise ValueError(f"z must match u {tuple(u.shape)}, got {tuple(z.shape)}")


def _to_steps(t: Tensor) -> Tensor:
    """(b, ..., l) -> (l, b, ...) float32 contiguous, so each time step is one contiguous slice."""
    return t.float().movedim(-1, 0).contiguous()


def _grouped(t: Tensor) -> Tensor:
    """B or C (b, n, l) or (b, g, n, l) -> (l, b, g, n) float32."""
    return _to_steps(t if t.dim() == 4 else t.unsqueeze(1))


def _ungrouped(grad: Tensor, like: Tensor) -> Tensor:
    """(l, b, g, n) -> the layout and dtype of B or C."""
    grad = grad.movedim(0, -1)
    return (grad if like.dim() == 4 else grad.squeeze(1)).to(like.dtype)


def _from_steps(t: Tensor, dtype: torch.dtype) -> Tensor:
    """(l, b, ...) -> (b, ..., l) contiguous, in the given dtype."""
    return t.movedim(0, -1).to(dtype).contiguous()


def _discretise(delta: Tensor, delta_bias: Tensor | None, softplus: bool) -> tuple[Tensor, Tensor]:
    """delta: (b, d, l) -> (dt_raw, dt), both (l, b, d) float32."""
    dt_raw = _to_steps(delta)
    if delta_bias is not None:
        dt_raw = dt_raw + delta_bias.float()
    return dt_raw, (F.softplus(dt_raw) if softplus else dt_raw)


def _skip_and_gate(y: Tensor, u: Tensor, D: Tensor | None, z: Tensor | None) -> tuple[Tensor, Tensor]:
    """y + D * u, then times silu(z). y, u: (l, b, d). Returns (output, the pre-gate value)."""
    if D is not None:
        y = y + D.float() * u
    return (y if z is None else y * F.silu(_to_steps(z))), y


def _states(dt: Tensor, u: Tensor, A: Tensor, B: Tensor) -> tuple[Tensor, Tensor]:
    """Run the recurrence. dt, u: (l, b, d); A: (d, n); B: (l, b, g, n).

    Returns dA: (l-1, b, d, n) = exp(dt_t * A) for t >= 1 (dA_0 only ever multiplies h_{-1} = 0)
    and hs: (l, b, d, n), the states h_t.
    """
    L, b, d = u.shape
    g, n = B.shape[2], B.shape[3]
    # in place where possible: fresh (l, b, d, n) buffers cost as much as the arithmetic on cpu
    dA = torch.mul(dt[1:].unsqueeze(-1), A).exp_()
    # h_t starts as dt_t * u_t * B_t and is then updated in place
    hs = ((dt * u).view(L, b, g, d // g, 1) * B.unsqueeze(3)).view(L, b, d, n)
    for t in range(1, L):
        hs[t].addcmul_(dA[t - 1], hs[t - 1])
    return dA, hs


def _sum_over_state(x: Tensor, v: Tensor) -> Tensor:
    """out[..., k] = sum_n x[..., k, n] v[..., n]. x: (l, b, g, k, n); v: (l, b, g, n) -> (l, b, g, k)."""
    L, b, g, k, n = x.shape
    return torch.bmm(x.reshape(L * b * g, k, n), v.reshape(L * b * g, n, 1)).view(L, b, g, k)


def _sum_over_channels(x: Tensor, v: Tensor) -> Tensor:
    """out[..., n] = sum_k v[..., k] x[..., k, n]. x: (l, b, g, k, n); v: (l, b, g, k) -> (l, b, g, n)."""
    L, b, g, k, n = x.shape
    return torch.bmm(v.reshape(L * b * g, 1, k), x.reshape(L * b * g, k, n)).view(L, b, g, n)


def _scan_no_grad(u, delta, A, B, C, D, z, delta_bias, delta_softplus) -> Tensor:
    """Inference path: same result as _SelectiveScan without keeping (l, b, d, n) tensors."""
    u_s, B_s, C_s = _to_steps(u), _grouped(B), _grouped(C)
    L, b, d = u_s.shape
    g, n = B_s.shape[2], B_s.shape[3]
    k = d // g
    _, dt = _discretise(delta, delta_bias, delta_softplus)
    A_f = A.float()
    dtu = (dt * u_s).view(L, b, g, k, 1)
    # fresh (b, d, n) buffers every step cost as much as the arithmetic on cpu: reuse them
    h, decay = dtu[0] * B_s[0].unsqueeze(2), u_s.new_empty(b, d, n)  # h: (b, g, k, n)
    y = u_s.new_empty(L, b * g, k, 1)
    for t in range(L):
        if t > 0:
            torch.mul(dt[t].unsqueeze(-1), A_f, out=decay)
            h.view(b, d, n).mul_(decay.exp_())
            h.addcmul_(dtu[t], B_s[t].unsqueeze(2))
        torch.bmm(h.view(b * g, k, n), C_s[t].view(b * g, n, 1), out=y[t])
    out, _ = _skip_and_gate(y.view(L, b, d), u_s, D, z)
    return _from_steps(out, u.dtype)


class _SelectiveScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, delta_softplus):
        u_s, B_s, C_s = _to_steps(u), _grouped(B), _grouped(C)
        L, b, d = u_s.shape
        g, n = B_s.shape[2], B_s.shape[3]
        dt_raw, dt = _discretise(delta, delta_bias, delta_softplus)
        dA, hs = _states(dt, u_s, A.float(), B_s)
        out, y = _skip_and_gate(_sum_over_state(hs.view(L, b, g, d // g, n), C_s).view(L, b, d), u_s, D, z)
        # the pre-gate y is all that backward needs beyond the states
        ctx.save_for_backward(u_s, dt_raw, dt, A, B, C, D, z, delta_bias, dA, hs, y if z is not None else None)
        ctx.delta_softplus = delta_softplus
        ctx.dtypes = (u.dtype, delta.dtype)
        return _from_steps(out, u.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        u_s, dt_raw, dt, A, B, C, D, z, delta_bias, dA, hs, y = ctx.saved_tensors
        need = ctx.needs_input_grad
        L, b, d = u_s.shape
        A_f, B_s, C_s = A.float(), _grouped(B), _grouped(C)
        g, n = B_s.shape[2], B_s.shape[3]
        gy = _to_steps(grad_out)  # (l, b, d)

        grad_z = grad_D = None
        if z is not None:
            z_s = _to_steps(z)
            sig = torch.sigmoid(z_s)
            # d silu(z)/dz = sig * (1 + z * (1 - sig))
            grad_z = _from_steps(gy * y * sig * (1 + z_s * (1 - sig)), z.dtype)
            gy = gy * z_s * sig
        if D is not None:
            grad_D = (gy * u_s).sum((0, 1)).to(D.dtype)

        gy_g = gy.view(L, b, g, d // g)
        grad_C = _ungrouped(_sum_over_channels(hs.view(L, b, g, d // g, n), gy_g), C) if need[4] else None
        # dh_t = C_t * dy_t + dA_{t+1} * dh_{t+1}, accumulated in place in reverse time
        dh = (gy_g.unsqueeze(-1) * C_s.unsqueeze(3)).view(L, b, d, n)
        for t in range(L - 2, -1, -1):
            dh[t].addcmul_(dA[t], dh[t + 1])
        dh_g = dh.view(L, b, g, d // g, n)

        dtu = dt * u_s
        grad_B = _ungrouped(_sum_over_channels(dh_g, dtu.view(L, b, g, d // g)), B) if need[3] else None
        grad_dtu = _sum_over_state(dh_g, B_s).view(L, b, d)  # d loss / d (dt_t u_t)
        grad_u = grad_dtu * dt
        if D is not None:
            grad_u += gy * D.float()
        grad_dt = grad_dtu * u_s

        grad_A = torch.zeros_like(A_f) if need[2] else None
        if L > 1:
            # grad of s_t = dt_t * A is dh_t * h_{t-1} * dA_t, built in place over dh (no longer needed)
            ds = dh[1:].mul_(hs[:-1]).mul_(dA).view((L - 1) * b, d, n)
            if need[2]:
                grad_A = torch.bmm(dt[1:].reshape(-1, d).t().unsqueeze(1), ds.transpose(0, 1)).view(d, n)
            grad_dt[1:] += ds.mul_(A_f).sum(-1).view(L - 1, b, d)
        if need[2]:
            grad_A = grad_A.to(A.dtype)

        grad_delta = grad_dt * torch.sigmoid(dt_raw) if ctx.delta_softplus else grad_dt
        grad_bias = grad_delta.sum((0, 1)).to(delta_bias.dtype) if delta_bias is not None else None
        return (
            _from_steps(grad_u, ctx.dtypes[0]),
            _from_steps(grad_delta, ctx.dtypes[1]),
            grad_A,
            grad_B,
            grad_C,
            grad_D,
            grad_z,
            grad_bias,
            None,
        )
