"""Selective scan in Triton, for the short sequences of SS2D: the state lives in registers, each program loops
over l, and the backward has no atomics (deterministic: partial sums are reduced in a fixed order).

Same arguments and semantics as `pipeline.ops.selective_scan.selective_scan_torch` (see there): u, delta, z
(b, d, l); A (d, n) real; B, C (b, n, l) or (b, g, n, l) with g contiguous groups of channels; D, delta_bias
(d,). u, delta, z, B, C may be float32, bfloat16 or float16; the state and all arithmetic are float32, the
output has u's dtype. All K scan paths of SS2D are one call: they are groups of channels with their own B, C.

Layout of the work. The forward runs a (b, d / BLOCK_D) grid; a program holds h, a (BLOCK_D, n) float32 tile,
and for t = 0 .. l-1 does h = exp(dt_t A) h + dt_t u_t B_t, y_t = C_t . h + D u_t (eq. ssm_branch_s6_recurrence).
It stores only y. The backward runs a (ceil(b / BATCH_PER_PROGRAM), d / BLOCK_D) grid; per batch element a
program
  1. runs the recurrence forward again, writing the gradient of the pre-gate output, the gate's gradient, this
     block's share of dC_t = sum_d dy_t h_t, and h at the end of every CHUNK steps (a checkpoint);
  2. runs backward in time, dh_t = C_t dy_t + exp(dt_{t+1} A) dh_{t+1}, re-deriving h_{t-1} from the last
     checkpoint (at most CHUNK - 1 steps), and writes du, ddelta and this block's share of dB_t; dA, dD and
     ddelta_bias are summed over its batch elements in registers.
The shares of dB, dC (over the channel blocks of a group) and of dA, dD, ddelta_bias (over batch chunks) are
then summed by torch in a fixed order. Memory besides inputs and outputs: the checkpoints, (b, ceil(l / CHUNK)
- 1, d, n) float32, and the shares; nothing of size (l, b, d, n).

Without a GPU, Triton's interpreter runs these kernels on CPU tensors (TRITON_INTERPRET=1, set here when torch
sees no CUDA device): that is how the oracle tests run in CI. It is for tests, far too slow for training.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

CHUNK = 8  # steps between checkpoints of h in the backward; recomputation costs at most CHUNK - 1 steps
MAX_BLOCK_D = 32
BATCH_PER_PROGRAM = 8  # batch elements one backward program sums dA, dD, ddelta_bias over


@triton.jit
def _step_inputs(u_ptr, dt_ptr, bias, row, t, mask_d, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """u_t, dt_t after bias and softplus, and the raw dt_t (all (BLOCK_D,) float32)."""
    u_t = tl.load(u_ptr + row + t, mask=mask_d, other=0.0).to(tl.float32)
    raw = tl.load(dt_ptr + row + t, mask=mask_d, other=0.0).to(tl.float32)
    if HAS_BIAS:
        raw = raw + bias
    dt_t = raw
    if SOFTPLUS:
        # torch's softplus: log(1 + e^x), and x itself above 20
        dt_t = tl.where(raw <= 20.0, tl.log(1.0 + tl.exp(tl.minimum(raw, 20.0))), raw)
    return u_t, dt_t, raw


@triton.jit
def _state_row(ptr, bc, t, mask_n):
    """B_t or C_t of this program's group: (BLOCK_N,) float32."""
    return tl.load(ptr + bc + t, mask=mask_n, other=0.0).to(tl.float32)


@triton.jit
def _advance(h, A, dt_t, u_t, B_t):
    """One step of the recurrence: h_t = exp(dt_t A) h_{t-1} + dt_t u_t B_t."""
    return tl.exp(dt_t[:, None] * A) * h + (dt_t * u_t)[:, None] * B_t[None, :]


@triton.jit
def _scan_step(u_ptr, dt_ptr, B_ptr, C_ptr, A, bias, row, bc, t, h, mask_d, mask_n, HAS_BIAS: tl.constexpr,
               SOFTPLUS: tl.constexpr):
    """Step t of the recurrence from h_{t-1}: h_t, u_t and C_t."""
    u_t, dt_t, raw = _step_inputs(u_ptr, dt_ptr, bias, row, t, mask_d, HAS_BIAS, SOFTPLUS)
    h = _advance(h, A, dt_t, u_t, _state_row(B_ptr, bc, t, mask_n))
    return h, u_t, _state_row(C_ptr, bc, t, mask_n)


@triton.jit
def _channel_block(A_ptr, D_ptr, bias_ptr, pid_d, d, n, g, HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """A program's channels and states: offsets, masks, the (d, n) tile offsets, its group (BLOCK_D divides d // g:
    one group per program), and its A tile, delta_bias and D in float32 (zeros when absent)."""
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_d = offs_d < d
    mask_n = offs_n < n
    mask_dn = mask_d[:, None] & mask_n[None, :]
    tile = offs_d[:, None] * n + offs_n[None, :]
    group = (pid_d * BLOCK_D) // (d // g)
    A = tl.load(A_ptr + tile, mask=mask_dn, other=0.0).to(tl.float32)
    bias = tl.zeros([BLOCK_D], dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    Dv = tl.zeros([BLOCK_D], dtype=tl.float32)
    if HAS_D:
        Dv = tl.load(D_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    return offs_d, offs_n, mask_d, mask_n, mask_dn, tile, group, A, bias, Dv


@triton.jit
def _scan_fwd_kernel(
    u_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, out_ptr,
    d, L, n, g,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_b = tl.program_id(0)
    offs_d, offs_n, mask_d, mask_n, mask_dn, tile, group, A, bias, Dv = _channel_block(
        A_ptr, D_ptr, bias_ptr, tl.program_id(1), d, n, g, HAS_D, HAS_BIAS, BLOCK_D, BLOCK_N)
    row = pid_b * d * L + offs_d * L
    bc = (pid_b * g + group) * n * L + offs_n * L
    h = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    for t in range(L):
        h, u_t, C_t = _scan_step(u_ptr, dt_ptr, B_ptr, C_ptr, A, bias, row, bc, t, h, mask_d, mask_n, HAS_BIAS,
                                 SOFTPLUS)
        y = tl.sum(h * C_t[None, :], axis=1) + Dv * u_t
        if HAS_Z:
            z_t = tl.load(z_ptr + row + t, mask=mask_d, other=0.0).to(tl.float32)
            y = y * z_t * tl.sigmoid(z_t)
        tl.store(out_ptr + row + t, y.to(out_ptr.dtype.element_ty), mask=mask_d)


@triton.jit
def _replay(u_ptr, dt_ptr, B_ptr, A, bias, row, bc, start, stop, h, mask_d, mask_n,
            HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """h after steps start .. stop - 1 of the recurrence, from h before step `start`."""
    for s in range(start, stop):
        u_s, dt_s, raw_s = _step_inputs(u_ptr, dt_ptr, bias, row, s, mask_d, HAS_BIAS, SOFTPLUS)
        B_s = _state_row(B_ptr, bc, s, mask_n)
        h = _advance(h, A, dt_s, u_s, B_s)
    return h


@triton.jit
def _bwd_forward(u_ptr, dt_ptr, B_ptr, C_ptr, z_ptr, gout_ptr, dz_ptr, gy_ptr, ckpt_ptr, dC_ptr,
                 A, bias, Dv, row, bc, share, ckpt, dD_acc, d, L, n, mask_d, mask_n, mask_dn,
                 HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_N: tl.constexpr, CHUNK_L: tl.constexpr):
    """Backward, part 1, one batch element: the recurrence forward again, writing the gradient of the pre-gate
    output, the gate's gradient, this block's share of dC_t = sum_d dy_t h_t, and h every CHUNK_L steps; returns
    dD_acc plus this element's sum of dy * u."""
    h = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    for t in range(L):
        h, u_t, C_t = _scan_step(u_ptr, dt_ptr, B_ptr, C_ptr, A, bias, row, bc, t, h, mask_d, mask_n, HAS_BIAS,
                                 SOFTPLUS)
        gy = tl.load(gout_ptr + row + t, mask=mask_d, other=0.0).to(tl.float32)
        if HAS_Z:
            y = tl.sum(h * C_t[None, :], axis=1) + Dv * u_t
            z_t = tl.load(z_ptr + row + t, mask=mask_d, other=0.0).to(tl.float32)
            sig = tl.sigmoid(z_t)
            # d silu(z)/dz = sig (1 + z (1 - sig))
            dz = gy * y * sig * (1.0 + z_t * (1.0 - sig))
            tl.store(dz_ptr + row + t, dz.to(dz_ptr.dtype.element_ty), mask=mask_d)
            gy = gy * z_t * sig
        tl.store(gy_ptr + row + t, gy, mask=mask_d)
        dD_acc += gy * u_t
        tl.store(dC_ptr + share + t, tl.sum(gy[:, None] * h, axis=0), mask=mask_n)
        if (t + 1) % CHUNK_L == 0:
            if t + 1 < L:
                tl.store(ckpt_ptr + ckpt + ((t + 1) // CHUNK_L - 1) * d * n, h, mask=mask_dn)
    return dD_acc


@triton.jit
def _bwd_reverse(u_ptr, dt_ptr, B_ptr, C_ptr, gy_ptr, ckpt_ptr, du_ptr, ddt_ptr, dB_ptr,
                 A, bias, Dv, row, bc, share, ckpt, dA_acc, dbias_acc, d, L, n, mask_d, mask_n, mask_dn,
                 HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                 CHUNK_L: tl.constexpr):
    """Backward, part 2, one batch element: backward in time, chunk by chunk, dh_t = C_t dy_t + exp(dt_{t+1} A)
    dh_{t+1}, h_{t-1} re-derived from the chunk's checkpoint; writes du, ddelta and this block's share of dB_t;
    returns dA_acc and dbias_acc plus this element's sums."""
    dh = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    decay_next = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)  # exp(dt_{t+1} A); dh_{l} = 0
    n_chunks = tl.cdiv(L, CHUNK_L)
    for cr in range(n_chunks):
        c = n_chunks - 1 - cr
        start = c * CHUNK_L
        end = tl.minimum(start + CHUNK_L, L)
        for tr in range(end - start):
            t = end - 1 - tr
            u_t, dt_t, raw = _step_inputs(u_ptr, dt_ptr, bias, row, t, mask_d, HAS_BIAS, SOFTPLUS)
            B_t = _state_row(B_ptr, bc, t, mask_n)
            C_t = _state_row(C_ptr, bc, t, mask_n)
            gy = tl.load(gy_ptr + row + t, mask=mask_d, other=0.0)
            dh = decay_next * dh + gy[:, None] * C_t[None, :]
            h_prev = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
            if c > 0:
                h_prev = tl.load(ckpt_ptr + ckpt + (c - 1) * d * n, mask=mask_dn, other=0.0)
            h_prev = _replay(u_ptr, dt_ptr, B_ptr, A, bias, row, bc, start, t, h_prev, mask_d, mask_n, HAS_BIAS,
                             SOFTPLUS)
            decay = tl.exp(dt_t[:, None] * A)
            grad_dtu = tl.sum(dh * B_t[None, :], axis=1)  # d loss / d (dt_t u_t)
            ds = dh * h_prev * decay  # d loss / d (dt_t A)
            dA_acc += ds * dt_t[:, None]
            grad_dt = grad_dtu * u_t + tl.sum(ds * A, axis=1)
            grad_u = grad_dtu * dt_t + gy * Dv
            if SOFTPLUS:
                grad_dt = grad_dt * tl.sigmoid(raw)
            dbias_acc += grad_dt
            tl.store(du_ptr + row + t, grad_u.to(du_ptr.dtype.element_ty), mask=mask_d)
            tl.store(ddt_ptr + row + t, grad_dt.to(ddt_ptr.dtype.element_ty), mask=mask_d)
            tl.store(dB_ptr + share + t, tl.sum(dh * (dt_t * u_t)[:, None], axis=0), mask=mask_n)
            decay_next = decay
    return dA_acc, dbias_acc


@triton.jit
def _scan_bwd_kernel(
    u_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, gout_ptr,
    du_ptr, ddt_ptr, dz_ptr, gy_ptr, ckpt_ptr, dB_ptr, dC_ptr, dA_ptr, dD_ptr, dbias_ptr,
    b, d, L, n, g, n_ckpt,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK_L: tl.constexpr, BATCH: tl.constexpr,
):
    pid_c = tl.program_id(0)
    pid_d = tl.program_id(1)
    n_dblocks = tl.num_programs(1)
    offs_d, offs_n, mask_d, mask_n, mask_dn, tile, group, A, bias, Dv = _channel_block(
        A_ptr, D_ptr, bias_ptr, pid_d, d, n, g, HAS_D, HAS_BIAS, BLOCK_D, BLOCK_N)
    dA_acc = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    dD_acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    dbias_acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for pid_b in range(pid_c * BATCH, tl.minimum(pid_c * BATCH + BATCH, b)):
        row = pid_b * d * L + offs_d * L
        bc = (pid_b * g + group) * n * L + offs_n * L
        share = (pid_b * n_dblocks + pid_d) * n * L + offs_n * L  # dB, dC shares: (b, d / BLOCK_D, n, l)
        ckpt = pid_b * n_ckpt * d * n + tile
        dD_acc = _bwd_forward(u_ptr, dt_ptr, B_ptr, C_ptr, z_ptr, gout_ptr, dz_ptr, gy_ptr, ckpt_ptr, dC_ptr,
                              A, bias, Dv, row, bc, share, ckpt, dD_acc, d, L, n, mask_d, mask_n, mask_dn,
                              HAS_Z, HAS_BIAS, SOFTPLUS, BLOCK_D, BLOCK_N, CHUNK_L)
        dA_acc, dbias_acc = _bwd_reverse(u_ptr, dt_ptr, B_ptr, C_ptr, gy_ptr, ckpt_ptr, du_ptr, ddt_ptr, dB_ptr,
                                         A, bias, Dv, row, bc, share, ckpt, dA_acc, dbias_acc, d, L, n, mask_d,
                                         mask_n, mask_dn, HAS_BIAS, SOFTPLUS, BLOCK_D, BLOCK_N, CHUNK_L)
    partial = pid_c * d
    tl.store(dA_ptr + partial * n + tile, dA_acc, mask=mask_dn)
    tl.store(dD_ptr + partial + offs_d, dD_acc, mask=mask_d)
    tl.store(dbias_ptr + partial + offs_d, dbias_acc, mask=mask_d)


def _block_d(channels_per_group: int) -> int:
    """The largest power of two <= MAX_BLOCK_D dividing the group size, so a program's channels share B, C."""
    block = 1
    while block < MAX_BLOCK_D and channels_per_group % (2 * block) == 0:
        block *= 2
    return block


def _block_n(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def _layout(u, delta, A, B, C, D, z, delta_bias):
    """Contiguous (b, d, l) / (b, g, n, l) views and the sizes the kernels take."""
    b, d, L = u.shape
    n = A.shape[1]
    Bg = (B if B.dim() == 4 else B.unsqueeze(1)).contiguous()
    Cg = (C if C.dim() == 4 else C.unsqueeze(1)).contiguous()
    g = Bg.shape[1]
    opt = tuple(t.contiguous() if t is not None else None for t in (D, z, delta_bias))
    return (u.contiguous(), delta.contiguous(), A.float().contiguous(), Bg, Cg, *opt), (b, d, L, n, g)


def _flags(D, z, delta_bias, softplus):
    return dict(HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(softplus))


def scan_forward(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """Forward only: (b, d, l) in u's dtype."""
    (u, delta, A, Bg, Cg, D, z, delta_bias), (b, d, L, n, g) = _layout(u, delta, A, B, C, D, z, delta_bias)
    out = torch.empty_like(u)
    block_d = _block_d(d // g)
    dummy = u  # never read: its HAS_* flag is off
    _scan_fwd_kernel[(b, d // block_d)](
        u, delta, A, Bg, Cg, D if D is not None else dummy, z if z is not None else dummy,
        delta_bias if delta_bias is not None else dummy, out, d, L, n, g,
        **_flags(D, z, delta_bias, delta_softplus), BLOCK_D=block_d, BLOCK_N=_block_n(n),
    )
    return out


def scan_backward(grad_out, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """Gradients (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias) in the layouts and dtypes of the inputs;
    None for D, z, delta_bias when they are None. Deterministic: no atomics, fixed-order sums."""
    shapes = (B.dim(), C.dim())
    (u_c, delta_c, A_f, Bg, Cg, D_c, z_c, bias_c), (b, d, L, n, g) = _layout(u, delta, A, B, C, D, z, delta_bias)
    block_d = _block_d(d // g)
    n_dblocks, n_batch = d // block_d, triton.cdiv(b, BATCH_PER_PROGRAM)
    n_ckpt = max(triton.cdiv(L, CHUNK) - 1, 1)
    f32 = dict(device=u.device, dtype=torch.float32)
    du, ddelta = torch.empty_like(u_c), torch.empty_like(delta_c)
    dz = torch.empty_like(z_c) if z_c is not None else du
    gy = torch.empty(b, d, L, **f32)
    ckpt = torch.empty(b, n_ckpt, d, n, **f32)
    dB_share, dC_share = torch.empty(b, n_dblocks, n, L, **f32), torch.empty(b, n_dblocks, n, L, **f32)
    dA_share, dD_share, dbias_share = (torch.empty(n_batch, d, n, **f32), torch.empty(n_batch, d, **f32),
                                       torch.empty(n_batch, d, **f32))
    _scan_bwd_kernel[(n_batch, n_dblocks)](
        u_c, delta_c, A_f, Bg, Cg, D_c if D_c is not None else u_c, z_c if z_c is not None else u_c,
        bias_c if bias_c is not None else u_c, grad_out.contiguous(),
        du, ddelta, dz, gy, ckpt, dB_share, dC_share, dA_share, dD_share, dbias_share,
        b, d, L, n, g, n_ckpt,
        **_flags(D, z, delta_bias, delta_softplus), BLOCK_D=block_d, BLOCK_N=_block_n(n), CHUNK_L=CHUNK,
        BATCH=BATCH_PER_PROGRAM,
    )

    def per_group(share, like_dim, like):
        out = share.view(b, g, n_dblocks // g, n, L).sum(2)
        return (out if like_dim == 4 else out.squeeze(1)).to(like.dtype)

    return (
        du, ddelta, dA_share.sum(0).to(A.dtype), per_group(dB_share, shapes[0], B), per_group(dC_share, shapes[1], C),
        dD_share.sum(0).to(D.dtype) if D is not None else None, dz if z is not None else None,
        dbias_share.sum(0).to(delta_bias.dtype) if delta_bias is not None else None,
    )


class SelectiveScanTriton(torch.autograd.Function):
    """The Triton scan with its deterministic backward; `selective_scan_triton` is the entry point."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, delta_softplus):
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias)
        ctx.delta_softplus = delta_softplus
        return scan_forward(u, delta, A, B, C, D, z, delta_bias, delta_softplus)

    @staticmethod
    def backward(ctx, grad_out):
        grads = scan_backward(grad_out, *ctx.saved_tensors, delta_softplus=ctx.delta_softplus)
        return (*grads, None)


def selective_scan_triton(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """Triton selective scan (forward and deterministic backward); arguments as `selective_scan_torch`."""
    return SelectiveScanTriton.apply(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
