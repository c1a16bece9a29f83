"""`scan: auto` by measurement: the fastest allowed scan at the nearest measured shape, from the rows
`fscil model cost --scan-grid` prints for a GPU."""

from __future__ import annotations

import pytest

import pipeline.ops.selective_scan as scan_module
from pipeline.ops.scan_dispatch import fastest, grid_literal
from pipeline.research.benchmark import grid_rows, scan_grid

ROWS = ((8, 2560, 4, 256, True, {"torch": 3.0, "triton": 1.0, "mamba": 2.0}),
        (512, 2560, 4, 256, True, {"torch": 40.0, "triton": 30.0, "mamba": 10.0}),
        (8, 2560, 4, 256, False, {"torch": 1.0, "triton": 0.5, "mamba": 0.2}))


def test_the_nearest_measured_shape_decides_among_the_allowed_scans():
    everything = {"torch", "triton", "mamba"}
    assert fastest(ROWS, (16, 2560, 4, 256), True, everything) == "triton"  # nearer b 8 than b 512 (log scale)
    assert fastest(ROWS, (256, 2560, 4, 256), True, everything) == "mamba"
    assert fastest(ROWS, (256, 2560, 4, 256), True, {"torch", "triton"}) == "triton"  # mamba not allowed now
    assert fastest(ROWS, (8, 2560, 4, 256), False, {"torch"}) == "torch"
    assert fastest(ROWS[:2], (8, 2560, 4, 256), False, everything) is None  # nothing measured without gradients


def test_auto_on_a_measured_gpu_and_on_an_unmeasured_one(monkeypatch):
    monkeypatch.setattr(scan_module, "MEASURED", {"NVIDIA H200": ROWS})
    monkeypatch.setattr(scan_module, "_cuda_selective_scan", None)  # mamba-ssm not installed: never chosen
    monkeypatch.setattr(scan_module, "_triton_available", lambda: True)
    assert scan_module.measured_choice("NVIDIA H200", (512, 2560, 4, 256), True) == "triton"
    assert scan_module.measured_choice("NVIDIA A100", (512, 2560, 4, 256), True) is None  # the rule without a table


def test_the_grid_measures_each_shape_and_prints_rows_the_table_reads():
    table = scan_grid("cpu", 1, ("torch",), presets=("synthetic",), batches=(2, 3))
    assert len(table) == 4 and (table.ms > 0).all() and set(table.grad) == {False, True}
    assert set(table.d) == {4 * 128} and set(table.n) == {16}  # K x d_inner channels, d_state of the preset
    rows = grid_rows(table)
    source = grid_literal("Some GPU", "2026-11-28", rows)
    measured = eval("{" + source + "}")  # the text pasted into MEASURED
    assert [row[:5] for row in measured["Some GPU"]] == [row[:5] for row in rows]
    assert all(got[5] == pytest.approx(want[5], rel=1e-3) for got, want in zip(measured["Some GPU"], rows, strict=True))
    assert rows[0][:5] == (2, 512, table.l.iloc[0], 16, False)
