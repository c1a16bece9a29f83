"""Stage commands: each reads its params sections and input paths, calls one library function, writes its outputs.

Importing the package pins the CPU kernels (pipeline/portable.py) unless torch is already loaded: `python -m
stages.<name>` (what dvc.yaml runs) imports this package before the stage module, whose imports load torch. It also
keeps freed memory in the process for reuse (pipeline/malloc.py: the same numbers, fewer page faults).
"""

import sys

from pipeline.malloc import keep_freed_memory
from pipeline.portable import pin_cpu_kernels

if "torch" not in sys.modules:  # a caller that already imported torch (tests, notebooks) keeps its kernels
    pin_cpu_kernels()
keep_freed_memory()
