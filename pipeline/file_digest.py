"""The one file hasher: data provenance, pretrained-weight checks and checkpoint identities all use it."""

from __future__ import annotations

import hashlib
import os

from pipeline.errors import FSCILError


def file_digest(path: str | os.PathLike[str], algo: str = "sha256") -> str:
    """Hex digest of a file, read in 1 MiB blocks; a missing or unreadable file is an FSCILError."""
    h = hashlib.new(algo)
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except FileNotFoundError:
        raise FSCILError(f"missing file {path}") from None
    except OSError as err:
        raise FSCILError(f"unreadable file {path}: {err.strerror}") from None
    return h.hexdigest()
