"""The same install on any day: requirements.lock (made by `make lock`) pins every package under pyproject.toml's
direct pins, `make install` installs from it, and this environment is what it names."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)")


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def _pins(lines) -> dict[str, str]:
    return {_name(m.group(1)): m.group(2) for m in map(PIN.match, lines) if m}


def test_the_lock_holds_every_direct_pin_and_the_cpu_torch():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    direct = _pins([*project["dependencies"], *(d for extra in ("dev", "kernels")
                                                for d in project["optional-dependencies"][extra])])
    lock = _pins((REPO / "requirements.lock").read_text().splitlines())
    assert len(direct) >= 15 and len(lock) > 100  # the whole tree, not only the direct pins
    assert {k: lock.get(k) for k in direct if k != "torch"} == {k: v for k, v in direct.items() if k != "torch"}
    assert lock["torch"] == f"{direct['torch']}+cpu"  # the local CPU build, as installed today
    constraints = _pins((REPO / "constraints.txt").read_text().splitlines())
    assert all(lock[k].split("+")[0] == v for k, v in constraints.items())
    assert "mamba-ssm" not in lock  # GPU machines only (built against their torch)


def test_this_environment_is_installed_from_the_lock():
    """Every installed package the lock names is at the lock's version (`make install` installs with `-c` the lock):
    a package resolved anew on another day would differ here."""
    lock = _pins((REPO / "requirements.lock").read_text().splitlines())
    installed = {_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    differ = {k: (v, lock[k]) for k, v in installed.items() if k in lock and v != lock[k]}
    assert not differ, f"installed (version, lock's version): {differ}; run `make install`"
    assert {"torch", "dvc", "hydra-core", "ruamel-yaml", "zarr"} <= installed.keys() & lock.keys()
    makefile = (REPO / "Makefile").read_text()
    assert "LOCK := requirements.lock" in makefile and "-c constraints.txt -e" not in makefile
