"""What every `fscil` command shares: the params options, one-line errors and the stage runner."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.errors import FSCILError
from stages import entry

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


def _run(name: str, fn, *args, timed: bool = True, flags: dict[str, str] | None = None, **kwargs):
    """Run a library function inside a command: bad input is one line and exit 2, a stage (`timed`) reports its
    wall time and exits 130 when interrupted (`stages.entry.timed`). flags: {config key: the command-line option that
    sets it} ({"model.k_paths": "--k-paths"}): an error about such a key names the option, not params."""
    try:
        return entry.timed(name, fn, *args, **kwargs) if timed else fn(*args, **kwargs)
    except FSCILError as err:
        message = entry.first_line(err)
        for key, flag in (flags or {}).items():
            if message.startswith(prefix := f"params: {key} "):
                message = f"{flag} {message.removeprefix(prefix)}"
        entry.fail(message)


def _config(params: Path, overrides: list[str] | None = None):
    """The resolved config (threads set), or a one-line error and exit 2."""
    from stages.entry import load_config

    return _run("params", load_config, params, overrides, timed=False)


def _paths(data_dir: Path):
    from stages.paths import StagePaths

    return StagePaths(data_dir)
