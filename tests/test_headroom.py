"""tests/headroom.py: `learned` asserts its threshold and logs the value; the table names each setting's value and the
worst margin (docs/research/test-headroom.md)."""

from __future__ import annotations

import json

import pytest

from tests.headroom import learned, table


def test_learned_logs_then_asserts(tmp_path, monkeypatch):
    log = tmp_path / "h.jsonl"
    monkeypatch.setenv("FSCIL_HEADROOM_LOG", str(log))
    learned("a", 0.9, ">=", 0.5)
    with pytest.raises(AssertionError, match=r"b: 0.4 is not >= 0.5 \(seed 3\)"):
        learned("b", 0.4, ">=", 0.5, detail="seed 3")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["name"], r["value"], r["op"], r["bar"]) for r in rows] == [("a", 0.9, ">=", 0.5), ("b", 0.4, ">=", 0.5)]
    assert all(r["kernels"] in ("pinned", "native:default") or r["kernels"].startswith("native:") for r in rows)


def test_the_table_gives_the_worst_margin_per_threshold_and_side():
    lines = [json.dumps({"name": n, "value": v, "op": op, "bar": bar, "seed": s, "kernels": k})
             for n, v, op, bar, s, k in (("r", 1.2, ">=", 0.5, 0, "pinned"), ("r", 0.8, ">=", 0.5, 1, "pinned"),
                                         ("r", 1.2, "<=", 2.0, 0, "pinned"), ("r", 1.9, "<=", 2.0, 1, "pinned"),
                                         ("r", 0.7, ">=", 0.5, 0, "native:default"))]
    rows = table(lines).splitlines()
    assert rows[0] == "| threshold | pinned, seed 0 | pinned, seed 1 | native:default, seed 0 | worst margin |"
    assert rows[2] == "| `r` >= 0.5 | 1.2 | 0.8 | 0.7 | +0.2 |"
    assert rows[3] == "| `r` <= 2 | 1.2 | 1.9 | - | +0.1 |"
