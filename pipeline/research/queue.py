"""A grid of runs through DVC's experiment queue (`fscil study`): each (variant, seed) is one `dvc exp run --queue`
experiment named `<name>-<variant>-s<seed>`, run by `dvc queue start -j J` workers, so every run lands in `dvc exp
show`, `dvc plots diff` and the VS Code extension like any other experiment, and `fscil compare` groups them over
seeds. A name already finished is not queued again (an interrupted or extended study reruns nothing), and DVC's run
cache restores the stages two runs share (the base model of variants that differ only in their sessions).

DVC's queue workers call `dvc` by name: the environment's bin goes on their PATH (`queue_env`), as `make queue` does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.errors import FSCILError

DONE, FAILED = "Success", "Failed"


def queue_env(jobs: int) -> dict[str, str]:
    """The environment of `dvc` and its queue workers: this Python's bin first on PATH (workers spawn `dvc` by name),
    OpenMP threads waiting passively when several runs share the cores (the numbers do not change)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if jobs > 1:
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def run_dvc(args: list[str], env: dict[str, str] | None = None) -> str:
    """`dvc <args>`'s output, with the dvc of this environment (activated or not: `queue_env`); a failure is a one-line
    error ending with DVC's last line."""
    try:
        done = subprocess.run(["dvc", *args], capture_output=True, text=True, env=env or queue_env(1), check=False)
    except FileNotFoundError:
        raise FSCILError("dvc is not installed in this environment (make install)") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
        raise FSCILError(f"dvc {' '.join(args[:2])} failed: {last}")
    return done.stdout


def experiment_name(prefix: str, variant: str, seed: int) -> str:
    return f"{prefix}-{variant}-s{seed}"


def grid(prefix: str, variants: list[str], seeds: list[int], overrides: tuple[str, ...] = ()
         ) -> list[tuple[str, list[str]]]:
    """[(experiment name, its `-S` settings)] of every (variant, seed), variants outermost."""
    return [(experiment_name(prefix, v, s), [f"variant={v}", f"seed={s}", *overrides]) for v in variants
            for s in seeds]


def queue_status(env: dict[str, str]) -> dict[str, str]:
    """{experiment name: Queued / Running / Success / Failed} from `dvc queue status`."""
    states = {}
    for line in run_dvc(["queue", "status"], env).splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 4 and parts[-1] in ("Queued", "Running", DONE, FAILED):
            states[parts[1]] = parts[-1]
    return states


def run_grid(runs: list[tuple[str, list[str]]], jobs: int, finished: set[str],
             log: Callable[[str], None] = print, poll: float = 5.0) -> list[str]:
    """Queue the runs not in `finished`, run the queue with `jobs` workers and wait for them; returns the names of the
    runs that failed (their logs: `dvc queue logs NAME`)."""
    env = queue_env(jobs)
    todo = [(name, sets) for name, sets in runs if name not in finished]
    if len(todo) < len(runs):
        log(f"study: {len(runs) - len(todo)} of {len(runs)} runs already finished, not queued again")
    for name, sets in todo:
        run_dvc(["exp", "run", "--queue", "-n", name, *(a for s in sets for a in ("-S", s))], env)
    if not todo:
        return []
    log(f"study: {len(todo)} runs queued; dvc queue start -j {jobs} (dvc queue status / logs NAME to follow)")
    run_dvc(["queue", "start", "-j", str(jobs)], env)
    names, last = {name for name, _ in todo}, None
    while True:
        states = {n: s for n, s in queue_status(env).items() if n in names}
        done = {n for n, s in states.items() if s in (DONE, FAILED)}
        line = f"study: {len(done)} of {len(names)} done"
        if line != last:
            log(line)
            last = line
        if names <= done:
            return sorted(n for n in names if states[n] == FAILED)
        time.sleep(poll)
