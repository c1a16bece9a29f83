"""What every stage's entry shares. dvc.yaml runs `stages/run <name>` (`python -m stages.<name>`), which imports that
stage's code and nothing else (no other command, no help text): DVC's dependencies of a stage are its import closure
(`python -m stages.dvc_deps`). `fscil stage <name>` calls the same `command`.

Both run with the CPU kernels pinned (importing the `stages` package does it, before torch loads), read params.yaml
and `-S` overrides, and end with one line on error: exit 2 for bad input, 130 when interrupted, 1 for an unexpected
error (its traceback in a file). Torch-free.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeline.errors import FSCILError

DEBUG = {"on": False}  # `fscil --debug`: unexpected errors raise with their traceback


def fail(message: str, code: int = FSCILError.exit_code) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def first_line(err: BaseException, empty: str | None = None) -> str:
    """An error's first line (its type's name, or `empty`, when it has no text)."""
    return str(err).splitlines()[0] if str(err) else (type(err).__name__ if empty is None else empty)


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Bad input: one line, exit 2; an unexpected error: one line naming the file that holds its traceback, exit 1."""
    try:
        yield
    except FSCILError as err:
        fail(first_line(err))
    except KeyboardInterrupt:
        fail("interrupted; nothing was written", 130)
    except Exception as err:  # noqa: BLE001 - the last line of defence: never a bare traceback
        if DEBUG["on"]:
            raise
        import tempfile
        import traceback

        fd, trace = tempfile.mkstemp(prefix="fscil-trace-", suffix=".txt")
        with open(fd, "w") as f:
            traceback.print_exc(file=f)
        fail(f"unexpected {type(err).__name__}: {first_line(err, '')} (full trace: {trace}; `fscil --debug ...` "
             "prints it)", 1)


def load_config(params: Path, overrides: list[str] | None = None):
    """The resolved config of `params` and `-S` overrides; sets the CPU thread count (a param: CPU results depend
    on it). Outside the repository a missing params.yaml says where to run."""
    from pipeline.config import load_config as load

    if not Path(params).exists():
        raise FSCILError(f"{params}: no such file in {Path.cwd()}; run fscil from the repository's root, or pass "
                         "--params FILE (and --data-dir DIR)")
    cfg = load(params, overrides or ())
    import torch

    torch.set_num_threads(cfg.threads)
    return cfg


def timed(name: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Run a stage function; its wall time on stderr (not in any output: a rerun writes the same bytes); interrupted:
    one line naming it, exit 130."""
    started = time.time()
    try:
        result = fn(*args, **kwargs)
    except KeyboardInterrupt:
        fail(f"{name} interrupted; nothing was written", 130)
    say(f"{name}: done in {time.time() - started:.1f} s")
    return result


def say(line: str) -> None:
    """A progress or summary line on stderr (shown under --quiet too, which turns off bars only)."""
    print(line, file=sys.stderr, flush=True)


def show(summary: dict, keys: tuple[str, ...]) -> None:
    """The summary's `keys` as one JSON line on stdout."""
    print(json.dumps({k: summary[k] for k in keys if k in summary}), flush=True)


def under_torchrun(cfg, stage: str, params: Path, data_dir: Path, overrides: list[str], quiet: bool) -> None:
    """params nproc_per_node > 1: this stage again under torchrun, one process per GPU; exits with its code. Inside
    torchrun (WORLD_SIZE set) it returns, and the stage runs."""
    if cfg.nproc_per_node > 1 and "WORLD_SIZE" not in os.environ:
        import subprocess

        say(f"stage {stage}: {cfg.nproc_per_node} processes under torchrun")
        argv = ["--params", str(params), "--data-dir", str(data_dir), *(["--quiet"] if quiet else []),
                *[a for o in overrides for a in ("-S", o)]]
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                   str(cfg.nproc_per_node), "-m", f"stages.{stage}", *argv]
        sys.exit(subprocess.run(command).returncode)


def options(stage: str, doc: str) -> argparse.ArgumentParser:
    """The options every stage takes (`fscil stage <name> --help` describes them)."""
    parser = argparse.ArgumentParser(prog=f"python -m stages.{stage}", description=doc)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("-S", "--set", dest="overrides", action="append", default=[])
    parser.add_argument("-q", "--quiet", action="store_true")
    return parser


def main(command: Callable[..., None], parser: argparse.ArgumentParser, argv: list[str] | None = None) -> None:
    """`python -m stages.<name>`: parse, run `command(**options)` with one-line errors (importing the `stages`
    package pinned the kernels)."""
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    with one_line_errors():
        command(**vars(args))
