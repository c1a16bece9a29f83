"""The work folder of `fscil study` / `fscil select` (stored runs, base models, scratch): one process at a time, and
stored runs tied to the code that made them."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.atomic import atomic_write_text, claim_folder, mark_folder
from pipeline.code_version import code_digest
from pipeline.errors import FSCILError, TrainingDiverged

LOCK_FILE = ".lock"


@contextmanager
def locked(folder: Path, command: str) -> Iterator[Path]:
    """Create `folder` as `command`'s work folder (a folder of the user's is refused: `claim_folder`) and hold an
    exclusive lock on it: a second process on the same folder stops at once with one line (it never touches the
    first one's scratch files). The lock goes with the process, also when it is killed."""
    folder = mark_folder(claim_folder(folder, f"{command} (work)"), f"{command} (work)")
    handle = open(folder / LOCK_FILE, "a+")  # noqa: SIM115 - held for the whole block
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise FSCILError(f"{folder}: in use by another fscil study or select (pid {holder}); wait for it to end or "
                         "choose another --out") from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield folder
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def check_code(record: dict, code: str, where: Path, reuse_stale: bool) -> None:
    """A stored run made by other code (its "code" digest differs, or it has none) is refused, unless the user asks
    to reuse such runs (`--reuse-stale`)."""
    made_by = record.get("code")
    if made_by != code and not reuse_stale:
        raise FSCILError(f"{where}: holds runs made by other code (code {str(made_by)[:12]}, now {code[:12]}); pass "
                         "--reuse-stale to reuse them anyway, or choose another --out")


def run_once(records: dict, key: str, records_path: Path, scratch: Path, run: Callable[[Path], dict],
             diverged: dict | None = None, reuse_stale: bool = False) -> bool:
    """records[key] from an earlier run when it holds one under the current divergence rules (one made by other code
    is refused unless `reuse_stale`: `workdir.check_code`); else run(scratch) now, store its record (a
    TrainingDiverged as err.record() over `diverged`: a run that diverges is a result, not the end of the selection
    or study) with its seconds and the code digest, and write records to records_path at once. Returns whether the
    record was stored before. `fscil select` and `fscil study` both keep their runs this way, in a locked folder."""
    code = code_digest()
    if key in records and not TrainingDiverged.stale(records[key]):
        check_code(records[key], code, records_path.parent, reuse_stale)
        return True
    started = time.time()
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        record = run(scratch)
    except TrainingDiverged as err:
        record = {**(diverged or {}), **err.record()}
    shutil.rmtree(scratch, ignore_errors=True)
    records[key] = {**record, "seconds": round(time.time() - started, 2), "code": code}
    atomic_write_text(records_path, json.dumps(records, indent=2) + "\n")
    return False
