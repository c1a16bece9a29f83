"""File checksums: hashing source and split files for provenance, and verifying expected digests.

An expected digest is hex md5 (32 characters) or sha256 (64 characters); its length picks the algorithm.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pipeline.errors import FSCILError
from pipeline.file_digest import file_digest

_ALGO_BY_LENGTH = {32: "md5", 64: "sha256"}


def digest_algorithm(expected: str) -> str:
    """md5 or sha256 from the length of a hex digest; FSCILError for anything else."""
    algo = _ALGO_BY_LENGTH.get(len(expected))
    if algo is None or any(c not in "0123456789abcdef" for c in expected.lower()):
        raise FSCILError(f"checksum {expected!r} is neither a hex md5 (32) nor a hex sha256 (64)")
    return algo


def verify_checksums(root: Path, expected: Mapping[str, str]) -> dict[str, str]:
    """Check every `relative_path -> digest` under `root`; return {relative_path: "algo:digest"} for provenance."""
    verified = {}
    for rel, want in sorted(expected.items()):
        algo = digest_algorithm(want)
        path = root / rel
        got = file_digest(path, algo)
        if got != want.lower():
            raise mismatch(path, algo, got, want)
        verified[rel] = f"{algo}:{got}"
    return verified


def digest_files(root: Path, relative_paths: list[str], algo: str = "sha256") -> dict[str, str]:
    """{relative_path: "algo:digest"} of the given files, for the pack's provenance."""
    return {rel: f"{algo}:{file_digest(root / rel, algo)}" for rel in relative_paths}


def mismatch(path: Path, algo: str, got: str, want: str) -> FSCILError:
    """The one-line error of a file whose digest is not the expected one, with the key that skips the check."""
    return FSCILError(f"checksum mismatch for {path}: {algo} {got}, expected {want.lower()} (not the official file; "
                      "a copy you re-packed yourself: set data.verify_checksums: false to read it unchecked)")
