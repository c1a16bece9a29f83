"""`fscil model ...` (parameter counts, timings, cost curves) and `fscil predict` / `fscil export` (applying a trained
model): the commands that are not pipeline stages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pipeline.models.registry import BACKBONES, HEADS, PROJECTOR_KINDS, SSM_BRANCHES
from stages.cli_common import DataDirOpt, ParamsOpt, SetOpt, _config, _paths, _run
from stages.entry import fail

model_app = typer.Typer(help="Inspect the model.", no_args_is_help=True, rich_markup_mode=None)


def _trained(session: int | None, model: Path | None, params: Path, data_dir: Path, overrides: list[str] | None,
             learnable: bool = False):
    """The model of `session` of the run the params describe, or an exported file (`--model`); learnable: with what
    a further session needs (the feature store's class memory)."""
    from pipeline.training import apply

    if model is not None:
        if session is not None:
            fail("give --session N (the model of this run's session N) or --model FILE (an exported model), not both")
        return _run("load", apply.load_exported, model, timed=False)
    if session is None:
        fail("give --session N (0: the base model) or --model FILE (from `fscil export`)")
    cfg = _config(params, overrides)
    paths = _paths(data_dir)
    if not paths.base.exists():  # a fresh clone: nothing trained (a missing session is load_session_model's)
        fail(f"{paths.base}: not found: this run has not been trained yet (`make repro`, or `dvc repro`, trains the "
             "base model and every session of params.yaml)")
    return _run("load", apply.load_session_model, cfg, paths.base, paths.pack, paths.data_dir / "sessions", session,
                paths.features if learnable else None, timed=False)


SessionOpt = Annotated[int | None, typer.Option("--session", "-s", help="The model after this session (0: base).")]


def export(out: Annotated[Path, typer.Argument(help="The .safetensors file to write.")],
           session: SessionOpt = None, params: ParamsOpt = Path("params.yaml"),
           data_dir: DataDirOpt = Path("data"), overrides: SetOpt = None) -> None:
    """Write the model after session N as one self-contained safetensors file (all tensors, the classes seen, the
    image preprocessing, config digest and code version) that `fscil predict --model` reads."""
    from pipeline.atomic import claim_file
    from pipeline.code_version import code_version
    from pipeline.training import apply

    _run("export", claim_file, out, "fscil export", "a model file", apply.is_export, "model.safetensors", timed=False)
    if out.suffix != ".safetensors":
        fail(f"{out}: the file is safetensors: name it {out.with_suffix('.safetensors').name} (`fscil predict --model` "
             "and `fscil learn --model` read it)")
    learnable = _paths(data_dir).features.exists()
    trained = _trained(session, None, params, data_dir, overrides, learnable=learnable)
    _run("export", apply.export_model, trained, out, code_version(), timed=False)
    typer.echo(f"{out}: {apply.describe(trained)}")
    if not learnable:
        typer.echo(f"note: no feature store in {data_dir}: the file predicts but cannot learn new classes (`fscil "
                   "learn`); run `fscil stage extract` and export again for that", err=True)


def learn(folder: Annotated[Path, typer.Argument(help="A class-folder tree: one folder per class, named by the "
                                                       "class, a few images each.")],
          out: Annotated[Path, typer.Option("--out", help="The model file to write (.safetensors).")],
          session: SessionOpt = None,
          model: Annotated[Path | None, typer.Option("--model", help="A model file (`fscil export`, `fscil learn`)."
                                                     )] = None,
          device: Annotated[str, typer.Option(help="cpu, cuda or auto.")] = "auto",
          params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"),
          overrides: SetOpt = None) -> None:
    """Teach the model of session N (--session) or a model file (--model) the classes of FOLDER: one incremental
    session on their images (the pipeline's own session code, g_inc only, the backbone frozen), written as one model
    file that `fscil predict --model` and a further `fscil learn --model` read."""
    from pipeline.api import learn as learn_folder
    from pipeline.atomic import claim_file
    from pipeline.code_version import code_version
    from pipeline.device import resolve_device
    from pipeline.training import apply

    if model is not None and out.resolve() == model.resolve():
        fail(f"--out {out} is the input model: write the extended model to another file")
    _run("learn", claim_file, out, "fscil learn", "a model file", apply.is_export, "model.safetensors", timed=False)
    where = _run("learn", resolve_device, device, source="--device", timed=False)
    trained = _trained(session, model, params, data_dir, overrides, learnable=True)
    grown = _run("learn", learn_folder, trained, folder, where, timed=False, log=lambda line: typer.echo(line,
                                                                                                        err=True))
    _run("learn", apply.export_model, grown, out, code_version(), timed=False)
    new = grown.num_seen - trained.num_seen
    typer.echo(f"{out}: {grown.num_seen} classes known ({new} new: {', '.join(grown.class_names[-new:])}), "
               f"session {grown.session}, {grown.meta['seconds']:.1f} s")


def predict_images(images: Annotated[list[Path], typer.Argument(help="Image files or folders (searched recursively).")],
                   session: SessionOpt = None,
                   model: Annotated[Path | None, typer.Option("--model", help="An exported model file.")] = None,
                   labelled: Annotated[bool, typer.Option(
                       "--labelled", help="One class-folder tree whose folder names are the model's classes: print "
                       "accuracy (all, base, novel) and write the confusion matrix beside --out.")] = False,
                   out: Annotated[Path | None, typer.Option("--out", help="Write a CSV here instead of printing "
                                                            "(--labelled: default <tree>-predictions.csv).")]
                   = None,
                   device: Annotated[str, typer.Option(help="cpu, cuda or auto.")] = "auto",
                   params: ParamsOpt = Path("params.yaml"), data_dir: DataDirOpt = Path("data"),
                   overrides: SetOpt = None) -> None:
    """The class of each image and its score under the model after session N of this run (--session, from the stage
    outputs) or of an exported file (--model), with the test images' preprocessing. The score is the cosine to the
    class's ETF vertex (what the DR loss trains to 1), or the softmax probability of a linear head. --labelled: the
    images' folders are their classes; prints accuracy and writes the confusion matrix (CSV and picture)."""
    import pandas as pd

    from pipeline.atomic import atomic_output, claim_file
    from pipeline.device import resolve_device
    from pipeline.training import apply
    from pipeline.training import labelled as folder_eval

    if labelled:
        if len(images) != 1 or not images[0].is_dir():
            fail("--labelled takes one folder: a class-folder tree (<tree>/<class>/<image>) whose folder names are "
                 "classes the model knows")
        out = out or Path(f"{images[0].resolve().name}-predictions.csv")
    if out is not None:
        _run("predict", claim_file, out, "fscil predict", "a CSV file", apply.is_prediction_csv, "predictions.csv",
             timed=False)
    if labelled:
        confusion_csv, confusion_png = folder_eval.confusion_paths(out)
        _run("predict", claim_file, confusion_csv, "fscil predict", "a confusion matrix", folder_eval.is_confusion_csv,
             timed=False)
        _run("predict", claim_file, confusion_png, "fscil predict", "the confusion matrix's picture",
             lambda _: folder_eval.is_confusion_csv(confusion_csv), timed=False)
    where = _run("predict", resolve_device, device, source="--device", timed=False)  # before loading anything
    trained = _trained(session, model, params, data_dir, overrides)
    if labelled:
        evaluation = _run("predict", folder_eval.evaluate_folder, trained, images[0], where, timed=False)
        rows, columns = evaluation.rows, [*apply.prediction_columns(trained), *folder_eval.LABEL_COLUMNS]
    else:
        files = _run("predict", apply.image_files, images, timed=False)
        rows, columns = _run("predict", apply.predict_files, trained, files, where, timed=False), \
            apply.prediction_columns(trained)
    table = pd.DataFrame(rows, columns=columns)
    table["class_id"] = table["class_id"].astype("Int64")
    for row in rows:
        if row["skipped"]:
            typer.echo(f"skipped {row['path']}: {row['skipped']}", err=True)
    if out is None:
        typer.echo(table.to_csv(index=False).rstrip())
        return
    with atomic_output(out) as tmp:
        table.to_csv(tmp, index=False)
    skipped = sum(bool(r["skipped"]) for r in rows)
    typer.echo(f"{out}: {len(rows) - skipped} images predicted, {skipped} skipped, {apply.describe(trained)}",
               err=True)
    if labelled:
        folder_eval.write_confusion(evaluation, confusion_csv, confusion_png,
                                    f"{images[0].name}: {apply.describe(trained)}")
        for line in evaluation.summary():
            typer.echo(line)
        typer.echo(f"confusion matrix: {confusion_csv} (counts), {confusion_png}")


def _flags(overrides: dict) -> dict[str, str]:
    """{model key: the option that sets it} of a `model` command's overrides (`--k-paths` sets model.k_paths)."""
    return {f"model.{key}": "--widths" if key == "backbone_widths" else f"--{key.replace('_', '-')}"
            for key in overrides}


@model_app.command("summary")
def model_summary(
    preset: Annotated[str, typer.Option(help="Preset whose model section gives the defaults.")] = "cifar100",
    backbone: Annotated[str | None, typer.Option(help=f"{', '.join(BACKBONES)}.")] = None,
    widths: Annotated[str | None, typer.Option(help="ResNet-12 widths, comma separated.")] = None,
    projector: Annotated[str | None, typer.Option(
        help=f"{', '.join(PROJECTOR_KINDS)}; comma separated or 'all': side by side.")] = None,
    dim: Annotated[int | None, typer.Option(help="Projector width D'.")] = None,
    d_state: Annotated[int | None, typer.Option(help="SSM state size.")] = None,
    dt_rank: Annotated[int | None, typer.Option(help="Low-rank width of f_Delta.")] = None,
    k_paths: Annotated[int | None, typer.Option(help="Scan paths K.")] = None,
    ssm_branch: Annotated[str | None, typer.Option(help=f"The selective-SSM branch: {', '.join(SSM_BRANCHES)}.")]
    = None,
    classifier: Annotated[str | None, typer.Option(help=f"{', '.join(HEADS)}.")] = None,
    num_classes: Annotated[int | None, typer.Option(help="Total classes (default: the preset dataset's).")] = None,
    input_size: Annotated[int | None, typer.Option(help="Input image size (default: the preset's).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Parameter count of each component (backbone, p_iden, g_base, g_inc, classifier) for the given dims."""
    from pipeline.research.summary import summarise_model

    kinds = list(PROJECTOR_KINDS) if projector == "all" else (projector.split(",") if projector else [None])
    unknown = [k for k in kinds if k is not None and k not in PROJECTOR_KINDS]
    if unknown:
        fail(f"--projector must be one or more of {', '.join(PROJECTOR_KINDS)} (comma separated) or all, got "
              f"{', '.join(unknown)}")
    try:
        widths_list = [int(w) for w in widths.split(",")] if widths else None
    except ValueError:
        fail(f"--widths must be comma-separated integers, got {widths!r}")
    overrides = {"backbone": backbone, "dim": dim, "d_state": d_state, "dt_rank": dt_rank,
                 "k_paths": k_paths, "ssm_branch": ssm_branch, "classifier": classifier, "backbone_widths": widths_list}
    summaries = [_run("model summary", summarise_model, preset, {**overrides, "projector": kind}, num_classes,
                      input_size, timed=False, flags=_flags(overrides)) for kind in kinds]
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
    preset: Annotated[str | None, typer.Option(
        help="Preset whose model section gives the widths (default: the run params.yaml describes).")] = None,
    batch: Annotated[int, typer.Option(help="Batch size.")] = 64,
    channels: Annotated[int | None, typer.Option(
        help="Backbone map channels C (default: the run's backbone; 640 with --preset).")] = None,
    hw: Annotated[int | None, typer.Option(
        help="Backbone map side H = W (default: the run's backbone at its image size; 2 with --preset).")] = None,
    dim: Annotated[int | None, typer.Option(help="Projector width D'.")] = None,
    d_state: Annotated[int | None, typer.Option(help="SSM state size.")] = None,
    dt_rank: Annotated[int | None, typer.Option(help="Low-rank width of f_Delta.")] = None,
    projector: Annotated[str | None, typer.Option(help="A model.projector kind (its branch is timed).")] = None,
    repeats: Annotated[int, typer.Option(help="Timed repeats (the median is reported).")] = 5,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Median forward and forward+backward time of one projector branch (g_base / g_inc) on random maps: of the run
    params.yaml describes (its model section and its backbone's map), or of --preset's model section."""
    import dataclasses

    from pipeline.device import resolve_device
    from pipeline.research.benchmark import benchmark_branch

    overrides = {"dim": dim, "d_state": d_state, "dt_rank": dt_rank, "projector": projector}
    _run("model benchmark", resolve_device, device, source="--device", timed=False)
    model_cfg = None
    if preset is None:
        from pipeline.models.fscil import build_backbone_from_config

        cfg = _config(params, None)
        preset = cfg.preset
        model_cfg = dataclasses.replace(cfg.model, **{k: v for k, v in overrides.items() if v is not None})
        if channels is None or hw is None:  # the run's own map, without loading pretrained weights
            backbone = build_backbone_from_config(dataclasses.replace(model_cfg, pretrained=None), cfg.data.image_size)
            channels = channels or backbone.out_channels
            hw = hw or backbone.feature_hw(cfg.data.image_size)[0]
    typer.echo(json.dumps(_run("model benchmark", benchmark_branch, preset, overrides, batch, channels or 640, hw or 2,
                               repeats, device, model_cfg, timed=False, flags=_flags(overrides))))


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
    scans: Annotated[str, typer.Option(help="Selective scans to time, comma separated (params `scan`; CUDA: "
                                            "torch,triton,mamba).")] = "auto",
    profile: Annotated[str, typer.Option(help="exact (deterministic, fp32) or fast (cuDNN autotuning, TF32, bf16): "
                                              "the settings training runs under (docs/gpu.md).")] = "exact",
    paper_table: Annotated[bool, typer.Option("--paper-table", help="The paper's projector profiling table instead "
                                              "(batch 8, four feature settings; out/paper_table.csv).")] = False,
    scan_grid: Annotated[bool, typer.Option("--scan-grid", help="The selective scans alone at the paper presets' "
                                            "SS2D shapes, batch 8 / 64 / 512 (out/scan_grid.csv), and the rows of "
                                            "pipeline/ops/scan_dispatch.py that make `scan: auto` take the fastest."
                                            )] = False,
    out: Annotated[Path, typer.Option(help="Output folder: cost.csv and cost.png.")] = Path("data/cost"),
) -> None:
    """Cost curves of the projector: parameters, inference and training-step time against the number of sessions
    (the expanding MLP grows, one g_inc stays flat) and against the number of tokens L; or, with --paper-table, the
    paper's projector profiling table (Dual-MLP, Mamba-FSCIL, the expanding MLP's last session)."""
    import torch

    from pipeline.atomic import atomic_output, claim_folder, mark_folder
    from pipeline.device import resolve_device
    from pipeline.precision import PROFILES
    from pipeline.research.benchmark import cost_curves, paper_profile, plot_cost_curves, preset_map

    if profile not in PROFILES:
        fail(f"--profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    out = _run("model cost", claim_folder, out, "fscil model cost", timed=False)
    deterministic, precision = PROFILES[profile]
    if device.startswith("cuda"):
        _run("model cost", resolve_device, device, deterministic, source="--device", timed=False)
    if scan_grid:
        _write_scan_grid(out, device, repeats, tuple(scans.split(",")), profile)
        return
    if paper_table:
        table = _run("model cost", paper_profile, repeats, device, precision, tuple(scans.split(",")),
                     log=lambda line: typer.echo(line, err=True))
        with atomic_output(mark_folder(out, "fscil model cost") / "paper_table.csv") as tmp:
            table.assign(device=device, profile=profile).to_csv(tmp, index=False)
        typer.echo(table.to_markdown(index=False))
        typer.echo(f"wrote {out / 'paper_table.csv'}")
        return

    try:
        side_list = [int(v) for v in sides.split(",")]
    except ValueError:
        fail(f"--sides must be comma-separated integers, got {sides!r}")
    if min(side_list) < 1 or sessions < 1 or batch < 1 or repeats < 1:
        fail("--sides, --sessions, --batch and --repeats must be >= 1")
    if channels is None or side is None:
        summary = _run("model cost", preset_map, preset, timed=False)
        channels, side = channels or summary[0], side or summary[1]
    threads = torch.get_num_threads()
    table = _run("model cost", cost_curves, preset, {}, projectors.split(","), channels, side, sessions, side_list,
                 batch, repeats, device, log=lambda line: typer.echo(line, err=True), scans=tuple(scans.split(",")),
                 precision=precision)
    with atomic_output(mark_folder(out, "fscil model cost") / "cost.csv") as tmp:
        table.assign(device=device, threads=threads, batch=batch, channels=channels, profile=profile).to_csv(
            tmp, index=False)
    plot_cost_curves(table, out / "cost.png", f"projector cost, {preset} widths, {channels} channels, batch {batch}, "
                     f"{device} ({threads} threads)")
    typer.echo(f"wrote {out / 'cost.csv'} and {out / 'cost.png'}")


def _write_scan_grid(out: Path, device: str, repeats: int, scans: tuple[str, ...], profile: str) -> None:
    import datetime

    import torch

    from pipeline.atomic import atomic_output, mark_folder
    from pipeline.ops.scan_dispatch import grid_literal
    from pipeline.research.benchmark import grid_rows, scan_grid

    table = _run("model cost", scan_grid, device, repeats, scans, log=lambda line: typer.echo(line, err=True))
    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"
    with atomic_output(mark_folder(out, "fscil model cost") / "scan_grid.csv") as tmp:
        table.assign(device=name, profile=profile).to_csv(tmp, index=False)
    typer.echo(grid_literal(name, datetime.date.today().isoformat(), grid_rows(table)))
    typer.echo(f"wrote {out / 'scan_grid.csv'}; paste the rows above into MEASURED in pipeline/ops/scan_dispatch.py")


def doctor(params: ParamsOpt = Path("params.yaml"), overrides: SetOpt = None,
           reference: Annotated[Path | None, typer.Option(help="The reference digests (default: the committed one, "
                                                          "pipeline/doctor_reference.txt).")] = None,
           write: Annotated[bool, typer.Option("--write", help="Write this machine's digests as the reference "
                                               "(on the machine that makes the committed metrics.json).")] = False
           ) -> None:
    """Whether this machine computes the committed numbers bit for bit: digests of the CPU kernels and of one
    training step of the run's network against the reference. One line; exit 0 when they are equal, 3 when not
    (the line names the first kernel or module that differs)."""
    from pipeline import doctor as dr

    cfg = _config(params, overrides)
    path = reference or dr.REFERENCE
    if write:
        from pipeline.atomic import atomic_write_text, claim_file

        _run("doctor", claim_file, path, "fscil doctor --write", "a digest reference",
             dr.is_reference, timed=False)
    mine = _run("doctor", dr.probe, cfg, timed=False)
    if write:
        atomic_write_text(path, mine.text())
        typer.echo(f"wrote {path}: {len(mine.digests)} digests ({mine.header['cpu']}, "
                   f"{mine.header['threads']} threads)")
        return
    same, line = _run("doctor", lambda: dr.verdict(mine, dr.Probe.read(path)), timed=False)
    typer.echo(line)
    if not same:
        raise typer.Exit(3)


def compare_runs(rows: Annotated[list[str] | None, typer.Argument(
        help="Rows of `dvc exp show` by name: an experiment, a branch (main), a commit, or workspace; none: all.")]
                 = None,
                 metric: Annotated[list[str] | None, typer.Option(
                     "--metric", "-m", help="Metrics to show, keys or patterns (repeatable): metrics.json's "
                                            "(default: avg, final, pd, base, novel, class_means_avg) or "
                                            "data/report/details.json's ('sessions.*', 'prototype.backbone.*').")]
                 = None,
                 all_commits: Annotated[bool, typer.Option(help="Rows of every commit, not only HEAD's.")] = False
                 ) -> None:
    """The rows of `dvc exp show` side by side: the params and resolved values that differ, then their metrics.
    Rows that differ only in seed are one setting: then each setting's mean +- SE over its seeds, and for two
    settings their paired difference over the seeds both ran. Experiments still running or queued are left out
    (named on stderr)."""
    from pipeline.research.compare import (
        HEADLINE,
        compare,
        compare_text,
        described,
        details_at,
        exp_show_csv,
        resolved_at,
    )

    params, metrics, unfinished = _run("compare", compare, exp_show_csv(all_commits), rows or [],
                                       tuple(metric) if metric else HEADLINE, details_at, resolved_at, timed=False)
    if unfinished:
        typer.echo(f"left out, no results yet: {described(unfinished)}", err=True)
    typer.echo(compare_text(params, metrics))


def show(rows: Annotated[list[str] | None, typer.Argument(
        help="Runs to show: workspace (the default), a commit or branch (main), or an experiment's name.")] = None
         ) -> None:
    """The per-session table of a run: accuracy on all seen / base / novel classes and the class-means baseline
    (the backbone's nearest class mean), then AVG, PD and final and its standing against its class means, read from
    data/report/sessions.csv (nothing is recomputed); several runs side by side."""
    from pipeline.research.compare import sessions_at, show_side_by_side, show_text

    runs = [(row, *_run("show", sessions_at, row, timed=False)) for row in rows or ["workspace"]]
    if len(runs) == 1:
        typer.echo(_run("show", show_text, runs[0][1], runs[0][2], timed=False))
    else:
        typer.echo(_run("show", show_side_by_side, runs, timed=False))
