"""Atomic outputs: a stage writes into a temporary sibling and moves it into place only on success.

A killed or failed stage therefore leaves either the previous complete output or nothing at the
final path, never a half-written file a later stage would pick up. Temporaries are named
`.<name>.tmp-<pid>` next to the target (same filesystem, so the final rename is atomic) and are
swept by the next run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from pipeline.errors import FSCILError

_TMP_TAG = ".tmp-"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def sweep_temporaries(target: Path) -> None:
    """Remove temporaries that an interrupted earlier write of `target` left behind."""
    for stale in target.parent.glob(f".{target.name}{_TMP_TAG}*"):
        _remove(stale)


@contextlib.contextmanager
def atomic_output(target: str | os.PathLike, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write `target` into; it replaces `target` only if the block succeeds.

    directory: create the temporary as an (empty) directory, for outputs that are folders.
    """
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file where a folder is needed, no permission, ...
        raise FSCILError(f"{target}: cannot create its folder {target.parent} ({err.strerror or err})") from None
    sweep_temporaries(target)
    tmp = target.parent / f".{target.name}{_TMP_TAG}{os.getpid()}"
    if directory:
        tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    if target.exists() and (target.is_dir() != tmp.is_dir()):
        _remove(target)
    if tmp.is_dir() and target.is_dir():
        # os.replace cannot overwrite a non-empty directory: swap through a second temporary.
        old = target.parent / f".{target.name}{_TMP_TAG}old-{os.getpid()}"
        os.replace(target, old)
        os.replace(tmp, target)
        _remove(old)
    else:
        os.replace(tmp, target)


def atomic_write_text(target: str | os.PathLike, text: str) -> None:
    with atomic_output(target) as tmp:
        tmp.write_text(text)
