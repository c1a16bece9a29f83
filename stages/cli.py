"""The `fscil` command line: `fscil stage <name>` runs one pipeline stage; `fscil select` (hyperparameter selection),
`fscil study`, `fscil config show`, `fscil list`; the model tools and `fscil predict` / `fscil export` are in
stages/cli_tools.py.

Every command exits 0 on success, 2 on bad input (a one-line message on stderr) and 1 on an unexpected error.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from stages.cli_common import (
    DataDirOpt,
    JobsOpt,
    ParamsOpt,
    QuietOpt,
    ReuseStaleOpt,
    SetOpt,
    _config,
    _paths,
    _project_path,
    _run,
)
from stages.cli_tools import compare_runs, doctor, export, learn, model_app, predict_images, show
from stages.entry import DEBUG, fail, one_line_errors, say

app = typer.Typer(help="Mamba-FSCIL: few-shot class-incremental learning with a dual selective SSM projector.",
                  no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  add_completion=False)
stage_app = typer.Typer(help="Run one pipeline stage (what `dvc repro` runs).", no_args_is_help=True,
                        rich_markup_mode=None)
config_app = typer.Typer(help="Inspect the resolved configuration.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(stage_app, name="stage")
app.add_typer(model_app, name="model")
app.add_typer(config_app, name="config")
app.command("export")(export)
app.command("predict")(predict_images)
app.command("learn")(learn)
app.command("compare")(compare_runs)
app.command("doctor")(doctor)
app.command("show")(show)


@stage_app.command("config")
def config_stage(params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"),
                 overrides: SetOpt = None) -> None:
    """Resolve params.yaml over its preset and variant and write every value that runs to data/config/run.yaml
    (device as resolved on this machine): the stages list the keys they read there as DVC params."""
    from stages import config as stage

    with one_line_errors():
        stage.command(params, data_dir, overrides or [])


@stage_app.command("prepare")
def prepare(params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"), overrides: SetOpt = None
            ) -> None:
    """Convert the configured dataset (or the synthetic default) into the HDF5 image pack data/pack.h5."""
    from stages import prepare as stage

    with one_line_errors():
        stage.command(params, data_dir, overrides or [])


@stage_app.command("base")
def base(params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"), quiet: QuietOpt = False,
         overrides: SetOpt = None) -> None:
    """Train backbone, p_iden and g_base on the base session; resumes from data/base.resume when interrupted; under
    params nproc_per_node > 1 in that many processes (torchrun)."""
    from stages import base as stage

    with one_line_errors():
        stage.command(params, data_dir, overrides or [], quiet)


@stage_app.command("extract")
def extract(params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"), quiet: QuietOpt = False,
            overrides: SetOpt = None) -> None:
    """Cache the frozen backbone's maps (test set, few-shot images, base class means) in data/features.zarr."""
    from stages import extract as stage

    with one_line_errors():
        stage.command(params, data_dir, overrides or [], quiet)


@stage_app.command("incremental")
def incremental(session: Annotated[int, typer.Option("--session", "-s", help="Incremental session (1..S).")],
                params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"),
                quiet: QuietOpt = False, overrides: SetOpt = None) -> None:
    """Train g_inc for one session on cached features; session N needs session N-1 done."""
    from stages import incremental as stage

    with one_line_errors():
        stage.command(session, params, data_dir, overrides or [], quiet)


@stage_app.command("report")
def report(params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"),
           metrics: Annotated[Path, typer.Option(help="Where to write the DVC metrics file.")] = Path("metrics.json"),
           overrides: SetOpt = None) -> None:
    """Per-session table (data/report/sessions.csv), plots and metrics.json (AVG, PD, final), each naming the preset,
    variant and seed that ran."""
    from stages import report as stage

    with one_line_errors():
        stage.command(params, data_dir, overrides or [], metrics)


@app.command("select")
def selection(params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"),
              out: Annotated[Path | None, typer.Option("--out", help="Output folder (default: <data-dir>/selection).")
                             ] = None,
              quiet: QuietOpt = False, overrides: SetOpt = None, reuse_stale: ReuseStaleOpt = False,
              jobs: JobsOpt = 1) -> None:
    """Choose architecture and loss weights on pseudo-incremental tasks from the base session's training data only
    (the paper's protocol; slow, not part of `dvc repro`). Writes selection.csv, selected.yaml, selection.json.
    Stages before the loss weights score their candidates with lambda2 = lambda3 = 0 (the paper's order), whatever
    the params set. Candidate results are kept in <out>.work and reused; a new run into the same --out replaces
    its selection.csv and selected.yaml."""
    import pandas as pd

    from stages import select as stage

    cfg = _config(params, overrides)
    candidates = _selection(params, overrides)
    out = _project_path(out or data_dir / "selection")
    result = _run("select", stage.run, cfg, candidates, _paths(data_dir), out, log=say, reuse_stale=reuse_stale,
                  jobs=jobs)
    typer.echo(pd.DataFrame(result["rows"]).to_string(index=False))
    typer.echo("chosen: " + "  ".join(f"{k}={v}" for k, v in result["chosen"].items()))
    typer.echo(f"params fragment: {out / 'selected.yaml'}")


@app.command("speed")
def speed(params: ParamsOpt = Path("params.yaml"), overrides: SetOpt = None,
          out: Annotated[Path, typer.Option("--out", help="Output folder: speed.csv and speed.md.")] = Path(
              "data/speed"),
          keep: Annotated[bool, typer.Option("--keep", help="Keep the run's outputs in <out>.work.")] = False,
          pack_cache: Annotated[Path | None, typer.Option("--pack-cache", help="Folder keeping the image pack of "
                                                          "each data section, built once for several runs.")] = None,
          base_epochs: Annotated[int | None, typer.Option(
              "--base-epochs", min=1, help="Train only the first N epochs of the base schedule (whole passes of "
              "base.repeat), the schedule unchanged, and estimate the whole run from their pace.")] = None
          ) -> None:
    """Time every stage of the configured run once (prepare, base, extract, each session, report) on a scratch
    folder: seconds, peak GPU memory, base images/s. With -S +data.source=synthetic a paper preset runs at its shape
    without its dataset; --base-epochs N times the first N epochs of its base schedule and estimates the rest."""
    import shutil

    from pipeline.atomic import atomic_output, claim_folder, mark_folder
    from pipeline.research.speed import device_label, speed_markdown, time_stages
    from pipeline.training.runtime import run_device

    cfg = _config(params, overrides)
    out = _run("speed", claim_folder, _project_path(out), "fscil speed", timed=False)
    work = _run("speed", claim_folder, out.with_name(out.name + ".work"), "fscil speed (work)", timed=False)
    if pack_cache is not None:
        pack_cache = mark_folder(_run("speed", claim_folder, pack_cache, "fscil speed (pack cache)", timed=False),
                                 "fscil speed (pack cache)")
    shutil.rmtree(work, ignore_errors=True)  # a scratch folder of an earlier speed run (claimed above)
    mark_folder(work, "fscil speed (work)")
    try:
        table = _run("speed", time_stages, cfg, work, say, pack_cache, base_epochs)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    text = speed_markdown(table, cfg, device_label(run_device(cfg)))
    with atomic_output(out, directory=True, owner="fscil speed") as tmp:
        table.to_csv(tmp / "speed.csv", index=False)
        (tmp / "speed.md").write_text(text)
    typer.echo(text + f"wrote {out / 'speed.csv'} and {out / 'speed.md'}")


@app.command("study")
def study(variants: Annotated[str, typer.Option(help="Comma-separated variants (pipeline/variants/).")] = (
              "mlp_baseline,single_ssm,dual_ssm,mamba_fscil"),
          seeds: Annotated[str, typer.Option(help="Comma-separated seeds.")] = "0,1,2",
          name: Annotated[str, typer.Option("--name", help="Experiment names: <name>-<variant>-s<seed>.")] = "study",
          metric: Annotated[list[str] | None, typer.Option(
              "--metric", "-m", help="Metrics to compare (as fscil compare -m).")] = None,
          in_process: Annotated[bool, typer.Option(
              "--in-process", help="Run in this process with the study's own cache (--out, --params), outside "
                                   "DVC: what the research pages' commands ran.")] = False,
          params: ParamsOpt = Path("params.yaml"),
          out: Annotated[Path | None, typer.Option("--out", help="--in-process: the output folder (default: "
                                                   "<data-dir>/studies/ablation; relative: from the project root).")]
          = None,
          data_dir: DataDirOpt = Path("data"), quiet: QuietOpt = False, overrides: SetOpt = None,
          reuse_stale: ReuseStaleOpt = False, jobs: JobsOpt = 1) -> None:
    """Run named variants x seeds as DVC experiments (`dvc exp run --queue`, `--jobs` queue workers) and print each
    variant's mean +- SE over the seeds, and for two variants their paired difference (`fscil compare`). Each run
    is an experiment <name>-<variant>-s<seed> in `dvc exp show` and `dvc plots diff`; a finished one is not run
    again. --in-process: the study's own runner instead (tables and a plot under --out)."""
    names = [v.strip() for v in variants.split(",") if v.strip()]
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        fail(f"--seeds must be comma-separated integers, got {seeds!r}")
    for variant in names:  # validates params.yaml, the -S keys and each variant before anything runs
        _config(params, [*(overrides or ()), f"variant={variant}"])
    _config(params, overrides)  # and pins the thread count
    if in_process:
        _study_in_process(names, seed_list, params, out, data_dir, overrides, reuse_stale, jobs)
        return
    if out is not None or params != Path("params.yaml") or reuse_stale:
        fail("--out, --params and --reuse-stale belong to --in-process: a DVC study runs the committed "
             "params.yaml with -S keys")
    from pipeline.research.compare import (
        HEADLINE,
        compare,
        compare_text,
        details_at,
        exp_show_csv,
        finished_names,
        resolved_at,
    )
    from pipeline.research.queue import grid, run_grid

    runs = grid(name, names, seed_list, tuple(overrides or ()))
    failed = _run("study", run_grid, runs, jobs, finished_names(exp_show_csv()), log=say, timed=False)
    if failed:
        fail(f"study: {', '.join(failed)} failed (dvc queue logs {failed[0]})")
    chosen = [n for n, _ in runs]
    params_frame, metrics, _ = _run("study", compare, exp_show_csv(), chosen, tuple(metric) if metric else HEADLINE,
                                    details_at, resolved_at, timed=False)
    typer.echo(compare_text(params_frame, metrics))


def _study_in_process(names: list[str], seed_list: list[int], params: Path, out: Path | None, data_dir: Path,
                      overrides: list[str] | None, reuse_stale: bool, jobs: int) -> None:
    from pipeline.config import read_yaml
    from pipeline.research.study import run_study, study_table, table_markdown

    out = _project_path(out or data_dir / "studies" / "ablation")
    sessions = _run("study", run_study, read_yaml(params), names, seed_list, out, log=say,
                    overrides=overrides or (), reuse_stale=reuse_stale, jobs=jobs)
    typer.echo(table_markdown(study_table(sessions, names)))


@config_app.command("show")
def config_show(keys: Annotated[list[str] | None, typer.Argument(
                    help="Keys or sections to print (incremental.lr, model); none: all.")] = None,
                params: ParamsOpt = Path("params.yaml"), overrides: SetOpt = None,
                origin: Annotated[bool, typer.Option("--origin", help="Each value with the layer it came from.")]
                = False) -> None:
    """Print the configuration that runs: params.yaml and -S over its preset and variant."""
    import dataclasses

    from pipeline.config import dump_yaml, flatten

    cfg = _config(params, overrides)
    shown = {**cfg.to_dict(), "selection": dataclasses.asdict(_selection(params, overrides))}
    values = flatten({**shown, "sessions": cfg.sessions}, "config")
    if keys:
        unknown = [k for k in keys if not any(v == k or v.startswith(f"{k}.") for v in values)]
        if unknown:
            fail(f"no key {', '.join(unknown)} (`fscil config keys` lists them)")
        values = {v: x for v, x in values.items() if any(v == k or v.startswith(f"{k}.") for k in keys)}
    if not origin and not keys:
        typer.echo(dump_yaml(shown))
        return
    width = min(48, max(len(f"{k}: {_value(v)}") for k, v in values.items()))
    for key, value in values.items():
        line = f"{key}: {_value(value)}"
        typer.echo(f"{line:<{width}}  # {cfg.origins.get(key, 'default')}" if origin else line)


@config_app.command("keys")
def config_keys(out: Annotated[Path | None, typer.Option(help="Write the table here (docs/keys.md) instead of "
                                                             "printing it.")] = None) -> None:
    """Every configuration key: default, the stages that read it, whether `fscil select` searches it, what it does."""
    from pipeline.atomic import atomic_write_text, claim_file
    from pipeline.research.keys import KEYS_TITLE, keys_table

    if out is None:
        typer.echo(keys_table(), nl=False)
        return
    _run("config keys", claim_file, out, "fscil config keys", "a key table",
         lambda p: p.is_file() and p.read_text(errors="replace").startswith(KEYS_TITLE), timed=False)
    atomic_write_text(out, keys_table())
    typer.echo(f"wrote {out}")


def _selection(params: Path, overrides: list[str] | None):
    """The `selection` section (read by `fscil select` alone), checked: a one-line error, exit 2."""
    from pipeline.config import read_yaml
    from pipeline.research.selection_config import load_selection

    return _run("params", lambda: load_selection(read_yaml(params), overrides or (), str(params)), timed=False)


def _value(value) -> str:
    import json as _json

    if value is None or isinstance(value, bool):
        return _json.dumps(value)
    return _json.dumps(value) if isinstance(value, (list, dict)) else str(value)


@app.command("list")
def list_choices() -> None:
    """The presets, the variants and every registry's entries (backbones, branches, loss forms, datasets, ...), one
    line each."""
    from pipeline.config import PRESET_DIR, VARIANT_DIR, available_presets, available_variants, describe_file
    from pipeline.registry import all_registries

    for title, folder, names in (("presets", PRESET_DIR, available_presets()),
                                 ("variants", VARIANT_DIR, available_variants())):
        typer.echo(f"{title} ({folder.relative_to(folder.parents[1])}/):")
        width = max(len(n) for n in names)
        for name in names:
            typer.echo(f"  {name:<{width}}  {describe_file(folder / f'{name}.yaml')}")
    for dotted, registry in all_registries().items():
        module, name = dotted.rsplit(".", 1)
        plural = registry.kind + ("es" if registry.kind.endswith(("s", "ch", "sh", "x")) else "s")
        typer.echo(f"{plural} ({module.replace('.', '/')}.py {name}):")
        width = max(len(n) for n in registry)
        for entry in registry:
            typer.echo(f"  {entry:<{width}}  {registry.describe(entry)}")


@config_app.command("sessions")
def config_sessions(count: Annotated[int, typer.Option("--count", help="Incremental sessions of the protocol.")]
                    ) -> None:
    """Print params.yaml's `sessions` block for a protocol of COUNT incremental sessions."""
    import yaml

    from pipeline.config import session_map

    if count < 1:
        fail("--count must be >= 1")
    typer.echo(yaml.safe_dump({"sessions": session_map(count)}, sort_keys=False, default_style=None).rstrip())


try:  # the click that typer runs on: its own copy since typer 0.2x
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - typer on the installed click
    from click import exceptions as click_errors


@app.callback()
def _options(debug: Annotated[bool, typer.Option("--debug", help="Show the full traceback of an unexpected error.")]
             = False) -> None:
    DEBUG["on"] = debug


def main(argv: list[str] | None = None) -> None:
    """Console entry: bad input is one line and exit 2 (usage errors too); an unexpected error is one line naming the
    file that holds its traceback, and exit 1 (`fscil --debug ...` prints it instead). The CPU kernels were pinned
    when the `stages` package was imported, before anything imported torch."""
    with one_line_errors():
        try:
            code = app(args=argv, standalone_mode=False)
            if isinstance(code, int):  # typer.Exit(code) from a command
                sys.exit(code)
        except click_errors.NoArgsIsHelpError as err:  # `fscil`, `fscil stage`: the help
            typer.echo(err.ctx.get_help())
        except click_errors.UsageError as err:  # a wrong option, value or command: one line, exit 2
            where = f" (`{err.ctx.command_path} --help`)" if err.ctx is not None else ""
            fail(f"{' '.join(err.format_message().split())}{where}")
        except click_errors.ClickException as err:
            fail(" ".join(err.format_message().split()), err.exit_code)
        except typer.Abort:
            fail("aborted", 130)


if __name__ == "__main__":
    main()
