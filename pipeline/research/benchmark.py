"""`fscil model benchmark`: forward and forward+backward time of one projector branch (median of repeats);
`fscil model cost`: the projector's parameters and step times against sessions and against tokens."""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch

from pipeline.config import preset_model_config
from pipeline.errors import FSCILError
from pipeline.models.registry import MAMBA_1D
from pipeline.training.sgd import SGD


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def benchmark_branch(preset: str, overrides: dict, batch: int, channels: int, hw: int, repeats: int,
                     device: str = "cpu", model_cfg=None) -> dict:
    """Median times of one projector branch on random maps (batch, channels, hw, hw): the model section of `preset`
    with `overrides`, or `model_cfg` (a run's resolved one) when given."""
    from pipeline.models.registry import PROJECTOR_KINDS
    from pipeline.models.ss2d import BranchDims

    cfg = model_cfg if model_cfg is not None else preset_model_config(preset, overrides)[0]
    torch.manual_seed(0)
    kind = PROJECTOR_KINDS[cfg.projector].branch(cfg.ssm_branch)
    branch = kind(channels, (hw, hw), BranchDims.from_config(cfg)).to(device)
    f = torch.randn(batch, channels, hw, hw, device=device)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def forward():
        with torch.no_grad():
            branch(f)
        sync()

    def forward_backward():
        branch.zero_grad(set_to_none=True)
        branch(f).square().sum().backward()
        sync()

    return {"preset": preset, "projector": cfg.projector, "batch": batch, "map": f"{channels}x{hw}x{hw}",
            "dim": cfg.dim, "d_state": cfg.d_state, "k_paths": cfg.k_paths, "ssm_branch": cfg.ssm_branch,
            "threads": torch.get_num_threads(),
            "device": device, "repeats": repeats,
            "forward_ms": round(_median_ms(forward, repeats), 2),
            "forward_backward_ms": round(_median_ms(forward_backward, repeats), 2)}


# ---- cost curves (paper Fig. 1 and its cost comparison): the projector against sessions and against tokens L ------
COST_COLUMNS = ("projector", "scan", "curve", "sessions", "side", "tokens", "parameters", "inference_ms",
                "train_step_ms", "peak_train_mb")


def _projector_costs(kind: str, cfg, channels: int, side: int, sessions: int, batch: int, repeats: int,
                     device: str, precision: str = "fp32") -> dict:
    """Parameters of the whole projector (every g_inc branch) as it is in session `sessions`, median inference
    time (mode incremental, no grad) and median training-step time (forward, backward, SGD step of what trains in
    an incremental session) on a random (batch, channels, side, side) map, with the forward passes under params
    `precision` as training runs them; on CUDA also the peak memory of the training steps (MB)."""
    from pipeline.models.projector import Projector
    from pipeline.precision import autocast

    torch.manual_seed(0)
    proj = Projector.from_config(dataclasses.replace(cfg, projector=kind), channels, (side, side))
    proj.set_sessions(sessions)
    proj.freeze_base()  # the paper's incremental sessions: p_iden / g_base frozen
    proj.to(device)
    f = torch.randn(batch, channels, side, side, device=device)
    trainable = [p for p in proj.parameters() if p.requires_grad]
    opt = SGD(trainable, lr=1e-3)
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    on = torch.device(device)

    def infer():
        with torch.no_grad(), autocast(on, precision):
            proj(f, mode="incremental")
        sync()

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast(on, precision):
            mu = proj(f, mode="incremental").mu
        mu.float().square().mean().backward()
        opt.step()
        sync()

    inference_ms = round(_median_ms(infer, repeats), 3)
    if cuda:
        torch.cuda.reset_peak_memory_stats(on)
    train_step_ms = round(_median_ms(step, repeats), 3)
    peak = round(torch.cuda.max_memory_allocated(on) / 2**20, 2) if cuda else None
    return {"projector": kind, "sessions": sessions, "side": side, "tokens": side * side,
            "parameters": sum(p.numel() for p in proj.parameters()),
            "inference_ms": inference_ms, "train_step_ms": train_step_ms, "peak_train_mb": peak}


def preset_map(preset: str) -> tuple[int, int]:
    """(channels, side) of the preset backbone's map at the preset's input size."""
    from pipeline.data.presets import get_preset
    from pipeline.models.fscil import build_backbone_from_config

    model_cfg, merged = preset_model_config(preset, {})
    size = get_preset(merged["data"].get("dataset", "synthetic"), merged["data"].get("image_size")).input_size
    backbone = build_backbone_from_config(model_cfg, size)
    return backbone.out_channels, backbone.feature_hw(size)[0]


def cost_curves(preset: str, overrides: dict, kinds: list[str], channels: int, side: int, max_sessions: int,
                sides: list[int], batch: int, repeats: int, device: str = "cpu",
                log: Callable[[str], None] | None = None, scans: tuple[str, ...] = ("auto",),
                precision: str = "fp32") -> pd.DataFrame:
    """Rows of COST_COLUMNS: curve "sessions" (1..max_sessions at side x side) and curve "tokens" (each side in
    `sides`, session 1), for every projector kind and every selective scan in `scans` (params `scan`; CUDA only
    beyond auto and torch: CPU tensors always take the PyTorch scan)."""

    cfg, _ = preset_model_config(preset, overrides)
    say = log or (lambda line: None)
    points = [("sessions", s, side) for s in range(1, max_sessions + 1)] + [("tokens", 1, h) for h in sides]
    rows = []
    for scan in each_scan(scans, device):
        for kind in kinds:
            for curve, sessions, h in points:
                rows.append({"curve": curve, "scan": scan, **_projector_costs(kind, cfg, channels, h, sessions,
                                                                              batch, repeats, device, precision)})
                r = rows[-1]
                say(f"{kind} ({scan} scan) {curve}: session {sessions}, L {h}x{h}: {r['parameters']:,} "
                    f"parameters, inference {r['inference_ms']:.2f} ms, train step {r['train_step_ms']:.2f} ms")
    return pd.DataFrame(rows, columns=list(COST_COLUMNS))


def each_scan(scans: tuple[str, ...], device: str):
    """Yields each of `scans` with the selective scan set to it (params `scan`), then restores the previous one."""
    from pipeline.ops import selective_scan as scan_module

    if not device.startswith("cuda") and set(scans) - {"auto", "torch"}:
        raise FSCILError(f"model cost: scans {', '.join(scans)} need --device cuda (the CPU runs the PyTorch scan)")
    before = scan_module._scan_choice
    try:
        for scan in scans:
            try:
                scan_module.set_scan(scan)
            except ValueError as err:
                raise FSCILError(f"model cost: {err}") from None
            yield scan
    finally:
        scan_module.set_scan(before)


# the paper's projector-level profiling (appendix table "Projector-level efficiency"): setting, the preset whose
# model section gives the projector's widths, map channels, side, sessions of its protocol
PAPER_SETTINGS = (
    ("CIFAR, ResNet-12, 640x2x2", "cifar100", 640, 2, 8),
    ("miniImageNet, ResNet-12, 640x5x5", "mini_imagenet", 640, 5, 8),
    ("CUB, ResNet-18, 512x7x7", "cub200", 512, 7, 10),
    ("CUB, ViT/Swin, 768x14x14", "cub200", 768, 14, 10),
)
PAPER_METHODS = (("Dual-MLP", "mlp", False), ("Mamba-FSCIL", "dual_ssm", False),
                 ("Expanding-MLP-S", "expanding_mlp", True))


def paper_profile(repeats: int, device: str, precision: str = "fp32", scans: tuple[str, ...] = ("auto",),
                  batch: int = 8, settings=None, log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """The paper's projector profiling table at batch 8: per setting Dual-MLP, Mamba-FSCIL (dual selective SSM) and
    the expanding MLP in its protocol's last session; inference and training-step ms, peak training memory (CUDA),
    and each row's times over Dual-MLP's."""
    say = log or (lambda line: None)
    rows = []
    for scan in each_scan(scans, device):
        for setting, preset, channels, side, last in settings or PAPER_SETTINGS:
            cfg, _ = preset_model_config(preset, {})
            for name, kind, grows in PAPER_METHODS:
                sessions = last if grows else 1
                r = _projector_costs(kind, cfg, channels, side, sessions, batch, repeats, device, precision)
                rows.append({"setting": setting, "method": f"{name}{last}" if grows else name, "scan": scan,
                             **{k: r[k] for k in ("parameters", "inference_ms", "train_step_ms", "peak_train_mb")}})
                say(f"{setting}, {rows[-1]['method']} ({scan} scan): inference {r['inference_ms']:.2f} ms, "
                    f"train step {r['train_step_ms']:.2f} ms")
    table = pd.DataFrame(rows)
    dual = table[table["method"] == "Dual-MLP"].set_index(["setting", "scan"])
    key = list(zip(table["setting"], table["scan"], strict=True))
    for col in ("inference_ms", "train_step_ms"):
        ratio = table[col].to_numpy() / dual.loc[key, col].to_numpy()
        table[f"{col.removesuffix('_ms')}_vs_dual_mlp"] = ratio.round(2)
    return table


SCAN_GRID_PRESETS = ("cifar100", "mini_imagenet", "cub200")
SCAN_GRID_BATCHES = (8, 64, 512)


def _scan_inputs(b: int, k: int, d_inner: int, n: int, tokens: int, device: str,
                 shared: bool = False) -> dict[str, torch.Tensor]:
    """Seeded inputs of one selective scan of a branch: SS2D's (K groups of d_inner channels, B and C per group) or,
    `shared` (model.ssm_branch mamba_1d), the 1-D branch's (the K orders as K x b rows of d_inner channels, one B and
    C for all channels)."""
    gen = torch.Generator().manual_seed(0)
    b, d, bc = (b * k, d_inner, (n, tokens)) if shared else (b, k * d_inner, (k, n, tokens))
    return {"u": torch.randn(b, d, tokens, generator=gen).to(device).requires_grad_(),
            "delta": torch.randn(b, d, tokens, generator=gen).to(device).requires_grad_(),
            "A": (-torch.rand(d, n, generator=gen) - 0.5).to(device),
            "B": torch.randn(b, *bc, generator=gen).to(device).requires_grad_(),
            "C": torch.randn(b, *bc, generator=gen).to(device).requires_grad_(),
            "D": torch.ones(d, device=device), "delta_bias": torch.zeros(d, device=device)}


def _scan_once(inputs: dict[str, torch.Tensor], grad: bool, sync: Callable[[], None]) -> None:
    from pipeline.ops.selective_scan import selective_scan

    with torch.set_grad_enabled(grad):
        y = selective_scan(**inputs, delta_softplus=True)
        if grad:
            torch.autograd.grad(y.sum(), [t for t in inputs.values() if t.requires_grad])
    sync()


def scan_grid(device: str, repeats: int, scans: tuple[str, ...], presets: tuple[str, ...] = SCAN_GRID_PRESETS,
              batches: tuple[int, ...] = SCAN_GRID_BATCHES, log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Median ms of the selective scan alone at each preset's branch shape (SS2D: d = K x d_inner channels in K
    groups; the 1-D branch: K x the batch of d_inner channels; n = d_state, l = the map's tokens) and each batch,
    forward without gradients and forward + backward, under each of `scans`: the timings `scan: auto` dispatches by
    (pipeline/ops/scan_dispatch.py)."""
    say = log or (lambda line: None)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    rows = []
    for preset in presets:
        model, _ = preset_model_config(preset, {})
        k, d_inner, n, side = model.k_paths, model.expand * model.dim, model.d_state, preset_map(preset)[1]
        shared = model.ssm_branch == MAMBA_1D
        for batch in batches:
            inputs = _scan_inputs(batch, k, d_inner, n, side * side, device, shared)
            b, d = inputs["u"].shape[:2]
            for scan in each_scan(scans, device):
                for grad in (False, True):
                    ms = _median_ms(functools.partial(_scan_once, inputs, grad, sync), repeats)
                    rows.append({"preset": preset, "b": b, "d": d, "l": side * side, "n": n, "grad": grad,
                                 "scan": scan, "ms": round(ms, 4)})
                    say(f"scan grid: {preset} b {b} d {d} l {side * side} n {n} "
                        f"{'fwd+bwd' if grad else 'fwd'} {scan}: {ms:.3f} ms")
    return pd.DataFrame(rows)


def grid_rows(table: pd.DataFrame) -> list[tuple]:
    """`scan_grid`'s table as scan_dispatch.MEASURED rows: (b, d, l, n, grad, {scan: ms})."""
    rows = []
    for (b, d, l_, n, grad), group in table.groupby(["b", "d", "l", "n", "grad"], sort=False):
        rows.append((int(b), int(d), int(l_), int(n), bool(grad), dict(zip(group.scan, group.ms, strict=True))))
    return rows


def plot_cost_curves(table: pd.DataFrame, path: Path, title: str) -> None:
    """Two rows (against sessions, against tokens L) x three columns (parameters, inference, training step)."""
    from pipeline.plots import figure

    measures = (("parameters", "projector parameters"), ("inference_ms", "inference (ms / batch)"),
                ("train_step_ms", "training step (ms / batch)"))
    with figure(path, 2, 3, (13, 7)) as (fig, axes):
        for row, (curve, x, xlabel) in enumerate((("sessions", "sessions", "session"),
                                                  ("tokens", "tokens", "tokens L (side x side)"))):
            part = table[table["curve"] == curve]
            for col, (measure, ylabel) in enumerate(measures):
                ax = axes[row, col]
                several = part["scan"].nunique() > 1
                for (kind, scan), runs in part.groupby(["projector", "scan"], sort=False):
                    ax.plot(runs[x], runs[measure], marker="o", label=f"{kind} ({scan})" if several else kind)
                ax.set_xlabel(xlabel)
                ax.set_ylabel(ylabel)
                if curve == "tokens":
                    ax.set_xscale("log")
                    ax.set_xticks(sorted(part["tokens"].unique()), [str(t) for t in sorted(part["tokens"].unique())])
                ax.grid(alpha=0.3)
        axes[0, 0].legend(fontsize=8)
        fig.suptitle(title)
