"""The `fscil` command line: `fscil stage <name>` runs one pipeline stage; `fscil select` (hyperparameter selection),
`fscil model summary`, `fscil config show`.

Every command exits 0 on success, 2 on bad input (a one-line message on stderr) and 1 on an unexpected error.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from pipeline.errors import FSCILError

app = typer.Typer(help="Mamba-FSCIL: few-shot class-incremental learning with a dual selective SSM projector.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
stage_app = typer.Typer(help="Run one pipeline stage (what `dvc repro` runs).", no_args_is_help=True)
model_app = typer.Typer(help="Inspect the model.", no_args_is_help=True)
config_app = typer.Typer(help="Inspect the resolved configuration.", no_args_is_help=True)
app.add_typer(stage_app, name="stage")
app.add_typer(model_app, name="model")
app.add_typer(config_app, name="config")

ParamsOpt = Annotated[Path, typer.Option("--params", help="params.yaml to read.")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", "-S", help="Override one value: -S section.key=value (repeatable; `dvc exp run -S` syntax).")]
DataDirOpt = Annotated[Path, typer.Option("--data-dir", help="Directory of the pipeline's artifacts.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars (progress lines stay).")]
ReuseStaleOpt = Annotated[bool, typer.Option("--reuse-stale", help="Reuse stored runs made by other code.")]


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


def _run(name: str, fn, *args, timed: bool = True, **kwargs):
    """Run a stage function with one-line errors and (for stages) a timing summary on stderr."""
    started = time.time()
    try:
        result = fn(*args, **kwargs)
    except FSCILError as err:
        _fail(str(err).splitlines()[0] if str(err) else type(err).__name__, FSCILError.exit_code)
    except KeyboardInterrupt:
        _fail(f"{name} interrupted; nothing was written", 130)
    if timed:
        typer.echo(f"{name}: done in {time.time() - started:.1f} s", err=True)
    return result


def _config(params: Path, overrides: list[str] | None = None):
    from pipeline.config import load_config

    try:
        cfg = load_config(params, overrides or ())
    except FSCILError as err:
        _fail(str(err), FSCILError.exit_code)
    # CPU results depend on the intra-op thread count (reductions split differently), so it is a param
    import torch

    torch.set_num_threads(cfg.threads)
    return cfg


def _paths(data_dir: Path):
    from stages.paths import StagePaths

    return StagePaths(data_dir)


def _show(summary: dict, keys: tuple[str, ...]) -> None:
    typer.echo(json.dumps({k: summary[k] for k in keys if k in summary}))


@stage_app.command("config")
def config_stage(params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"),
                 overrides: SetOpt = None) -> None:
    """Resolve params.yaml over its preset and variant and write every value that runs to data/config/run.yaml
    (device as resolved on this machine): the stages list the keys they read there as DVC params."""
    import yaml

    from pipeline.atomic import atomic_write_text
    from pipeline.config import run_values
    from pipeline.device import resolved_device_name

    cfg = _config(params, overrides)
    path = _paths(data_dir).run_config
    device = _run("config", resolved_device_name, cfg.device, timed=False)
    atomic_write_text(path, yaml.safe_dump(run_values(cfg, device), sort_keys=False))
    typer.echo(f"config: {cfg.method}, seed {cfg.seed}, device {device} -> {path}")


@stage_app.command("prepare")
def prepare(params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"), overrides: SetOpt = None
            ) -> None:
    """Convert the configured dataset (or the synthetic default) into the HDF5 image pack data/pack.h5."""
    from stages import prepare as stage

    cfg = _config(params, overrides)
    summary = _run("prepare", stage.run, dataclasses.asdict(cfg.data), _paths(data_dir).pack, cfg)
    _show(summary, ("dataset", "num_images", "num_classes", "num_sessions", "content_hash", "seconds"))


@stage_app.command("base")
def base(params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"), quiet: QuietOpt = False,
         overrides: SetOpt = None) -> None:
    """Train backbone, p_iden and g_base on the base session; resumes from data/base.resume when interrupted."""
    from stages import base as stage

    cfg = _config(params, overrides)
    summary = _run("base", stage.run, cfg, _paths(data_dir), show_progress=not quiet)
    if summary:
        typer.echo(f"base: accuracy {summary['acc']:.2f} on the base classes ({summary['epochs']} epochs)", err=True)
        _show(summary, ("acc", "epochs", "steps", "world_size", "seconds"))


@stage_app.command("extract")
def extract(params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"), quiet: QuietOpt = False,
            overrides: SetOpt = None) -> None:
    """Cache the frozen backbone's maps (test set, few-shot images, base class means) in data/features.zarr."""
    from stages import extract as stage

    cfg = _config(params, overrides)
    _show(_run("extract", stage.run, cfg, _paths(data_dir), show_progress=not quiet),
          ("test", "fewshot", "base_classes", "map_shape", "seconds"))


@stage_app.command("incremental")
def incremental(session: Annotated[int, typer.Option("--session", "-s", help="Incremental session (1..S).")],
                params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"),
                quiet: QuietOpt = False, overrides: SetOpt = None) -> None:
    """Train g_inc for one session on cached features; session N needs session N-1 done."""
    from stages import incremental as stage

    cfg = _config(params, overrides)
    result = _run(f"incremental session {session}", stage.run, cfg, _paths(data_dir), session,
                  show_progress=not quiet)
    if result:
        proto = result.get("prototype", {}).get("backbone", {}).get("acc")
        typer.echo(f"session {session}: accuracy {result['acc']:.2f} on {result.get('num_seen_classes', '?')} classes "
                   f"(base {result['base_acc']:.2f}, novel {result['novel_acc']:.2f})"
                   + (f"; backbone class means {proto:.2f}" if proto is not None else ""), err=True)
    _show(result, ("session", "acc", "base_acc", "novel_acc", "seconds"))


@stage_app.command("report")
def report(params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"),
           metrics: Annotated[Path, typer.Option(help="Where to write the DVC metrics file.")] = Path("metrics.json"),
           overrides: SetOpt = None) -> None:
    """Per-session table (data/report/sessions.csv), plots and metrics.json (AVG, PD, final), each naming the preset,
    variant and seed that ran."""
    from stages import report as stage

    cfg = _config(params, overrides)
    summary = _run("report", stage.run, _paths(data_dir), metrics, cfg)
    typer.echo(f"{summary['method']}, seed {summary['seed']}")
    typer.echo(" ".join(f"{k}={v:.2f}" for k, v in summary["sessions"].items()))
    typer.echo(f"AVG {summary['avg']:.2f}  PD {summary['pd']:.2f}  final {summary['final']:.2f}")


def _trained(session: int | None, model: Path | None, params: Path, data_dir: Path, overrides: list[str] | None):
    """The model of `session` of the run the params describe, or an exported file (`--model`)."""
    from pipeline.training import apply

    if model is not None:
        return _run("load", apply.load_exported, model, timed=False)
    if session is None:
        _fail("give --session N (0: the base model) or --model FILE (from `fscil export`)", FSCILError.exit_code)
    cfg = _config(params, overrides)
    paths = _paths(data_dir)
    return _run("load", apply.load_session_model, cfg, paths.base, paths.pack, paths.data_dir / "sessions", session,
                timed=False)


SessionOpt = Annotated[int | None, typer.Option("--session", "-s", help="The model after this session (0: base).")]


@app.command("export")
def export(out: Annotated[Path, typer.Argument(help="The .safetensors file to write.")],
           session: SessionOpt = None, params: ParamsOpt = Path("params.yaml"),
           data_dir: DataDirOpt = Path("data"), overrides: SetOpt = None) -> None:
    """Write the model after session N as one self-contained safetensors file (all tensors, the classes seen, the
    image preprocessing, config digest and code version) that `fscil predict --model` reads."""
    from pipeline.code_version import code_version
    from pipeline.training import apply

    trained = _trained(session, None, params, data_dir, overrides)
    _run("export", apply.export_model, trained, out, code_version(), timed=False)
    typer.echo(f"{out}: {apply.describe(trained)}")


@app.command("predict")
def predict_images(images: Annotated[list[Path], typer.Argument(help="Image files or folders (searched recursively).")],
                   session: SessionOpt = None,
                   model: Annotated[Path | None, typer.Option("--model", help="An exported model file.")] = None,
                   out: Annotated[Path | None, typer.Option("--out", help="Write a CSV here instead of printing.")]
                   = None,
                   device: Annotated[str, typer.Option(help="cpu, cuda or auto.")] = "auto",
                   params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"),
                   overrides: SetOpt = None) -> None:
    """The class of each image (name and softmax score over the seen classes) under the model after session N of
    this run (--session, from the stage outputs) or of an exported file (--model), with the test images'
    preprocessing."""
    import pandas as pd

    from pipeline.atomic import atomic_output
    from pipeline.device import resolve_device
    from pipeline.training import apply

    trained = _trained(session, model, params, data_dir, overrides)
    files = _run("predict", apply.image_files, images, timed=False)
    rows = _run("predict", apply.predict_files, trained, files, _run("predict", resolve_device, device, timed=False),
                timed=False)
    table = pd.DataFrame(rows, columns=["path", "class_id", "class", "score"])
    if out is None:
        typer.echo(table.to_csv(index=False).rstrip())
        return
    with atomic_output(out) as tmp:
        table.to_csv(tmp, index=False)
    typer.echo(f"{out}: {len(rows)} images, {apply.describe(trained)}", err=True)


@app.command("select")
def selection(params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"),
              out: Annotated[Path | None, typer.Option("--out", help="Output folder (default: <data-dir>/selection).")
                             ] = None,
              quiet: QuietOpt = False, overrides: SetOpt = None, reuse_stale: ReuseStaleOpt = False) -> None:
    """Choose architecture and loss weights on pseudo-incremental tasks from the base session's training data only
    (the paper's protocol; slow, not part of `dvc repro`). Writes selection.csv, selected.yaml, selection.json.
    Stages before the loss weights score their candidates with lambda2 = lambda3 = 0 (the paper's order), whatever
    the params set. Candidate results are kept in <out>.work and reused; a new run into the same --out replaces
    its selection.csv and selected.yaml."""
    import pandas as pd

    from stages import select as stage

    cfg = _config(params, overrides)
    out = _project_path(out or data_dir / "selection")
    log = None if quiet else (lambda line: typer.echo(line, err=True))
    result = _run("select", stage.run, cfg, _paths(data_dir), out, log=log, reuse_stale=reuse_stale)
    typer.echo(pd.DataFrame(result["rows"]).to_string(index=False))
    typer.echo("chosen: " + "  ".join(f"{k}={v}" for k, v in result["chosen"].items()))
    typer.echo(f"params fragment: {out / 'selected.yaml'}")


@app.command("study")
def study(variants: Annotated[str, typer.Option(help="Comma-separated variants (pipeline/variants/).")] = (
              "mlp_baseline,single_ssm,dual_ssm,mamba_fscil"),
          seeds: Annotated[str, typer.Option(help="Comma-separated seeds.")] = "0,1,2",
          params: ParamsOpt = Path("params.yaml"),
          out: Annotated[Path | None, typer.Option("--out", help="Output folder (default: <data-dir>/studies/ablation; "
                                                   "relative: from the project root).")] = None,
          data_dir: DataDirOpt = Path("data"), quiet: QuietOpt = False, overrides: SetOpt = None,
          reuse_stale: ReuseStaleOpt = False,
          jobs: Annotated[int, typer.Option("--jobs", "-j", help="Runs at once, each its own process (same results)."
                                            )] = 1) -> None:
    """Run named variants x seeds through the pipeline's training code and write mean +- std tables and a plot
    (out/table.md, table.csv, runs.csv, sessions.csv, accuracy.png); slow, not part of `dvc repro`."""
    from pipeline.config import read_yaml
    from pipeline.study import run_study, study_table, table_markdown

    _config(params, overrides)  # validates params.yaml and pins the thread count
    names = [v.strip() for v in variants.split(",") if v.strip()]
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        _fail(f"--seeds must be comma-separated integers, got {seeds!r}", FSCILError.exit_code)
    log = None if quiet else (lambda line: typer.echo(line, err=True))
    out = _project_path(out or data_dir / "studies" / "ablation")
    sessions = _run("study", run_study, read_yaml(params), names, seed_list, out, log=log,
                    overrides=overrides or (), reuse_stale=reuse_stale, jobs=jobs)
    typer.echo(table_markdown(study_table(sessions, names)))


@config_app.command("show")
def config_show(params: ParamsOpt = Path("params.yaml"), overrides: SetOpt = None,
                origin: Annotated[bool, typer.Option("--origin", help="Each value with the layer it came from.")]
                = False) -> None:
    """Print the configuration that runs: params.yaml and -S over its preset and variant."""
    import yaml

    cfg = _config(params, overrides)
    if not origin:
        typer.echo(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        return
    from pipeline.config import flatten

    values = flatten({**cfg.to_dict(), "sessions": cfg.sessions}, "config")
    width = min(48, max(len(f"{k}: {_value(v)}") for k, v in values.items()))
    for key, value in values.items():
        typer.echo(f"{f'{key}: {_value(value)}':<{width}}  # {cfg.origins.get(key, 'default')}")


def _value(value) -> str:
    import json as _json

    if value is None or isinstance(value, bool):
        return _json.dumps(value)
    return _json.dumps(value) if isinstance(value, (list, dict)) else str(value)


@app.command("list")
def list_choices() -> None:
    """The presets (pipeline/presets/) and variants (pipeline/variants/), one line each."""
    from pipeline.config import PRESET_DIR, VARIANT_DIR, available_presets, available_variants, describe_file

    for title, folder, names in (("presets", PRESET_DIR, available_presets()),
                                 ("variants", VARIANT_DIR, available_variants())):
        typer.echo(f"{title} ({folder.relative_to(folder.parents[1])}/):")
        width = max(len(n) for n in names)
        for name in names:
            typer.echo(f"  {name:<{width}}  {describe_file(folder / f'{name}.yaml')}")


@config_app.command("sessions")
def config_sessions(count: Annotated[int, typer.Option("--count", help="Incremental sessions of the protocol.")]
                    ) -> None:
    """Print params.yaml's `sessions` block for a protocol of COUNT incremental sessions."""
    import yaml

    from pipeline.config import session_map

    if count < 1:
        _fail("--count must be >= 1", FSCILError.exit_code)
    typer.echo(yaml.safe_dump({"sessions": session_map(count)}, sort_keys=False, default_style=None).rstrip())


@model_app.command("summary")
def model_summary(
    preset: Annotated[str, typer.Option(help="Preset whose model section gives the defaults.")] = "cifar100",
    backbone: Annotated[str | None, typer.Option(help="resnet12, resnet18, vit_b16, swin_t.")] = None,
    widths: Annotated[str | None, typer.Option(help="ResNet-12 widths, comma separated.")] = None,
    projector: Annotated[str | None, typer.Option(
        help="dual_ssm, single_ssm, mlp, s4, transformer, gru, lstm; comma separated or 'all': side by side.")] = None,
    dim: Annotated[int | None, typer.Option(help="Projector width D'.")] = None,
    d_state: Annotated[int | None, typer.Option(help="SSM state size.")] = None,
    dt_rank: Annotated[int | None, typer.Option(help="Low-rank width of f_Delta.")] = None,
    k_paths: Annotated[int | None, typer.Option(help="Scan paths K.")] = None,
    classifier: Annotated[str | None, typer.Option(help="etf or linear.")] = None,
    num_classes: Annotated[int | None, typer.Option(help="Total classes (default: the preset dataset's).")] = None,
    input_size: Annotated[int | None, typer.Option(help="Input image size (default: the preset's).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Parameter count of each component (backbone, p_iden, g_base, g_inc, classifier) for the given dims."""
    from pipeline.models.projector import PROJECTOR_KINDS
    from pipeline.models.summary import summarise_model

    kinds = list(PROJECTOR_KINDS) if projector == "all" else (projector.split(",") if projector else [None])
    overrides = {"backbone": backbone, "dim": dim, "d_state": d_state, "dt_rank": dt_rank,
                 "k_paths": k_paths, "classifier": classifier,
                 "backbone_widths": [int(w) for w in widths.split(",")] if widths else None}
    summaries = [_run("model summary", summarise_model, preset, {**overrides, "projector": kind}, num_classes,
                      input_size, timed=False) for kind in kinds]
    if as_json:
        typer.echo(json.dumps(summaries[0] if len(summaries) == 1 else summaries, indent=2))
        return
    first = summaries[0]
    typer.echo(f"feature map {first['feature_map']}  input {first['input_size']}  classes {first['num_classes']}")
    if len(summaries) == 1:
        typer.echo(f"{'component':<12}{'parameters':>14}{'trainable in':>26}")
        for name, row in first["components"].items():
            typer.echo(f"{name:<12}{row['parameters']:>14,}{row['trains_in']:>26}")
        typer.echo(f"{'total':<12}{first['total_parameters']:>14,}")
        return
    typer.echo(f"{'component':<12}" + "".join(f"{s['model']['projector']:>15}" for s in summaries))
    for name in first["components"]:
        typer.echo(f"{name:<12}" + "".join(f"{s['components'][name]['parameters']:>15,}" for s in summaries))
    typer.echo(f"{'total':<12}" + "".join(f"{s['total_parameters']:>15,}" for s in summaries))


@model_app.command("benchmark")
def model_benchmark(
    preset: Annotated[str, typer.Option(help="Preset whose model section gives the widths.")] = "cifar100",
    batch: Annotated[int, typer.Option(help="Batch size.")] = 64,
    channels: Annotated[int, typer.Option(help="Backbone map channels C.")] = 640,
    hw: Annotated[int, typer.Option(help="Backbone map side H = W.")] = 2,
    dim: Annotated[int | None, typer.Option(help="Projector width D'.")] = None,
    d_state: Annotated[int | None, typer.Option(help="SSM state size.")] = None,
    dt_rank: Annotated[int | None, typer.Option(help="Low-rank width of f_Delta.")] = None,
    projector: Annotated[str | None, typer.Option(help="A model.projector kind (its branch is timed).")] = None,
    repeats: Annotated[int, typer.Option(help="Timed repeats (the median is reported).")] = 5,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
) -> None:
    """Median forward and forward+backward time of one projector branch (g_base / g_inc) on random maps."""
    from pipeline.models.benchmark import benchmark_branch

    overrides = {"dim": dim, "d_state": d_state, "dt_rank": dt_rank, "projector": projector}
    typer.echo(json.dumps(_run("model benchmark", benchmark_branch, preset, overrides, batch, channels, hw,
                               repeats, device, timed=False)))


@model_app.command("cost")
def model_cost(
    preset: Annotated[str, typer.Option(help="Preset whose model section gives the widths.")] = "synthetic",
    projectors: Annotated[str, typer.Option(help="model.projector kinds, comma separated.")] =
        "dual_ssm,expanding_mlp,mlp,s4,transformer,gru,lstm",
    sessions: Annotated[int, typer.Option(help="Sessions of the curve against sessions.")] = 8,
    sides: Annotated[str, typer.Option(help="Map sides H = W of the curve against tokens L.")] = "1,2,4,7,14",
    channels: Annotated[int | None, typer.Option(help="Map channels C (default: the preset backbone's).")] = None,
    side: Annotated[int | None, typer.Option(help="Map side of the sessions curve (default: the preset's).")] = None,
    batch: Annotated[int, typer.Option(help="Batch size.")] = 64,
    repeats: Annotated[int, typer.Option(help="Timed repeats (the median is reported).")] = 5,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    out: Annotated[Path, typer.Option(help="Output folder: cost.csv and cost.png.")] = Path("data/cost"),
) -> None:
    """Cost curves of the projector: parameters, inference and training-step time against the number of sessions
    (the expanding MLP grows, one g_inc stays flat) and against the number of tokens L."""
    import torch

    from pipeline.atomic import atomic_output
    from pipeline.models.benchmark import cost_curves, plot_cost_curves, preset_map

    try:
        side_list = [int(v) for v in sides.split(",")]
    except ValueError:
        _fail(f"--sides must be comma-separated integers, got {sides!r}", FSCILError.exit_code)
    if min(side_list) < 1 or sessions < 1 or batch < 1 or repeats < 1:
        _fail("--sides, --sessions, --batch and --repeats must be >= 1", FSCILError.exit_code)
    if channels is None or side is None:
        summary = _run("model cost", preset_map, preset, timed=False)
        channels, side = channels or summary[0], side or summary[1]
    threads = torch.get_num_threads()
    table = _run("model cost", cost_curves, preset, {}, projectors.split(","), channels, side, sessions, side_list,
                 batch, repeats, device, log=lambda line: typer.echo(line, err=True))
    out.mkdir(parents=True, exist_ok=True)
    with atomic_output(out / "cost.csv") as tmp:
        table.assign(device=device, threads=threads, batch=batch, channels=channels).to_csv(tmp, index=False)
    plot_cost_curves(table, out / "cost.png", f"projector cost, {preset} widths, {channels} channels, batch {batch}, "
                     f"{device} ({threads} threads)")
    typer.echo(f"wrote {out / 'cost.csv'} and {out / 'cost.png'}")


_STATE = {"debug": False}  # set by the --debug option before any command runs


@app.callback()
def _options(debug: Annotated[bool, typer.Option("--debug", help="Show the full traceback of an unexpected error.")]
             = False) -> None:
    _STATE["debug"] = debug


def main(argv: list[str] | None = None) -> None:
    """Console entry: bad input is one line and exit 2; an unexpected error is one line naming the file that holds
    its traceback, and exit 1 (`fscil --debug ...` prints the traceback instead)."""
    try:
        app(args=argv)
    except FSCILError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(FSCILError.exit_code)
    except Exception as err:  # noqa: BLE001 - the last line of defence: never a bare traceback
        if _STATE["debug"]:
            raise
        import tempfile
        import traceback

        fd, trace = tempfile.mkstemp(prefix="fscil-trace-", suffix=".txt")
        with open(fd, "w") as f:
            traceback.print_exc(file=f)
        first = str(err).splitlines()[0] if str(err) else ""
        typer.echo(f"error: unexpected {type(err).__name__}: {first} (full trace: {trace}; "
                   "`fscil --debug ...` prints it)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
