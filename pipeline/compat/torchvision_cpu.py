"""Make the registry's CUDA-only torchvision importable on the CPU build of torch.

timm imports torchvision. The torchvision wheel that matches torch 2.13.0 is a CUDA build: its
C++ extension cannot load on CPU torch, so the op schemas it would register are missing and
`torchvision._meta_registrations` fails with "operator torchvision::nms does not exist".
Defining the two schemas it registers fake kernels for (`nms`, `qnms`) before torchvision loads
is enough for everything timm uses (the ops themselves then have no kernel and raise if called).

This is the one place that handles the problem. `python -m pipeline.compat.torchvision_cpu --install`
(run by `make install`) writes a `.pth` file into the environment's site-packages that installs a
lazy import hook: nothing happens at interpreter start-up except loading this file (by its path: not
our package, whose checkout is the working directory's) and registering the hook, and torch is
imported only when something imports torchvision. On a CUDA build of torch the hook does nothing.
"""

from __future__ import annotations

import importlib.abc
import sys
import sysconfig
from pathlib import Path

PTH_NAME = "fscil_torchvision_cpu.pth"
HOOK_MODULE = "_fscil_torchvision_cpu"  # the name the .pth file loads this file under (not `pipeline.compat...`)
_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_library = None  # keeps the torch.library.Library (and so the definitions) alive


def define_missing_schemas() -> None:
    """Define torchvision::nms / qnms on a CPU build of torch where nothing else will."""
    global _library
    import torch

    if torch.version.cuda is not None or _library is not None:
        return
    missing = [name for name in _SCHEMAS if not _has_op(f"torchvision::{name}")]
    if not missing:
        return
    _library = torch.library.Library("torchvision", "DEF")
    for name in missing:
        _library.define(_SCHEMAS[name])


def _has_op(qualname: str) -> bool:
    import torch

    try:
        torch._C._dispatch_find_schema_or_throw(qualname, "")
        return True
    except RuntimeError:
        return False


class _TorchvisionHook(importlib.abc.MetaPathFinder):
    """Runs `define_missing_schemas` once, just before torchvision is first imported."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            define_missing_schemas()
        return None  # let the normal finders import the module


def install_import_hook() -> None:
    # by name: the .pth file may run twice (site-packages reached by two paths, lib and lib64), each time loading
    # this file afresh, so the class differs
    if "torchvision" in sys.modules or any(type(f).__name__ == _TorchvisionHook.__name__ for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _TorchvisionHook())


def write_pth(site_packages: Path | None = None) -> Path:
    """Write the .pth file that installs the hook at every interpreter start of this environment."""
    site_packages = Path(site_packages or sysconfig.get_paths()["purelib"])
    target = site_packages / PTH_NAME
    # this file loaded by its path under a private name: the hook must not import our package at start-up, which
    # would bind `pipeline` to this checkout in every process (a copy's or another checkout's stages would run it)
    line = (f"import importlib.util as _u, os as _os; _f = {str(Path(__file__).resolve())!r}; "
            f"_s = _os.path.isfile(_f) and _u.spec_from_file_location({HOOK_MODULE!r}, _f); "
            "_m = _s and _u.module_from_spec(_s); _s and _s.loader.exec_module(_m); _m and _m.install_import_hook()")
    target.write_text(line + "\n")
    return target


if __name__ == "__main__":
    if sys.argv[1:] != ["--install"]:
        sys.exit("usage: python -m pipeline.compat.torchvision_cpu --install")
    print(f"wrote {write_pth()}")
