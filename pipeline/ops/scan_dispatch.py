"""Which selective scan `scan: auto` runs on a GPU, per call shape, from timings measured on that GPU.

MEASURED maps a GPU's name (torch.cuda.get_device_name) to rows (b, d, l, n, grad, {scan: median ms}) written by
`fscil model cost --scan-grid` on it (its date in the comment above the rows). For a call, `auto` takes the scan
that was fastest at the nearest measured shape (distance in log b, d, l, n; the same grad) among the scans allowed
now; on a GPU with no rows it keeps the rule measured before any table existed: mamba-ssm's kernel where it is
installed and allowed, else the PyTorch scan.
"""

from __future__ import annotations

import math

Row = tuple[int, int, int, int, bool, dict[str, float]]

# params `scan`: which selective scan CUDA tensors take (`pipeline.ops.selective_scan.set_scan`)
SCAN_CHOICES = ("auto", "torch", "triton", "mamba")

# GPU kernels of ours, imported by name when a CUDA run asks for them (params `scan`): a CPU run never runs them, so
# they are no DVC dependency of the stages (stages/dvc_deps.py), and editing one re-runs nothing. They are checked
# against the PyTorch scan by their tests; a CUDA run made before an edit is rerun with `dvc repro -f`.
KERNELS = {"triton": "pipeline.ops.selective_scan_triton:selective_scan_triton"}

MEASURED: dict[str, tuple[Row, ...]] = {
    # no GPU has been measured yet: `fscil model cost --device cuda --scan-grid` prints the rows to paste here
}


def fastest(rows: tuple[Row, ...], shape: tuple[int, int, int, int], grad: bool, allowed: set[str]) -> str | None:
    """The fastest allowed scan at the measured shape nearest `shape` (b, d, l, n) with the same grad; None without
    one."""
    candidates = [row for row in rows if row[4] == grad and set(row[5]) & allowed]
    if not candidates:
        return None

    def distance(row: Row) -> float:
        return sum(math.log(max(a, 1) / max(m, 1)) ** 2 for a, m in zip(shape, row[:4], strict=True))

    times = min(candidates, key=distance)[5]
    return min((scan for scan in times if scan in allowed), key=times.__getitem__)


def grid_literal(device: str, date: str, rows: list[Row]) -> str:
    """MEASURED's entry for `device` as Python source, one row a line (what `--scan-grid` prints)."""
    lines = [f"    # {device}, measured {date} by `fscil model cost --device cuda --scan-grid`", f"    {device!r}: ("]
    for *shape, grad, times in rows:
        timed = ", ".join(f"{scan!r}: {ms:.4g}" for scan, ms in times.items())
        lines.append(f"        ({', '.join(map(str, shape))}, {grad}, {{{timed}}}),")
    return "\n".join(lines + ["    ),"])
