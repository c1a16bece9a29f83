"""What every `fscil` command shares: the params options, one-line errors and the stage runner."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Annotated

import typer

from pipeline.errors import FSCILError

ParamsOpt = Annotated[Path, typer.Option("--params", metavar="FILE", help="params.yaml to read.")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", "-S", metavar="KEY=VALUE",
    help="Override one value: -S section.key=value (repeatable; `dvc exp run -S` syntax).")]
DataDirOpt = Annotated[Path, typer.Option("--data-dir", metavar="DIR", help="Directory of the pipeline's artifacts.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars (progress lines stay).")]
ReuseStaleOpt = Annotated[bool, typer.Option("--reuse-stale", help="Reuse stored runs made by other code.")]
JobsOpt = Annotated[int, typer.Option(
    "--jobs", "-j", metavar="N",
    help="Runs at once, each its own process (one GPU each when several are visible; same results as one).")]


def _project_path(path: Path) -> Path:
    """A relative --out is taken from the project root (the nearest folder up from here holding dvc.yaml), so a
    study or selection lands in the same place from any subfolder."""
    if path.is_absolute():
        return path
    here = Path.cwd()
    root = next((d for d in (here, *here.parents) if (d / "dvc.yaml").is_file()), here)
    return root / path


def _fail(message: str, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _run(name: str, fn, *args, timed: bool = True, flags: tuple[str, ...] = (), **kwargs):
    """Run a stage function with one-line errors and (for stages) a timing summary on stderr. flags: the
    command-line options that set config keys (`--k-paths` for model.k_paths): an error about such a key names the
    option, not params."""
    started = time.time()
    try:
        result = fn(*args, **kwargs)
    except FSCILError as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        for flag in flags:
            message = re.sub(rf"^params: \w+\.{flag[2:].replace('-', '_')}\b", flag, message)
        _fail(message, FSCILError.exit_code)
    except KeyboardInterrupt:
        _fail(f"{name} interrupted; nothing was written", 130)
    if timed:
        typer.echo(f"{name}: done in {time.time() - started:.1f} s", err=True)
    return result


def _config(params: Path, overrides: list[str] | None = None):
    """The resolved config (threads set), or a one-line error and exit 2."""
    from stages.entry import load_config

    return _run("params", load_config, params, overrides, timed=False)


def _paths(data_dir: Path):
    from stages.paths import StagePaths

    return StagePaths(data_dir)


def _show(summary: dict, keys: tuple[str, ...]) -> None:
    typer.echo(json.dumps({k: summary[k] for k in keys if k in summary}))


def echo_line(line: str) -> None:
    """A progress line on stderr (shown under --quiet too, which turns off bars only)."""
    typer.echo(line, err=True)
