"""stages/launch.py, how stages/run runs a stage: forked from a server that has imported torch already. The oracle is
the direct run, `python -m stages.<stage>` (FSCIL_FORK_SERVER=off): a probe stage reports what it sees (working
directory, arguments, sys.path, environment, the kernel pin, streams, exit status, signals) and the forked run must
report the same, from a process that did not import torch itself; an edit between two stages is seen; the server is
shared only by callers whose environment matches it; a dead server's socket is replaced."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from stages.launch import SERVER_CODE

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux-only")

PROBE = '''"""A stage that says what it sees."""
import json, os, random, sys, time

import stages  # what every stage module imports first (the kernel pin)

VERSION = 1
preloaded = "torch" in sys.modules  # only a process forked from the server has torch before it imports it
import numpy  # noqa: E402
import torch  # noqa: E402

args = sys.argv[1:]
server = int(open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()[1])
seen = {"pid": os.getpid(), "version": VERSION, "preloaded": preloaded, "server": server, "name": __name__,
        "argv": args, "cwd": os.getcwd(), "path0": sys.path[0], "stages": stages.__file__, "tty": sys.stdout.isatty(),
        "env": {k: os.environ.get(k) for k in ("PROBE", "ATEN_CPU_CAPABILITY", "MKL_CBWR")},
        "capability": torch.backends.cpu.get_cpu_capability(), "draws": [random.random(), numpy.random.random()]}
print(json.dumps(seen), flush=True)
print("a line on stderr", file=sys.stderr)
if "--sleep" in args:
    time.sleep(120)
if "--fail" in args:
    sys.exit(3)
if "--raise" in args:
    raise ValueError("boom")
'''


@pytest.fixture
def project(tmp_path):
    """A project holding the launcher, the server's code and the probe stage; its own short temporary folder (the
    servers' sockets), whose servers are stopped at the end."""
    for name in {*SERVER_CODE, "stages/run"}:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "stages" / "probe.py").write_text(PROBE)
    sockets = Path(tempfile.mkdtemp(prefix="fl", dir="/tmp"))
    yield tmp_path, sockets
    for pid in _servers(sockets):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(sockets, ignore_errors=True)


def _servers(sockets: Path) -> list[int]:
    """The servers whose socket is under `sockets` (their TMPDIR)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--serve" in cmdline and f"TMPDIR={sockets}".encode() in environ:
            found.append(int(proc.name))
    return found


def _env(sockets: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(sockets), "PROBE": "x", "ATEN_CPU_CAPABILITY": "default", **extra}


def _probe(project, *args: str, fork: bool = True, **extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    root, sockets = project
    env = _env(sockets, **extra, **({} if fork else {"FSCIL_FORK_SERVER": "off"}))
    done = subprocess.run([sys.executable, "-m", "stages.launch", "probe", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    return done, (json.loads(done.stdout.splitlines()[0]) if done.stdout else None)


def test_a_forked_stage_sees_what_a_new_process_sees(project):
    direct, seen = _probe(project, "a", "--b", fork=False)
    forked, forked_seen = _probe(project, "a", "--b")
    assert direct.returncode == forked.returncode == 0, forked.stderr
    assert direct.stderr == forked.stderr == "a line on stderr\n"
    assert not seen.pop("preloaded") and forked_seen.pop("preloaded")
    for key in ("server", "pid", "draws"):
        assert seen.pop(key) != forked_seen.pop(key), key
    assert forked_seen == seen
    assert seen["name"] == "__main__" and seen["argv"] == ["a", "--b"] and seen["path0"] == str(project[0])
    # the kernel pin replaced the caller's ATEN_CPU_CAPABILITY in both, and torch runs the pinned kernels
    assert seen["env"] == {"PROBE": "x", "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE,STRICT"}
    assert seen["capability"] == "AVX2"


def test_exit_status_and_errors_pass_through(project):
    for args in (["--fail"], ["--raise"]):
        direct, _ = _probe(project, *args, fork=False)
        forked, _ = _probe(project, *args)
        assert forked.returncode == direct.returncode == (3 if args == ["--fail"] else 1)
        assert forked.stderr.splitlines()[-1] == direct.stderr.splitlines()[-1]
    assert direct.stderr.splitlines()[-1] == "ValueError: boom"


def test_signals_reach_the_stage_as_they_reach_a_new_process(project):
    """A caller that ignores SIGINT (a background job's) runs a stage that ignores it, and its server (this test's
    first forked call starts one) ignores it too; a later caller with SIGINT at its default on that server: its stage
    ends by SIGINT, as a new process does. SIGTERM ends both."""
    for ignore_int, signum in ((True, signal.SIGINT), (False, signal.SIGINT), (False, signal.SIGTERM)):
        codes = [_signalled(project, signum, fork, ignore_int) for fork in (True, False)]
        expected = [-signal.SIGTERM] * 2 if ignore_int else [-signum] * 2  # ignored: ended by the SIGTERM after it
        assert codes == expected, (ignore_int, signum, codes)


def _signalled(project, signum: int, fork: bool, ignore_int: bool) -> int:
    """The caller's exit status after `signum` reached it while its stage ran (SIGTERM after 1 s if it still runs);
    the stage has ended and been reaped by then."""
    root, sockets = project
    env = _env(sockets, **({} if fork else {"FSCIL_FORK_SERVER": "off"}))

    def disposition():  # the caller's SIGINT as asked, whatever this test process has (xdist's workers ignore it)
        signal.signal(signal.SIGINT, signal.SIG_IGN if ignore_int else signal.SIG_DFL)

    proc = subprocess.Popen([sys.executable, "-m", "stages.launch", "probe", "--sleep"], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=disposition)
    stage = json.loads(proc.stdout.readline())["pid"]  # the stage is running
    proc.send_signal(signum)
    try:
        proc.wait(timeout=1 if ignore_int else 30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert not Path(f"/proc/{stage}").exists()  # ended (and reaped) before the caller returned
    return proc.returncode


def test_a_killed_caller_takes_its_stage_with_it(project):
    """SIGKILL cannot be forwarded: the server kills the stage when its caller is gone, as a direct run would be."""
    root, sockets = project
    proc = subprocess.Popen([sys.executable, "-m", "stages.launch", "probe", "--sleep"], cwd=root, env=_env(sockets),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stage = json.loads(proc.stdout.readline())
    assert stage["preloaded"]
    proc.kill()
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{stage['pid']}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{stage['pid']}").exists()


def test_an_edit_between_two_stages_is_seen_by_the_same_server(project):
    _, first = _probe(project)
    probe = project[0] / "stages" / "probe.py"
    probe.write_text(probe.read_text().replace("VERSION = 1", "VERSION = 2"))
    _, second = _probe(project)
    assert (first["version"], second["version"]) == (1, 2)
    assert first["server"] == second["server"] and first["preloaded"] and second["preloaded"]
    # unseeded draws differ between two stages, as between two new processes (not the server's state twice)
    assert all(a != b for a, b in zip(first["draws"], second["draws"], strict=True))


def test_a_copy_of_the_project_runs_its_own_code_on_the_same_server(project, tmp_path_factory):
    """Queued experiments run in copies of the project (.dvc/tmp/exps/...): one server (same code, same environment)
    serves them all, each stage with its own copy's modules and working directory."""
    copy = tmp_path_factory.mktemp("copy")
    shutil.copytree(project[0] / "stages", copy / "stages")
    shutil.copytree(project[0] / "pipeline", copy / "pipeline")
    probe = copy / "stages" / "probe.py"
    probe.write_text(probe.read_text().replace("VERSION = 1", "VERSION = 2"))
    _, first = _probe(project)
    _, second = _probe((copy, project[1]))
    assert first["server"] == second["server"] and (first["version"], second["version"]) == (1, 2)
    assert (second["cwd"], second["path0"], second["stages"]) == (str(copy), str(copy),
                                                                  str(copy / "stages" / "__init__.py"))


def test_servers_are_shared_by_matching_environments_only(project):
    _, plain = _probe(project)
    _, volatile = _probe(project, PYTEST_CURRENT_TEST="another", DVC_EXP_NAME="e1", OLDPWD="/")
    _, threads = _probe(project, OMP_NUM_THREADS="1")
    _, native = _probe(project, FSCIL_CPU_KERNELS="native")
    assert plain["server"] == volatile["server"]
    assert len({plain["server"], threads["server"], native["server"]}) == 3
    assert native["env"]["ATEN_CPU_CAPABILITY"] == "default"  # not pinned: the caller's own value, as direct
    assert len(_servers(project[1])) == 3


def test_a_dead_servers_socket_is_replaced(project):
    _, first = _probe(project)
    os.kill(first["server"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{first['server']}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(project[1].rglob("*.sock"))  # left behind
    done, second = _probe(project)
    assert done.returncode == 0 and second["preloaded"] and second["server"] != first["server"]


def test_the_server_takes_a_key_not_a_path(project, tmp_path_factory):
    """`--serve` names a key, never a file: a path a user names there is refused and left as it was."""
    mine = tmp_path_factory.mktemp("user") / "notes.txt"
    mine.write_text("keep me")
    root, sockets = project
    done = subprocess.run([sys.executable, "-m", "stages.launch", "--serve", str(mine)], cwd=root,
                          env=_env(sockets), capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "not a server key" in done.stderr
    assert mine.read_text() == "keep me" and not _servers(sockets)


def test_the_launcher_runs_the_stage_directly_when_told(project):
    done, seen = _probe(project, fork=False)
    assert done.returncode == 0 and not seen["preloaded"] and not _servers(project[1])
