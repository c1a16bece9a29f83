"""Base-session training (paper eq. optim_base): backbone f, p_iden and g_base with the DR loss on the base classes.

Determinism and process-count invariance: the epoch order is a permutation seeded by (seed, epoch), the
augmentation and Mixup/CutMix randoms by (seed, step), and each process keeps its slice of the global batch (see
pipeline/training/distributed.py). No checkpoint is selected on test data: the final weights are the result.
Resumable: a checkpoint with the optimizer state is written every `checkpoint_every` epochs next to the output
(pipeline/training/base_resume.py).
With base.precise_bn the backbone's BatchNorm statistics are measured afresh on the test-transformed training images
after the last epoch (pipeline/training/precise_bn.py). base.unmixed_epochs / base.unaugmented_epochs end the training
on unmixed batches / on the test view of the images (`_base_batch`).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from pipeline.atomic import atomic_output
from pipeline.config.run import head_classes
from pipeline.data.augment import pack_batch, test_transform, train_augment
from pipeline.data.mixing import mixup_cutmix
from pipeline.data.pack import ImagePack
from pipeline.data.presets import get_preset
from pipeline.errors import FSCILError, TrainingDiverged
from pipeline.losses.classification import cross_entropy_loss, mixed_loss, target_weights
from pipeline.losses.registry import BASE_MIX_LOSSES
from pipeline.models.fscil import FSCILModel, build_model
from pipeline.models.registry import HEADS
from pipeline.precision import autocast, image_layout, memory_format
from pipeline.seeding import BASE_EPOCH_ORDER, BASE_STEP_AUGMENT, BASE_STEP_MIX, seeded_generator
from pipeline.training.base_model import MODEL_FILE, base_twin, config_digest, config_stamp, load_base_model
from pipeline.training.base_resume import RESUME_FILE, resume_point, save_resume_point, trained_parameters
from pipeline.training.checkpoint import save_checkpoint, write_metrics
from pipeline.training.curves import BASE_COLUMNS, write_curve
from pipeline.training.distributed import (
    all_reduce_sum,
    barrier,
    cleanup,
    convert_device_batchnorm,
    convert_global_batchnorm,
    init_process_group,
    is_launch_main,
)
from pipeline.training.evaluate import predict, session_metrics
from pipeline.training.precise_bn import recalibrate_batchnorm
from pipeline.training.progress import CHECK_EVERY, ProgressLog, drain
from pipeline.training.registry import BASE_SCHEDULES
from pipeline.training.runtime import run_device
from pipeline.training.schedule import set_lr
from pipeline.training.sgd import SGD


class _BaseNet(nn.Module):
    """What DDP wraps: images -> (logits over the base classes (base mode), the auxiliary head's logits on the
    backbone's pooled map or None when base.backbone_ce is 0)."""

    def __init__(self, model: FSCILModel, num_base: int, aux_head: nn.Linear | None):
        super().__init__()
        self.model, self.num_base, self.aux_head = model, num_base, aux_head

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        f = self.model.forward_features(x)
        logits = self.model.forward_head(f, self.num_base, mode="base")[0]
        return logits, (self.aux_head(f.mean(dim=(2, 3))) if self.aux_head is not None else None)


def backbone_ce_head(model: FSCILModel, num_base: int, weight: float) -> nn.Linear | None:
    """The linear head of base.backbone_ce (ours) on the backbone's pooled map, on the model's device and
    zero-initialised (deterministic, and its first gradient reaches only itself); None when the weight is 0. It lives
    only during base training."""
    if weight == 0:
        return None
    head = nn.Linear(model.backbone.out_channels, num_base, device=next(model.parameters()).device)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


def _optimizer(model: FSCILModel, aux_head: nn.Linear | None, cfg) -> SGD:
    backbone = [p for p in model.backbone.parameters() if p.requires_grad]
    rest = [p for n, p in trained_parameters(model, aux_head).items()
            if p.requires_grad and not n.startswith("backbone.")]
    groups = [{"params": rest, "initial_lr": cfg.base.lr}]
    if backbone:
        groups.append({"params": backbone, "initial_lr": cfg.base.lr * cfg.base.backbone_lr_scale})
    return SGD(groups, lr=cfg.base.lr, momentum=cfg.base.momentum, weight_decay=cfg.base.weight_decay)


def load_base_train_images(pack: ImagePack, ids: np.ndarray, device: torch.device
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """All base training images as one uint8 tensor (N, H, W, 3) on `device` (a few hundred MB; CUB's whole images
    on their canvases 2.4 GB), and their extents (N, 2) (the shorter_side view) or None."""
    return pack_batch(pack, ids, device)


@torch.no_grad()
def evaluate_images(model: FSCILModel, pack: ImagePack, ids: np.ndarray, num_seen: int, preset, device: torch.device,
                    batch_size: int, mode: str = "base") -> np.ndarray:
    model.eval()
    parts = (pack_batch(pack, ids[i:i + batch_size], device) for i in range(0, len(ids), batch_size))
    batches = (test_transform(x, preset, extents) for x, extents in parts)
    return predict(lambda x: model(x, num_seen, mode=mode), batches)


def _base_batch(images: torch.Tensor, targets: torch.Tensor, num_base: int, preset, base_cfg, epoch: int,
                gen: torch.Generator, host_gen: torch.Generator | None = None, groups: int = 1,
                extents: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """One global batch of eq. optim_base: augmented images, the two targets and lam of batch Mixup/CutMix
    (target_b == target_a and lam == 1 when nothing is mixed: Mixup/CutMix off, or one of the last unmixed_epochs),
    and whether it was mixed (a bool: Mixup / CutMix is drawn on the host).
    In the last unaugmented_epochs the batch is the test view of the images, unmixed. gen draws the augmentation,
    host_gen (a CPU generator; None: gen) the mixing; groups: the device groups Mixup partners stay in; extents: the
    images' extents on their canvas (the shorter_side view) or None."""
    from_end = base_cfg.epochs - epoch  # 1 in the last epoch
    y_a = y_b = targets
    lam = torch.ones(len(targets), device=images.device)
    if from_end <= base_cfg.unaugmented_epochs:
        return test_transform(images, preset, extents), y_a, y_b, lam, False
    x = train_augment(images, preset, gen, extents)
    if from_end > base_cfg.unmixed_epochs and (base_cfg.mixup_alpha > 0 or base_cfg.cutmix_alpha > 0):
        mixed = mixup_cutmix(x, y_a, num_base, base_cfg.mixup_alpha, base_cfg.cutmix_alpha, base_cfg.mix_prob, 0.5,
                             gen if host_gen is None else host_gen, groups)
        return mixed.images, mixed.target_a, mixed.target_b, mixed.lam, mixed.kind != "none"
    return x, y_a, y_b, lam, False


def _write_base_model(out_dir: Path, model: FSCILModel, cfg, pack: ImagePack, input_size: int, result: dict) -> None:
    """out_dir/model.safetensors, keyed by the config digest and the pack (base_model.py reads it), and metrics.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    save_checkpoint(out_dir / MODEL_FILE, model.state_dict(), {
        "kind": "base-model", **config_stamp(cfg), "data": pack.content_hash,
        "model": cfg.to_dict()["model"], "input_size": input_size, "preset": pack.preset,
        "num_classes": head_classes(cfg, pack.protocol), "seed": cfg.seed,
    })
    write_metrics(out_dir / "metrics.json", result)


def derive_base_model(cfg, twin_dir: Path, pack_path: Path, out_dir: Path) -> dict:
    """cfg's base model (a projector without g_inc) written from its twin's trained one in `twin_dir` (`base_twin`):
    the same tensors without g_inc's, under cfg's digest, with the twin's test metrics (the base session's
    predictions do not involve g_inc). What training cfg's own base would write, without the training."""
    twin = base_twin(cfg)
    with ImagePack.open(pack_path) as pack:
        trained, meta, _ = load_base_model(twin, twin_dir, pack.content_hash)
        model = build_model(cfg.model, meta["num_classes"], meta["input_size"], seed=cfg.seed)
        keep = model.state_dict().keys()
        model.load_state_dict({k: v for k, v in trained.state_dict().items() if k in keep})  # strict: all of cfg's
        result = {**json.loads((Path(twin_dir) / "metrics.json").read_text()), "projector": cfg.model.projector,
                  "trained_as": twin.model.projector}
        _write_base_model(Path(out_dir), model, cfg, pack, meta["input_size"], result)
    return result


def base_loss(head, base_cfg, logits: torch.Tensor, aux_logits: torch.Tensor | None, y_a: torch.Tensor,
              y_b: torch.Tensor, lam: torch.Tensor, mixed: bool, weights: tuple | None = None) -> torch.Tensor:
    """One batch's loss of eq. optim_base: the head's loss on the mixed targets in the form base.mix_loss names (DR
    x base.dr_scale for the ETF head, weighted by base.dr_weighting: `weights`, computed on the global batch), plus
    base.backbone_ce x cross-entropy of the auxiliary head on the same targets (ours; aux_logits None: off). mixed:
    whether the batch was mixed (the batch says so: `_base_batch`)."""
    loss = BASE_MIX_LOSSES[base_cfg.mix_loss](head.loss, logits, y_a, y_b, lam, mixed,
                                               scale=head.loss_scale(base_cfg.dr_scale), weights=weights)
    if aux_logits is not None:
        loss = loss + mixed_loss(cross_entropy_loss, aux_logits, y_a, y_b, lam, scale=base_cfg.backbone_ce)
    return loss


def not_learning(epoch_losses: list[float]) -> bool:
    """True when a base training of two or more epochs ends with its mean epoch loss not below the first epoch's: an
    update that rose (a too-high lr) or a model that stopped learning, which would otherwise be written as a result.
    Every later epoch is at most as hard as the first (same or less augmentation, the last ones often unmixed)."""
    return len(epoch_losses) >= 2 and not epoch_losses[-1] < epoch_losses[0]


class BasePlan(NamedTuple):
    """How base training walks the images: `passes` seeded passes, each over base.repeat copies of the images
    (`rows` of them, padded to whole device groups when the last batch is kept), in `steps` batches of
    base.batch_size, the last one smaller unless base.drop_last; `groups` device groups in a batch
    (base.batch_size / base.device_batch, or 1); `images` the rows a pass trains on (fewer than `rows` under
    drop_last)."""

    passes: int
    steps: int
    rows: int
    groups: int
    images: int

    @property
    def total_steps(self) -> int:
        return self.passes * self.steps


def base_plan(base_cfg, images: int) -> BasePlan:
    """The plan of base.epochs over `images` training images (`BasePlan`)."""
    groups = base_cfg.batch_size // base_cfg.device_batch if base_cfg.device_batch else 1
    rows = base_cfg.repeat * images
    if base_cfg.drop_last:
        steps = rows // base_cfg.batch_size
    else:  # the authors' sampler: every row once, padded (with the first rows of the pass) to whole groups
        rows = -(-rows // groups) * groups
        steps = -(-rows // base_cfg.batch_size)
    return BasePlan(base_cfg.epochs // base_cfg.repeat, steps, rows, groups, min(steps * base_cfg.batch_size, rows))


class BaseRun(NamedTuple):
    """What the base session's steps work with: the model (and its DDP wrapper `net`), the auxiliary CE head, the
    optimizer, the training images and labels on the device, this process's group, the plan of the passes."""

    model: FSCILModel
    net: nn.Module
    aux_head: nn.Linear | None
    opt: SGD
    images: torch.Tensor
    extents: torch.Tensor | None
    targets: torch.Tensor
    group: object
    plan: BasePlan
    preset: object
    num_base: int


def _check_plan(plan: BasePlan, base_cfg, world: int) -> None:
    """Every batch must split into equal process slices of whole device groups."""
    last = plan.rows - (plan.steps - 1) * base_cfg.batch_size
    if plan.groups % world and plan.groups > 1:
        raise FSCILError(f"params: base.device_batch makes {plan.groups} device groups a batch, which do not split "
                         f"over {world} processes")
    if last % world:
        raise FSCILError(f"params: the last batch of each pass has {last} rows, which do not split over {world} "
                         "processes (set base.drop_last true or change base.batch_size)")


def base_run(cfg, pack: ImagePack, device, group) -> BaseRun:
    """The model for eq. optim_base (backbone, p_iden and g_base train; g_inc waits for session 1), wrapped in DDP
    under torchrun with global BatchNorm (or BatchNorm per device group: base.device_batch), its optimizer, and the
    base session's images on the device."""
    protocol = pack.protocol
    preset = get_preset(pack.preset, pack.image_size)
    train_ids = np.asarray(protocol.sessions[0].train_ids)
    num_base = len(protocol.sessions[0].classes)
    if cfg.base.batch_size > len(train_ids):
        raise FSCILError(f"params: base.batch_size {cfg.base.batch_size} exceeds the {len(train_ids)} base training "
                         "images")
    group.local_slice(cfg.base.batch_size)  # the global batch splits evenly, or a one-line error
    plan = base_plan(cfg.base, len(train_ids))
    _check_plan(plan, cfg.base, group.world_size)
    model = build_model(cfg.model, head_classes(cfg, protocol), preset.input_size, seed=cfg.seed).to(device)
    memory_format(model.backbone, cfg.precision)
    model.backbone.freeze_for_base_training()
    if model.projector.g_inc is not None:
        model.projector.g_inc.requires_grad_(False)  # trained from session 1 on
    aux_head = backbone_ce_head(model, num_base, cfg.base.backbone_ce)
    net: nn.Module = _BaseNet(model, num_base, aux_head)
    if plan.groups > 1:  # each process holds whole device groups: their statistics need no communication
        convert_device_batchnorm(model, plan.groups // group.world_size)
    elif group.world_size > 1:
        convert_global_batchnorm(model)
    if group.world_size > 1:
        net = nn.parallel.DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    images, extents = load_base_train_images(pack, train_ids, device)
    targets = torch.from_numpy(pack.labels)[train_ids].to(device)
    return BaseRun(model, net, aux_head, _optimizer(model, aux_head, cfg), images, extents, targets, group, plan,
                   preset, num_base)


def base_step(cfg, run: BaseRun, head, batch: tuple) -> torch.Tensor:
    """One update of eq. optim_base on a global batch (x, y_a, y_b, lam); returns (the global-batch loss: the mean of
    the equal slices' means, the same on every process; the batch's images whose arg-max is their dominant target)
    as a device tensor: nothing waits for the device here."""
    x, y_a, y_b, lam, mixed = batch
    local = run.group.local_slice(len(x))
    weights = target_weights(cfg.base.dr_weighting, y_a, y_b, run.num_base)  # over the global batch
    with autocast(x.device, cfg.precision):  # params precision: bf16 in the fast profile
        logits = run.net(image_layout(x[local], cfg.precision))
    loss = base_loss(head, cfg.base, *(t.float() if t is not None else None for t in logits), y_a[local], y_b[local],
                     lam[local], mixed, None if weights is None else (weights[0][local], weights[1][local]))
    dominant = torch.where(lam[local] >= 0.5, y_a[local], y_b[local])  # the larger share of a mixed image
    correct = (logits[0].detach().argmax(dim=1) == dominant).sum().float()
    loss_sum, correct = all_reduce_sum(torch.stack([loss.detach(), correct]), run.group)  # one collective a step
    run.opt.zero_grad(set_to_none=True)
    loss.backward()
    run.opt.step()
    return torch.stack([loss_sum / run.group.world_size, correct])


def read_losses(pending: list[torch.Tensor], epoch: int, done: int) -> list[list[float]]:
    """The last steps' (loss, correct) rows as floats (one wait for the device instead of one per step); stops at
    the first non-finite loss, naming its step. `done`: steps of this epoch done so far. Nothing is written after a
    stop, so the updates since that step never reach a checkpoint."""
    values, bad = drain(pending, done)
    if bad is not None:
        raise TrainingDiverged(f"base training: non-finite loss at epoch {epoch + 1} step {bad}; nothing written")
    return values


def pass_order(cfg, plan: BasePlan, images: int, p: int, device) -> torch.Tensor:
    """The row order of pass `p`: a permutation seeded by (seed, p) of base.repeat copies of the images (the
    authors' RepeatDataset), padded with its first rows to `plan.rows` (their sampler's round-up)."""
    order = torch.randperm(cfg.base.repeat * images, generator=seeded_generator(cfg.seed, BASE_EPOCH_ORDER + p))
    if cfg.base.repeat > 1:
        order = order % images
    if plan.rows > len(order):
        order = torch.cat([order, order[:plan.rows - len(order)]])
    return order.to(device)


def train_epoch(cfg, run: BaseRun, p: int, device, show_progress: bool) -> tuple[float, float]:
    """Pass `p` of eq. optim_base (base.repeat epochs; one epoch unless base.repeat) over `pass_order`; the mean of
    its global-batch losses, read back every CHECK_EVERY steps (a non-finite one stops the run, nothing written), and
    the training accuracy of its batches (%, against each image's dominant target)."""
    batch, head, plan, repeat = cfg.base.batch_size, HEADS[cfg.model.classifier], run.plan, cfg.base.repeat
    run.net.train()
    order = pass_order(cfg, plan, len(run.images), p, device)
    bar = tqdm(range(plan.steps), desc=f"base epoch {(p + 1) * repeat}/{cfg.base.epochs}", leave=False,
               disable=None if show_progress and run.group.is_main else True)  # None: bars on a terminal only
    pending: list[torch.Tensor] = []
    losses: list[float] = []
    correct, seen = 0.0, 0
    for i in bar:
        step = p * plan.steps + i
        epoch = p * repeat + i * repeat // plan.steps  # the epoch this step belongs to
        set_lr(run.opt, BASE_SCHEDULES[cfg.base.schedule](cfg.base, step, plan.total_steps, epoch))
        idx = order[i * batch:(i + 1) * batch]
        gen = seeded_generator(cfg.seed, BASE_STEP_AUGMENT + step, device)
        # Mixup/CutMix decide on the host (whether, which, lambda, the box): from a CPU generator on a GPU, so no
        # step waits for the device; on the CPU from the augmentation's generator, as always
        host_gen = None if gen.device.type == "cpu" else seeded_generator(cfg.seed, BASE_STEP_MIX + step)
        extents = None if run.extents is None else run.extents[idx]
        seen += len(idx)
        pending.append(base_step(cfg, run, head, _base_batch(run.images[idx], run.targets[idx], run.num_base,
                                                             run.preset, cfg.base, epoch, gen, host_gen,
                                                             plan.groups, extents)))
        if len(pending) == CHECK_EVERY or i + 1 == plan.steps:
            rows = read_losses(pending, epoch, i + 1)
            losses += [loss for loss, _ in rows]
            correct += sum(c for _, c in rows)
            bar.set_postfix(loss=f"{sum(losses) / len(losses):.4f}")
    return round(sum(losses) / max(plan.steps, 1), 6), round(100.0 * correct / max(seen, 1), 4)


def finish_base(cfg, run: BaseRun, pack: ImagePack, device, history: list[float], out_dir: Path | None,
                started: float, durations: list[float] | None = None) -> dict:
    """After the last epoch (history: each pass's mean loss): the not-learning check (on a whole schedule only),
    precise BatchNorm when asked, and on the main process the base-class test accuracy and the written model
    (model.safetensors + metrics.json). durations: the seconds of each pass run in this process: the median
    images per second is reported, and the median seconds an epoch takes after the first pass (its one-time
    start-up costs: cuDNN autotuning, kernel compilation) where there are more."""
    epochs = len(history) * cfg.base.repeat  # base.epochs, or fewer under train_base's epoch_limit
    if epochs == cfg.base.epochs and not_learning(history):
        raise TrainingDiverged(f"base training: the mean loss of the last epoch ({history[-1]:.4g}) is not below "
                               f"the first epoch's ({history[0]:.4g}); nothing written (lower base.lr)")
    recalibrated = 0
    if cfg.base.precise_bn:  # every process measures all images: the same statistics everywhere
        size = cfg.base.eval_batch_size
        recalibrated = recalibrate_batchnorm(
            run.model.backbone, run.model.backbone.trained_batchnorms(),
            lambda: (test_transform(run.images[i:i + size], run.preset,
                                    None if run.extents is None else run.extents[i:i + size])
                     for i in range(0, len(run.images), size)))
    if not run.group.is_main:
        return {}
    protocol = pack.protocol
    test_ids = protocol.test_ids_seen(0, pack.labels)
    pred = evaluate_images(run.model, pack, test_ids, run.num_base, run.preset, device, cfg.base.eval_batch_size)
    result = {"session": 0, **session_metrics(pred, pack.labels[test_ids], run.num_base, run.num_base),
              "preset": cfg.preset, "projector": cfg.model.projector, "train_loss": history,
              "epochs": epochs, "steps": len(history) * run.plan.steps,
              "world_size": run.group.world_size, "precise_bn_layers": recalibrated,
              "num_sessions": len(protocol.sessions), "seconds": round(time.time() - started, 2),
              "images_per_second": round(float(np.median([run.plan.images / d for d in durations])), 1)
              if durations else None,
              "seconds_per_epoch": round(float(np.median(durations[1:] or durations)) / cfg.base.repeat, 3)
              if durations else None}
    _write_base_model(Path(out_dir), run.model, cfg, pack, run.preset.input_size, result)
    return result


def train_base(cfg, pack_path: Path, out_dir: Path | None, checkpoint_dir: Path, *,
               stop_after_epoch: int | None = None, epoch_limit: int | None = None, show_progress: bool = True,
               curve: Path | None = None) -> dict:
    """Train the base session; the main process writes `out_dir`/model.safetensors + metrics.json.

    checkpoint_dir: where the periodic resumable checkpoint lives (outside the atomic output, so a killed run
    resumes from it). stop_after_epoch: end early after that epoch (to test resumption); returns {} then.
    epoch_limit: train the first epoch_limit epochs of the configured schedule (whole passes of base.repeat), then
    finish and write the model as after the last (what `fscil speed --base-epochs` times: the preset's own lr
    schedule, batches and checkpoints, cut short). curve: the CSV of loss, lr and training accuracy per epoch,
    rewritten after each (`pipeline.training.curves`).
    """
    device = run_device(cfg)
    group = init_process_group(device)
    started = time.time()
    with ImagePack.open(pack_path) as pack:
        run = base_run(cfg, pack, device, group)
        meta = {"kind": "base-resume", "config": config_digest(cfg), "data": pack.content_hash}
        ckpt = Path(checkpoint_dir) / RESUME_FILE
        start_epoch, rows = resume_point(ckpt, meta, run.model, run.aux_head, run.opt)
        repeat = cfg.base.repeat
        passes = run.plan.passes if epoch_limit is None else min(run.plan.passes, -(-epoch_limit // repeat))
        progress = ProgressLog("base", passes * repeat, "epoch", start=start_epoch, enabled=group.is_main)
        durations: list[float] = []  # seconds of each pass run here
        for p in range(start_epoch // repeat, passes):
            epoch_started = time.perf_counter()
            loss, accuracy = train_epoch(cfg, run, p, device, show_progress)
            done = (p + 1) * repeat
            lr = run.opt.param_groups[0]["lr"]  # group 0: base.lr's parameters (unscaled), under the schedule
            rows.append({"epoch": done, "loss": loss, "lr": lr, "train_acc": accuracy})
            if group.is_main:
                write_curve(curve, BASE_COLUMNS, rows)
            durations.append(max(time.perf_counter() - epoch_started, 1e-9))
            rate = run.plan.images / durations[-1]
            progress.update(done, loss=f"{loss:.4f}", lr=f"{lr:.4g}",
                            **{"img/s": f"{rate:.0f}"})
            if group.is_main and (done % cfg.base.checkpoint_every == 0 or done == cfg.base.epochs):
                save_resume_point(run, ckpt, meta, done, rows)
            barrier(group)
            if stop_after_epoch is not None and done >= stop_after_epoch:
                return {}
        result = finish_base(cfg, run, pack, device, [row["loss"] for row in rows], out_dir, started, durations)
        barrier(group)
    cleanup(group)
    return result


def base_stage(cfg, pack_path: Path, out_dir: Path, resume_dir: Path, show_progress: bool = True,
               curve: Path | None = None, epoch_limit: int | None = None) -> dict:
    """Base training into out_dir/{model.safetensors, metrics.json}; its resume point lives in resume_dir until it
    finishes, its curve (when given) is written as it trains. Under torchrun every process trains, only rank 0
    writes. epoch_limit: see train_base."""
    if not is_launch_main():
        return train_base(cfg, pack_path, None, resume_dir, show_progress=False, epoch_limit=epoch_limit)
    with atomic_output(out_dir, directory=True) as tmp:
        result = train_base(cfg, pack_path, tmp, resume_dir, show_progress=show_progress, curve=curve,
                            epoch_limit=epoch_limit)
    shutil.rmtree(resume_dir, ignore_errors=True)  # finished: nothing left to resume
    return result
