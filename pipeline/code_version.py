"""Which code made a result: the package version and a digest of the code that trains and applies models."""

from __future__ import annotations

import functools
import hashlib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent


@functools.cache
def code_digest(root: Path = ROOT) -> str:
    """sha256 over every .py file under pipeline/ (paths and contents, sorted): changes with any code change. Read
    once per process (every stored run of a study or selection asks for it)."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def code_version() -> str:
    """`<package version>+<first 12 hex of code_digest()>`."""
    try:
        version = metadata.version("mamba-fscil")
    except metadata.PackageNotFoundError:
        version = "0+unknown"
    return f"{version}+{code_digest()[:12]}"
