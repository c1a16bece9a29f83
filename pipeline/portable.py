"""CPU kernels pinned to one instruction set, so that a run gives the same numbers on every x86-64 machine
(docs/reliability.md).

PyTorch's CPU kernels pick their code path by the CPU they find: ATen's vectorised loops by ATEN_CPU_CAPABILITY
(default / avx2 / avx512), oneDNN's convolutions by its ISA (ONEDNN_MAX_CPU_ISA), MKL's GEMM by its branch (MKL_CBWR).
Different paths sum in different orders, and 200 epochs of training grow the last bits into other accuracies. The
`fscil` command pins ATen and oneDNN to AVX2 and MKL to its COMPATIBLE branch, the one MKL honours on every vendor
(it ignores AVX2 on AMD CPUs), before torch is imported (`pin_cpu_kernels`): every x86-64 CPU with AVX2 (Intel since
2013, AMD since 2015) then runs the same code paths; `fscil doctor` checks a machine. Torch must not be imported
before: each library reads its variable once, at its first use. Free of torch itself (the config code imports it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

# the variables and the values that pin each library's code path
PORTABLE = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "COMPATIBLE,STRICT"}
OPT_OUT = "FSCIL_CPU_KERNELS"  # =native: the fastest paths of this CPU (results then depend on the machine)


def pin_cpu_kernels(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set `PORTABLE` in `environ` (the user's own values of these variables are replaced: the run must not depend
    on them) unless FSCIL_CPU_KERNELS=native; returns what was set. Refused once torch is imported: it would be too
    late for the libraries that already read theirs."""
    if environ.get(OPT_OUT, "portable") == "native":
        return {}
    if environ is os.environ and "torch" in sys.modules:
        raise RuntimeError("pin_cpu_kernels must run before torch is imported")
    environ.update(PORTABLE)
    return dict(PORTABLE)
