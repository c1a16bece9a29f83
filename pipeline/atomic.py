"""Outputs: written into a temporary sibling and moved into place only on success, and never over what the user owns.

A killed or failed stage therefore leaves either the previous complete output or nothing at the
final path, never a half-written file a later stage would pick up. Temporaries are named
`.<name>.tmp-<pid>` next to the target (same filesystem, so the final rename is atomic) and are
swept by the next run.

A path the user names (`fscil export FILE`, `--out`) is checked before any work (`claim_file`, `claim_folder`): it is
replaced only when it holds what that command writes (a model file by a model file, a folder the command marked as
its own with OWNER_FILE); a folder of the user's, the working folder, its parents and a repository root never are.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from pipeline.errors import FSCILError

_TMP_TAG = ".tmp-"
OWNER_FILE = ".fscil-output"  # in a folder a command wrote: the command's name


def _refuse_protected(path: Path, command: str) -> None:
    """The working folder, a folder above it, the home folder and a repository's root are never an output."""
    resolved, here = path.resolve(), Path.cwd().resolve()
    what = ("the working folder" if resolved == here else "a folder above the working one" if resolved in here.parents
            else "the home folder" if resolved == Path.home().resolve() else None)
    if what:
        raise FSCILError(f"{path}: is {what}; `{command}` never writes over it (name a new file or folder)")
    if resolved.is_dir() and ((resolved / ".git").exists() or (resolved / "dvc.yaml").is_file()):
        raise FSCILError(f"{path}: is a repository's root; `{command}` never writes over it (name a new file or "
                         "folder)")


def claim_file(target: str | os.PathLike, command: str, what: str, is_ours: Callable[[Path], bool],
               example: str = "NAME") -> Path:
    """Check, before any work, that `command` may write its file (`what`, e.g. "a model file") at `target`: a new
    path, or an existing file that `is_ours` recognises as one `command` wrote. A folder or another file is refused."""
    target = Path(target)
    _refuse_protected(target, command)
    if target.is_dir():
        raise FSCILError(f"{target}: is a folder; `{command}` writes {what} (name a file, e.g. {target / example})")
    if (target.exists() or target.is_symlink()) and not is_ours(target):
        raise FSCILError(f"{target}: exists and is not {what} written by `{command}`; nothing was replaced (remove it "
                         "or name another file)")
    return target


def claim_folder(folder: str | os.PathLike, command: str) -> Path:
    """Check, before any work, that `command` may write its output folder at `folder`: a new or empty folder, or one
    whose OWNER_FILE names `command` (what `mark_folder` leaves). Anything else is refused, nothing touched."""
    folder = Path(folder)
    _refuse_protected(folder, command)
    if folder.exists() and not folder.is_dir():
        raise FSCILError(f"{folder}: is a file; `{command}` writes a folder there (name a new folder)")
    if folder.is_dir() and any(folder.iterdir()) and owner(folder) != command:
        raise FSCILError(f"{folder}: a folder that `{command}` did not write (no {OWNER_FILE} naming it); nothing was "
                         "touched (name a new or empty folder)")
    return folder


def owner(folder: Path) -> str | None:
    path = Path(folder) / OWNER_FILE
    return path.read_text().strip() if path.is_file() else None


def mark_folder(folder: str | os.PathLike, command: str) -> Path:
    """Create `folder` (with its parents) as `command`'s own: a later run of `command` may replace or reuse it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if owner(folder) != command:
        (folder / OWNER_FILE).write_text(command + "\n")
    return folder


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
def atomic_output(target: str | os.PathLike, *, directory: bool = False, owner: str | None = None) -> Iterator[Path]:
    """Yield a temporary path to write `target` into; it replaces `target` only if the block succeeds.

    directory: create the temporary as an (empty) directory, for outputs that are folders; owner: the command whose
    folder it is (marked with OWNER_FILE; check the target with `claim_folder` first).
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
        if owner:
            mark_folder(tmp, owner)
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
        if tmp.is_file():  # the user's umask, not the 0600 some writers give their files
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)


def atomic_write_text(target: str | os.PathLike, text: str) -> None:
    with atomic_output(target) as tmp:
        tmp.write_text(text)
