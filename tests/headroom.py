"""Thresholds on what a trained (or randomly initialised) model does, asserted through one helper so that their
headroom can be measured: a test's verdict must not depend on the CPU, the kernel path or the seed.

`learned(name, value, op, bar)` asserts `value op bar` and, when FSCIL_HEADROOM_LOG names a file, first appends
{name, value, bar, op, seed, kernels} to it as a JSON line. To measure a threshold's headroom, run the tests that
carry it under the pins (the suite's default), under another kernel path (FSCIL_CPU_KERNELS=native
ATEN_CPU_CAPABILITY=default) and under other seeds (FSCIL_TEST_SEED=1, 2: the seed of the tests' params and of the
global torch seed) with FSCIL_HEADROOM_LOG set, then `python -m tests.headroom LOG` prints the table: a threshold
stands where the worst value is clearly past it. Under another seed a test's other, exact-by-construction
assertions may fail after the value is logged; the log is what counts there.
"""

from __future__ import annotations

import json
import operator
import os
import sys
from pathlib import Path

TEST_SEED = int(os.environ.get("FSCIL_TEST_SEED", "0"))  # 0: the suite's seed; 1, 2: headroom measurements
OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def kernels() -> str:
    """The kernel setting this process computes with: `pinned` (the pipeline's) or `native:<capability>`."""
    if os.environ.get("FSCIL_CPU_KERNELS") == "native":
        return f"native:{os.environ.get('ATEN_CPU_CAPABILITY', 'highest')}"
    return "pinned"


def learned(name: str, value: float, op: str, bar: float, detail: object = None) -> None:
    """assert value <op> bar, logging the measurement first (module docstring); `detail` joins the message."""
    value = float(value)
    log = os.environ.get("FSCIL_HEADROOM_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"name": name, "value": value, "op": op, "bar": bar, "seed": TEST_SEED,
                                "kernels": kernels()}) + "\n")
    assert OPS[op](value, bar), f"{name}: {value:.6g} is not {op} {bar:g}" + (f" ({detail})" if detail else "")


def table(lines: list[str]) -> str:
    """Markdown: one row a threshold, one column a (kernels, seed) setting, then the worst value's margin."""
    rows: dict[str, dict] = {}
    settings: list[tuple[str, int]] = []
    for line in lines:
        m = json.loads(line)
        setting = (m["kernels"], m["seed"])
        if setting not in settings:
            settings.append(setting)
        row = rows.setdefault((m["name"], m["op"], m["bar"]), {"values": {}})  # a two-sided test: two rows
        row["values"][setting] = m["value"]
    settings.sort(key=lambda s: (s[0] != "pinned", s[1], s[0]))
    head = "| threshold | " + " | ".join(f"{k}, seed {s}" for k, s in settings) + " | worst margin |"
    out = [head, "|" + "---|" * (len(settings) + 2)]
    for (name, op, bar), row in rows.items():
        values = [row["values"].get(s) for s in settings]
        seen = [v for v in values if v is not None]
        worst = min(seen) if op in (">", ">=") else max(seen)
        margin = worst - bar if op in (">", ">=") else bar - worst
        cells = " | ".join("-" if v is None else f"{v:.4g}" for v in values)
        out.append(f"| `{name}` {op} {bar:g} | {cells} | {margin:+.4g} |")
    return "\n".join(out)


if __name__ == "__main__":
    print(table(Path(sys.argv[1]).read_text().splitlines()))
