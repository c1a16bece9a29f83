"""pipeline/malloc.py: glibc keeps freed memory for reuse in a stage process, so that a loop allocating and freeing
the same large blocks faults its pages in once instead of every time; FSCIL_MALLOC=default keeps glibc's own."""

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.malloc import keep_freed_memory

# A block above glibc's largest automatic mmap threshold (32 MiB): by default each one is its own mmap, handed back
# to the kernel when freed and faulted in again (page by page) when the next is written.
LOOP = """
import ctypes, resource, sys
sys.path.insert(0, {root!r})
from pipeline.malloc import keep_freed_memory
set_ = keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
size = 64 << 20
def cycle():
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)
    libc.free(ctypes.c_void_p(p))
cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    cycle()
print(set_, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(env: dict) -> tuple[str, int]:
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-B", "-c", LOOP.format(root=root)], capture_output=True, text=True,
                         check=True, env=env).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    pages = (64 << 20) // 4096
    kept, faults_kept = _faults({"PATH": "/usr/bin:/bin"})
    default, faults_default = _faults({"PATH": "/usr/bin:/bin", "FSCIL_MALLOC": "default"})
    assert (kept, default) == ("True", "False")
    assert faults_default >= 10 * pages * 0.9  # glibc's own: every cycle faults its 16,384 pages in again
    assert faults_kept < pages  # kept: the heap's pages are written again without a fault


def test_opt_out_and_other_platforms_change_nothing():
    assert keep_freed_memory({"FSCIL_MALLOC": "default"}) is False
