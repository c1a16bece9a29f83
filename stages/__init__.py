"""Stage commands: each reads its params sections and input paths, calls one library function, writes its outputs.

Importing the package pins the CPU kernels (pipeline/portable.py) unless torch is already loaded: `python -m
stages.<name>` (what dvc.yaml runs) imports this package before the stage module, whose imports load torch.
"""

import sys

from pipeline.portable import pin_cpu_kernels

if "torch" not in sys.modules:  # a caller that already imported torch (tests, notebooks) keeps its kernels
    pin_cpu_kernels()
