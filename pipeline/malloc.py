"""glibc's malloc told to keep freed memory for reuse, so that training does not hand every large tensor back to the
kernel and fault it in again on the next step.

By default glibc serves each allocation above a threshold (128 KiB, raised as it sees frees, up to 32 MiB) with its
own mmap and returns it to the kernel when freed, and trims the heap's free top above 128 KiB: a training step that
allocates and frees the same activations each time then pays for fresh zeroed pages every step (on the default run's
base stage: 570,000 page faults and 1.9 s of system time over two epochs; with `keep_freed_memory`, 120,000 and
0.5 s). The numbers computed do not change (torch aligns every CPU tensor itself); the process's resident memory then
stays near its peak until it exits. FSCIL_MALLOC=default keeps glibc's own behaviour; other C libraries are left
alone. docs/research/where-the-time-goes.md measures it.
"""

from __future__ import annotations

import ctypes
import os
import sys

OPT_OUT = "FSCIL_MALLOC"  # =default: glibc's own thresholds
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
MMAP_THRESHOLD = 1 << 30  # allocations below 1 GiB come from the heap, whose freed memory is reused
TRIM_THRESHOLD = (1 << 31) - 1  # the heap's free top is never handed back while the process runs


def keep_freed_memory(environ=os.environ) -> bool:
    """Raise glibc's mmap and trim thresholds for this process (`mallopt`); True when set. Nothing on a C library
    other than glibc, or with FSCIL_MALLOC=default. May be called at any time: it governs allocations made after."""
    if environ.get(OPT_OUT, "keep") == "default" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # musl and others: their own malloc
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
