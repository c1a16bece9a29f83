"""pipeline/compat/torchvision_cpu.py's start-up hook (the .pth file `make install` writes): torchvision imports on
the CPU build of torch, and the hook leaves our packages alone, so that a process started in another checkout, or in
a copy of this one (DVC's queued experiments, .dvc/tmp/exps/...), imports that checkout's library, not the one the
environment was installed from."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from pipeline.compat.torchvision_cpu import HOOK_MODULE, PTH_NAME, write_pth

INSTALLED = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
pytestmark = pytest.mark.skipif(not INSTALLED.is_file(), reason=f"no {PTH_NAME} in this environment (make install)")


def _python(code: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_installed_hook_is_what_install_writes(tmp_path):
    assert INSTALLED.read_text() == write_pth(tmp_path).read_text()


def test_start_up_loads_the_hook_and_none_of_our_packages(tmp_path):
    # the hook's module is not registered either: only the finder it installed holds it
    code = f"import sys; print([m for m in sys.modules if m.split('.')[0] in ('pipeline', 'stages', {HOOK_MODULE!r})])"
    assert _python(code, tmp_path) == "[]"
    code = "import sys; print([type(f).__name__ for f in sys.meta_path].count('_TorchvisionHook'))"
    assert _python(code, tmp_path) == "1"


def test_another_checkout_imports_its_own_library(tmp_path):
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "__init__.py").write_text("WHERE = 'the other checkout'\n")
    assert _python("import pipeline; print(pipeline.WHERE)", tmp_path) == "the other checkout"


def test_torchvision_imports_on_this_torch(tmp_path):
    assert _python("import torchvision.ops, timm; print('ok')", tmp_path) == "ok"
