"""What stages/run runs: a stage in a process forked from a server that has already imported torch and the other
libraries the stages load, so that each of the pipeline's stages does not pay their imports (about 2.3 s of a
session stage's 10 s; docs/research/where-the-time-goes.md).

    python -m stages.launch <stage> [options]      # does what `python -m stages.<stage> [options]` does

The server (`python -m stages.launch --serve KEY`, listening at `socket_path(KEY)`), started by the first stage that
finds none and gone after IDLE_SECONDS without one, pins the CPU kernels as every stage does (importing the `stages`
package) and imports PRELOAD: other projects' libraries only, never a module of ours. For each stage it forks a process
that becomes `python -m stages.<stage>` in everything a stage can see: the caller's working directory (first on
sys.path, as for `python -m`), its environment with the kernel pin applied, its arguments, its standard streams (the
descriptors themselves: a terminal stays a terminal), our modules imported afresh from that directory (an edit between
two stages is seen), fresh seeds for `random` and NumPy's global generator; its exit status and signals pass through the
caller.

A server serves only callers with its Python, its own code (this file and what importing `stages` runs) and the same
environment but for the names in VOLATILE, the variables that differ between the commands of one run and that no
library reads at import (`server_key`); other callers start their own. FSCIL_FORK_SERVER=off, or any failure to
reach a server, runs `python -m stages.<stage>` itself. Linux only (elsewhere: always the direct run).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import re
import signal
import socket
import stat
import sys
import tempfile
import time
from pathlib import Path

OPT_OUT = "FSCIL_FORK_SERVER"  # =off: every stage in a new process (`python -m stages.<stage>`)
IDLE_SECONDS = 60  # the server exits after this long without a stage
START_SECONDS = 120  # how long a caller waits for the server it started before running the stage itself
PRELOAD = ("torch", "numpy", "yaml", "ruamel.yaml", "tqdm", "h5py", "pandas", "zarr", "PIL.Image")
# the server's own code: what `python -m stages.launch --serve` imports of ours (digested into its key)
SERVER_CODE = ("stages/__init__.py", "stages/launch.py", "pipeline/__init__.py", "pipeline/portable.py",
               "pipeline/malloc.py")
VOLATILE = ("PWD", "OLDPWD", "SHLVL", "_")  # and every name starting with VOLATILE_PREFIXES
VOLATILE_PREFIXES = ("PYTEST_", "DVC_")
OURS = ("stages", "pipeline")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)  # from the caller to the stage
ROOT = Path(__file__).resolve().parents[1]
_LENGTH = 8  # bytes of a message's length prefix


# --- the caller --------------------------------------------------------------------------------------------------

def server_key(environ: dict[str, str] | None = None, root: Path = ROOT) -> str:
    """What a server must share with a caller to serve it: the Python, the server's code, the environment but for
    VOLATILE."""
    environ = dict(os.environ if environ is None else environ)
    digest = hashlib.sha256()
    for part in (sys.executable, sys.version):
        digest.update(part.encode() + b"\0")
    for name in SERVER_CODE:
        digest.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    stable = {k: v for k, v in environ.items() if k not in VOLATILE and not k.startswith(VOLATILE_PREFIXES)}
    digest.update(json.dumps(stable, sort_keys=True).encode())
    return digest.hexdigest()[:24]


def socket_path(key: str) -> Path | None:
    """The server's socket: in a folder of this user's alone under the temporary directory; None when that folder
    is not ours (another user's, or open to others). Nothing else is ever written or removed: the lock, the log and
    the socket are `<key>.*` in that folder."""
    if not re.fullmatch(r"[0-9a-f]{24}", key):
        raise ValueError(f"not a server key: {key!r}")
    folder = Path(tempfile.gettempdir()) / f"fscil-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    info = folder.lstat()
    if not folder.is_dir() or folder.is_symlink() or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return folder / f"{key}.sock"


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


def _server(key: str, path: Path) -> socket.socket | None:
    """A connection to the server `key` listening at `path`, started here (under a lock, so that callers at once
    start one) when none answers."""
    if sock := _connect(path):
        return sock
    import fcntl
    import subprocess

    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if sock := _connect(path):
            return sock
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()  # a server that died left its socket behind
        with open(path.with_suffix(".log"), "w") as log:  # the server's own errors, if any
            server = subprocess.Popen([sys.executable, "-m", "stages.launch", "--serve", key], cwd=ROOT,
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline and server.poll() is None:
            if sock := _connect(path):
                return sock
            time.sleep(0.02)
    return None


def _send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    data = len(data).to_bytes(_LENGTH, "big") + data
    sent = socket.send_fds(sock, [data[:4096]], list(fds)) if fds else sock.send(data[:4096])
    sock.sendall(data[sent:])


def _receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One message (None when the other end closed first) and the descriptors that came with it; reads no byte of
    the next message."""
    data, fds = b"", []
    if max_fds:  # the caller's request, the one message it sends
        data, fds, _, _ = socket.recv_fds(sock, 4096, max_fds)
    data = _read(sock, _LENGTH, data)
    data = data and _read(sock, _LENGTH + int.from_bytes(data[:_LENGTH], "big"), data)
    return (json.loads(data[_LENGTH:]) if data else None), fds


def _read(sock: socket.socket, size: int, data: bytes) -> bytes | None:
    """`data` read on to `size` bytes; None when the other end closed first."""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def run_direct(stage: str, args: list[str]) -> None:
    """`python -m stages.<stage> args`, replacing this process."""
    os.execv(sys.executable, [sys.executable, "-m", f"stages.{stage}", *args])


def launch(stage: str, args: list[str]) -> int:
    """Run `stage` in a process forked from the server; returns its exit code (a stage killed by a signal: this
    process is killed by the same signal)."""
    sock = None
    if sys.platform.startswith("linux") and os.environ.get(OPT_OUT, "on") != "off":
        with contextlib.suppress(OSError):  # no server to be had here: the direct run
            key = server_key()
            sock = (path := socket_path(key)) and _server(key, path)
    if not sock:
        run_direct(stage, args)
    stage_pid: list[int] = []
    pending: list[int] = []

    def forward(signum, _frame):  # to the stage's process group, once it has one
        for pid in stage_pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signum)
        if not stage_pid:
            pending.append(signum)

    # a signal this process ignores (a background job's SIGINT, nohup's SIGHUP) the stage ignores too; the others
    # reach it
    ignored = [int(signum) for signum in FORWARDED if signal.getsignal(signum) == signal.SIG_IGN]
    for signum in FORWARDED:
        if signum not in ignored:
            signal.signal(signum, forward)
    request = {"stage": stage, "args": args, "cwd": os.getcwd(), "env": dict(os.environ), "ignored": ignored}
    with sock:
        try:
            _send(sock, request, [0, 1, 2])
            started, _ = _receive(sock)
        except OSError:
            started = None
        if started is None:  # the server ended before it forked the stage: nothing ran yet
            run_direct(stage, args)
        stage_pid.append(started["pid"])
        for signum in pending:
            forward(signum, None)
        ended, _ = _receive(sock)
    if ended is None:
        print(f"error: the fork server ended before stage {stage} (process {stage_pid[0]}) did; its exit status "
              "is lost", file=sys.stderr)
        return 1
    code = os.waitstatus_to_exitcode(ended["status"])
    if code < 0:  # killed by a signal: end the same way
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


# --- the server --------------------------------------------------------------------------------------------------

def serve(key: str) -> None:
    """Import PRELOAD, listen at `socket_path(key)` (made visible once ready), fork a handler per caller; exit after
    IDLE_SECONDS without one, or when that path is no longer this server's socket."""
    path = socket_path(key)
    if path is None:
        sys.exit(f"error: {Path(tempfile.gettempdir()) / f'fscil-{os.getuid()}'} is not this user's alone")
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ready = path.with_name(f"{path.name}.{os.getpid()}")
    listener.bind(str(ready))
    listener.listen(16)
    os.replace(ready, path)
    inode = path.stat().st_ino
    listener.settimeout(5)
    last = time.monotonic()
    while time.monotonic() - last < IDLE_SECONDS:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            try:
                if path.stat().st_ino != inode:
                    return
            except FileNotFoundError:
                return
            continue
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _handle(conn)
            finally:
                os._exit(0)
        conn.close()
        last = time.monotonic()
    with contextlib.suppress(FileNotFoundError):
        if path.stat().st_ino == inode:
            path.unlink()


def _handle(conn: socket.socket) -> None:
    """One caller: fork its stage, tell it the stage's pid, wait, tell it the wait status."""
    request, fds = _receive(conn, max_fds=3)
    if request is None or len(fds) != 3:
        return
    pid = os.fork()
    if pid == 0:
        conn.close()
        code = 1
        try:
            code = _stage_process(request, fds)
        finally:
            os._exit(code)
    with contextlib.suppress(OSError):  # here too, so that the group exists before the caller may signal it
        os.setpgid(pid, pid)
    for fd in fds:
        os.close(fd)
    _send(conn, {"pid": pid})
    _send(conn, {"status": _wait(pid, conn)})


def _wait(pid: int, conn: socket.socket) -> int:
    """The stage's wait status; if the caller goes first (killed: it cannot forward SIGKILL), the stage's group is
    killed, as the stage itself would have been, run directly."""
    import select

    try:
        ready = [os.pidfd_open(pid)]  # readable when the stage ends
    except (AttributeError, OSError):
        ready = []  # no pidfd here: look every 0.1 s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        readable, _, _ = select.select([conn, *ready], [], [], None if ready else 0.1)
        if conn in readable and not conn.recv(1, socket.MSG_PEEK):  # the caller sends nothing more: it is gone
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            return os.waitpid(pid, 0)[1]


def _stage_process(request: dict, fds: list[int]) -> int:
    """In the forked process: become `python -m stages.<stage>` as the caller would have started it; run it;
    exit as the interpreter does (threads joined, atexit functions, streams flushed)."""
    import atexit
    import linecache
    import random
    import runpy
    import threading

    os.setpgid(0, 0)  # the caller forwards its signals to this group (the stage and what it starts)
    for signum in FORWARDED:  # as the interpreter sets them up, from the caller's (not the server's) dispositions
        default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        signal.signal(signum, signal.SIG_IGN if signum in request["ignored"] else default)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for target, name in enumerate(("stdin", "stdout", "stderr")):  # as the interpreter makes them at start-up
        old = getattr(sys, name)  # the server's: same encoding, errors and PYTHONUNBUFFERED, but not the same files
        stream = open(target, "r" if target == 0 else "w", closefd=False, encoding=old.encoding, errors=old.errors,
                      buffering=1 if target == 2 or (target == 1 and os.isatty(1)) else -1)
        if target and old.write_through:
            stream.reconfigure(write_through=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    os.chdir(request["cwd"])
    os.environ.clear()  # the caller's, pinned when it imported `stages` (here torch is loaded: the import would not)
    os.environ.update(request["env"])
    for name in [m for m in sys.modules if m.split(".")[0] in OURS]:
        del sys.modules[name]
    sys.path[0] = os.getcwd()
    importlib.invalidate_caches()
    linecache.clearcache()
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    sys.argv = [sys.argv[0], *request["args"]]
    interrupted = False
    try:
        runpy.run_module(f"stages.{request['stage']}", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as done:
        code = _exit_code(done.code)
    except KeyboardInterrupt:  # the interpreter prints it, then ends killed by SIGINT
        sys.excepthook(*sys.exc_info())
        code, interrupted = 1, True
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # noqa: SLF001 - what the interpreter runs at exit: wait for the threads it would wait for
    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _exit_code(value) -> int:
    """The exit status `sys.exit(value)` gives."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def main(argv: list[str]) -> None:
    if argv[:1] == ["--serve"] and len(argv) == 2:
        try:
            serve(argv[1])
        except ValueError as err:  # a key is 24 hex digits, never a path: nothing is written
            sys.exit(f"error: {err}")
        return
    if not argv or argv[0].startswith("-"):
        sys.exit("usage: python -m stages.launch <stage> [options]  (what stages/run runs)")
    sys.exit(launch(argv[0], argv[1:]))


if __name__ == "__main__":
    main(sys.argv[1:])
