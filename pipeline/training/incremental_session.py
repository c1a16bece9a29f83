"""Incremental session s >= 1 (paper eq. optim_inc) on cached backbone maps only: never images, never the backbone.

The training set is the session's shots (+ stored augmented views), each earlier novel class's memory prototype
repeated `copy` times and each base-class prototype repeated `base_copy` times (eq. batch_split: the base group
is the base prototypes, the novel group everything else); with incremental.deviation_prob, novel rows of a batch
are trained with a stored base deviation added (ours). A fresh SGD per session with linear warm-up and cosine
decay; batches are shuffled by a seeded permutation, drop_last, cycled for the session's step count. After
training: evaluation on every test map of the classes seen so far, and the new classes' means join the memory.
"""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from tqdm import tqdm

from pipeline.atomic import atomic_output
from pipeline.data.mixing import lend_deviations
from pipeline.errors import FSCILError, TrainingDiverged
from pipeline.file_digest import file_digest
from pipeline.models.fscil import build_head
from pipeline.models.registry import HEADS
from pipeline.seeding import DEVIATION, MEMORY, SESSION, seeded_generator
from pipeline.store.feature_store import FeatureStore
from pipeline.store.memory import ClassMemory
from pipeline.training.base_model import BASE_RERUN, MODEL_FILE, config_stamp
from pipeline.training.checkpoint import load_checkpoint, prefixed, save_checkpoint, unprefixed, write_metrics
from pipeline.training.curves import write_session_curves
from pipeline.training.diagnostics import session_diagnostics
from pipeline.training.evaluate import session_metrics
from pipeline.training.progress import CHECK_EVERY, ProgressLog
from pipeline.training.prototype import base_prototype_metrics, projected, prototype_metrics
from pipeline.training.registry import SCHEDULES
from pipeline.training.runtime import run_device
from pipeline.training.schedule import set_lr
from pipeline.training.session_step import SessionDraws, frozen_rows, read_back, session_batch, train_step
from pipeline.training.sgd import SGD

STATE_FILE = "state.safetensors"
METRICS_FILE = "metrics.json"
SECTIONS = ("data", "model", "base", "incremental")


def frozen_digest(projector) -> str:
    """sha256 over the frozen projector parts (p_iden, g_base for dual kinds), to prove they never change."""
    digest = hashlib.sha256()
    for module in projector.frozen_after_base():
        for name, tensor in sorted(module.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def base_parts_state(projector) -> dict:
    """{"p_iden.*", "g_base.*": tensor} of the parts frozen after the base session (what incremental.freeze_base
    false trains on and carries from session to session)."""
    frozen = projector.frozen_after_base()
    return {f"{name}.{key}": value for name, module in projector.named_children() if any(module is m for m in frozen)
            for key, value in module.state_dict().items()}


def session_param_groups(projector, trainable: list, inc) -> list[dict]:
    """SGD groups of a session: the parts the base session trained (p_iden, g_base; trainable only with freeze_base
    false) at inc.base_lr_scale * lr, everything else at lr."""
    base_ids = {id(p) for module in projector.frozen_after_base() for p in module.parameters()}
    base = [p for p in trainable if id(p) in base_ids]
    rest = [p for p in trainable if id(p) not in base_ids]
    return [{"params": params, "initial_lr": inc.lr * scale}
            for params, scale in ((rest, 1.0), (base, inc.base_lr_scale)) if params]


def memory_tag(store: FeatureStore) -> str:
    """The store's memory rule as recorded in session checkpoints ("mean:1", "sampled:4", ...)."""
    kind, k = store.memory_rule
    return f"{kind}:{k}"


def load_session_state(projector, classifier, state: dict, cfg, session: int) -> None:
    """Projector and classifier (built from the base model) as session `session` left them: its g_inc (the expanding
    baseline: one branch per session so far), its classifier and, where the base parts trained too, p_iden / g_base.
    The next session and `fscil predict` / `fscil export` start from this."""
    if not cfg.incremental.freeze_base:  # p_iden / g_base trained in the earlier sessions too
        projector.load_state_dict({**projector.state_dict(), **unprefixed(state, "projector")})
    projector.set_sessions(session)
    projector.adapting_branch.load_state_dict(unprefixed(state, "adapting"))
    classifier.load_state_dict(unprefixed(state, "classifier"))


def _check_session(session: int, num_sessions: int, prev_dir: Path | None) -> None:
    if not 1 <= session < num_sessions:
        raise FSCILError(f"session {session} is out of range: the protocol has sessions 1..{num_sessions - 1}")
    if session > 1 and (prev_dir is None or not (Path(prev_dir) / STATE_FILE).is_file()):
        raise FSCILError(f"session {session - 1} is not done ({prev_dir} has no {STATE_FILE}); "
                         f"run `fscil stage incremental --session {session - 1}` first")


def session_training_set(store: FeatureStore, session: int, fewshot: tuple, memory: ClassMemory,
                         base_maps: np.ndarray, base_classes: np.ndarray, inc) -> tuple[np.ndarray, ...]:
    """Session `session`'s training set (eq. batch_split): maps (N, C, H, W), labels (N,), is_base (N,) bool.

    fewshot: the session's (shots, labels, augmented views or None), as `store.fewshot(session)` gives them. Each
    earlier novel class is replayed `copy` times, by its memory (replay=mean: the paper's class-mean map, or what
    extract.memory keeps) or by its own stored shots (replay=shots, read from `store`); each base-class memory map is
    repeated `base_copy` times, the base group of the class-sensitive losses.
    """
    shots, shot_labels, views = fewshot
    parts = [(shots, shot_labels, False)] + [(v, shot_labels, False) for v in (views if views is not None else [])]
    if inc.copy and len(memory.classes):
        if inc.replay == "shots":
            replay_maps, replay_classes = store.shots_before(session)
        else:
            replay_maps, replay_classes = memory.maps, memory.classes
        parts.append((np.repeat(replay_maps, inc.copy, axis=0), np.repeat(replay_classes, inc.copy), False))
    base_copy = inc.session_value("base_copy", session)
    if base_copy:
        parts.append((np.repeat(base_maps, base_copy, axis=0), np.repeat(base_classes, base_copy), True))
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]).astype(np.int64),
            np.concatenate([np.full(len(p[1]), p[2]) for p in parts]))


ROSE_FACTOR = 1.5


@torch.no_grad()
def fit_loss(projector, classifier, x: torch.Tensor, y: torch.Tensor, num_seen: int, classifier_kind: str,
             inc, frozen: tuple[torch.Tensor, torch.Tensor] | None = None) -> float:
    """The classification term of eq. optim_inc over the whole session training set, without feature mixup: the
    model's own fit to the rows it trains on, the same measure before and after a session (batch losses are not:
    with mixup they alternate between clean and mixed batches, so their first step says little)."""
    head = HEADS[classifier_kind]
    scale = head.loss_scale(inc.dr_scale)
    modes = projector.training, classifier.training
    projector.eval()
    classifier.eval()
    total = 0.0
    for start in range(0, len(y), inc.eval_batch_size):
        part = slice(start, start + inc.eval_batch_size)
        mu = projector(x[part], mode="incremental", frozen=frozen_rows(frozen, part)).mu
        total += len(y[part]) * head.loss(classifier(mu, num_seen), y[part], scale=scale).item()
    projector.train(modes[0])
    classifier.train(modes[1])
    return total / max(1, len(y))


def loss_rose(before: float, after: float, factor: float = ROSE_FACTOR) -> bool:
    """True when a session ends with its fit loss (`fit_loss`) above `factor` times where it began, or non-finite:
    a session that ends far worse on its own training rows than the starting model has collapsed, even when every
    batch loss was finite."""
    return not math.isfinite(after) or after > factor * before


class SessionData(NamedTuple):
    """A session's training rows on the device (eq. batch_split) and what evaluation and the memory need of it."""

    x: torch.Tensor  # (N, C, H, W) maps
    y: torch.Tensor  # (N,) labels
    is_base: torch.Tensor  # (N,) bool: the base group of the class-sensitive losses
    shots: np.ndarray  # the session's own shots and their labels (the memory's new rows)
    shot_labels: np.ndarray
    num_seen: int  # classes seen after this session


def session_rerun(session: int) -> str:
    """What to run when session `session`'s state was made with other params."""
    return (f"run sessions 1 to {session} with these params first (`fscil stage incremental --session N`, or "
            "`dvc repro`)")


def start_session(cfg, session: int, store: FeatureStore, tensors: dict, num_classes: int, prev_dir: Path | None
                  ) -> tuple:
    """Projector, classifier and memory as session `session` starts: the base model, then the previous session's
    state (its g_inc, classifier and memory; it must come from this config, base checkpoint and memory rule), g_inc
    started from g_base under inc_init=base, p_iden / g_base frozen under freeze_base."""
    c, h, w = store.map_shape
    projector, classifier = build_head(cfg.model, c, (h, w), num_classes)
    projector.load_state_dict(unprefixed(tensors, "projector"))
    classifier.load_state_dict(unprefixed(tensors, "classifier"))
    memory = ClassMemory.empty(store.map_shape)
    if session > 1:
        state, _ = load_checkpoint(Path(prev_dir) / STATE_FILE, {
            "kind": "session", "session": session - 1, **config_stamp(cfg, SECTIONS),
            "store": store.attrs["checkpoint_sha256"], "memory": memory_tag(store)}, session_rerun(session - 1))
        load_session_state(projector, classifier, state, cfg, session - 1)
        projector.set_sessions(session)  # the expanding baseline: a new zero-gated branch, the earlier ones frozen
        memory = ClassMemory.from_tensors(state)
    elif cfg.incremental.inc_init == "base":
        if projector.g_inc is None:
            raise FSCILError(f"params: incremental.inc_init=base needs a projector with g_inc, "
                             f"not model.projector={cfg.model.projector}")
        projector.start_inc_from_base()
    if cfg.incremental.freeze_base:
        projector.freeze_base()
    return projector, classifier, memory


def session_data(store: FeatureStore, session: int, memory: ClassMemory, inc, device) -> SessionData:
    """Session `session`'s training set (`session_training_set`) on `device`."""
    fewshot = store.fewshot(session)
    shots, shot_labels, _ = fewshot
    base_maps, base_classes = store.base_memory()
    arrays = session_training_set(store, session, fewshot, memory, base_maps, base_classes, inc)
    x, y, is_base = (torch.from_numpy(a).to(device) for a in arrays)
    return SessionData(x, y, is_base, shots, shot_labels, int(shot_labels.max()) + 1)


def match_vertices(projector, classifier, data: SessionData, inc, device) -> dict:
    """incremental.vertex_match (ours): the free ETF vertices the new classes' features point to at the session's
    start (g_inc's gate is still zero); {"vertices": the columns the new classes took}, or {} when off."""
    if not inc.vertex_match:
        return {}
    first = int(data.shot_labels.min())
    mu = projected(projector, data.shots, "incremental", device, inc.eval_batch_size)
    perm = classifier.match_vertices(mu, torch.from_numpy(data.shot_labels), first)
    return {"vertices": perm[:data.num_seen - first]}


def fit_session(cfg, session: int, projector, classifier, data: SessionData, store: FeatureStore, device,
                show_progress: bool, progress_lines: bool,
                curves: dict[str, Path] | None = None) -> tuple[dict, dict]:
    """The session's SGD steps on eq. optim_inc (fresh SGD, warm-up and cosine, draws made ahead); returns the
    per-step loss history and the fit loss before and after, and stops a session whose fit got worse. curves: the
    CSVs of the loss terms and lr per step ({folder: file}), rewritten at each read-back (pipeline/training/curves)."""
    inc = cfg.incremental
    trainable = [p for p in projector.parameters() if p.requires_grad] + list(classifier.parameters())
    opt = SGD(session_param_groups(projector, trainable, inc), lr=inc.lr, momentum=inc.momentum,
              weight_decay=inc.weight_decay)
    steps = inc.session_value("steps", session)
    deviations, lent = lent_deviations(cfg, session, store, device)
    batch = session_batch(len(data.y), inc.batch_size, inc.loss_groups)
    draws = SessionDraws(seeded_generator(cfg.seed, SESSION * session), len(data.y), steps, batch, inc.mixup_prob,
                         device, lent, inc.loss_groups)
    projector.train()
    classifier.train()
    history = {"loss": [], "cls": [], "supp": [], "sep": []}
    # p_iden and g_base, when frozen, give each stored map the same output every step: computed once here (not with
    # lent deviations, which change the maps a step sees)
    frozen = projector.frozen_outputs(data.x, inc.eval_batch_size) if deviations is None else None
    fit = {"before": fit_loss(projector, classifier, data.x, data.y, data.num_seen, cfg.model.classifier, inc, frozen)}
    pending: list[torch.Tensor] = []
    lrs: list[float] = []
    bar = tqdm(range(steps), desc=f"session {session}", leave=False, disable=None if show_progress else True)
    progress = ProgressLog(f"session {session}", steps, "step", enabled=progress_lines)
    for step in bar:
        idx, mix_perm, lent_draws = draws.step(step)
        lrs.append(SCHEDULES[inc.schedule](inc, step, steps))
        set_lr(opt, lrs[-1])
        x = data.x[idx] if deviations is None else lend_deviations(data.x[idx], data.is_base[idx], deviations,
                                                                   lent_draws)
        pending.append(train_step(projector, classifier, opt, trainable, (x, data.y[idx], data.is_base[idx]),
                                  data.num_seen, cfg.model.classifier, inc, mix_perm, frozen_rows(frozen, idx),
                                  cfg.precision))
        if len(pending) == CHECK_EVERY or step + 1 == steps:  # the only read-back: every CHECK_EVERY steps
            read_back(pending, history, session, step + 1)
            if curves is not None:
                write_session_curves(curves, [{"step": i + 1, "lr": inc.lr * factor,
                                               **{k: v[i] for k, v in history.items()}}
                                              for i, factor in enumerate(lrs)])
            bar.set_postfix(loss=f"{history['loss'][-1]:.4f}")
            progress.update(step + 1, loss=f"{history['loss'][-1]:.4f}")
    fit["after"] = fit_loss(projector, classifier, data.x, data.y, data.num_seen, cfg.model.classifier, inc, frozen)
    if loss_rose(fit["before"], fit["after"]):
        raise TrainingDiverged(f"session {session}: the classification loss on the session's training set went from "
                               f"{fit['before']:.3g} before training to {fit['after']:.3g} after; nothing written "
                               "(lower incremental.lr or lambda1, or set incremental.grad_clip_norm)")
    return history, fit


def lent_deviations(cfg, session: int, store: FeatureStore, device) -> tuple:
    """(the stored base deviations on `device`, (prob, count, their generator)) under incremental.deviation_prob
    (ours), else (None, None)."""
    if cfg.incremental.deviation_prob <= 0:
        return None, None
    stored = store.base_deviations()
    if stored is None:
        raise FSCILError(f"{store.path}: extracted without base deviations, which incremental.deviation_prob "
                         "needs; rerun `fscil stage extract` with extract.deviations > 0")
    deviations = torch.from_numpy(stored).to(device)
    # its own stream: the others are unchanged
    return deviations, (cfg.incremental.deviation_prob, len(deviations),
                        seeded_generator(cfg.seed, DEVIATION + session))


def evaluate_session(cfg, session: int, projector, classifier, store: FeatureStore, tensors: dict, num_seen: int,
                     device, out_dir: Path) -> dict:
    """One pass over the test maps: the session's accuracy and the diagnostics (analysis only: nothing reads them
    to choose anything), and the prototype baselines (session 1 also the base session's)."""
    num_base, batch = int(store.attrs["num_base"]), cfg.incremental.eval_batch_size
    diagnostics, pred, labels = session_diagnostics(projector, classifier, store, num_seen, num_base, device, batch,
                                                    out_dir)
    out = {**session_metrics(pred, labels, num_base, num_seen),
           "prototype": prototype_metrics(projector, store, session, num_seen, num_base, device, batch)}
    if session == 1:  # the base stage has no feature store: session 1 reports the base session's NCM baseline
        out["prototype_session0"] = base_prototype_metrics(cfg.model, tensors, store, device, batch)
    return {**out, "diagnostics": diagnostics}


def write_session_state(cfg, session: int, projector, classifier, memory: ClassMemory, data: SessionData,
                        store: FeatureStore, frozen_sha: str, out_dir: Path) -> None:
    """out_dir/state.safetensors: g_inc (and p_iden / g_base when they train), the classifier, and the memory with
    this session's classes added (eq. memory, or the rule the store was extracted with)."""
    kind, k = store.memory_rule
    memory = memory.added(data.shots, data.shot_labels, kind, k, seeded_generator(cfg.seed, MEMORY + session))
    state = prefixed(projector.adapting_branch.state_dict(), "adapting")
    if not cfg.incremental.freeze_base:
        state.update(prefixed(base_parts_state(projector), "projector"))
    state.update(prefixed(classifier.state_dict(), "classifier"))
    state.update(memory.to_tensors())
    save_checkpoint(out_dir / STATE_FILE, state, {
        "kind": "session", "session": session, **config_stamp(cfg, SECTIONS), "store": store.attrs["checkpoint_sha256"],
        "memory": memory_tag(store), "frozen_sha256": frozen_sha, "num_seen": data.num_seen,
    })


def train_session(cfg, session: int, store_path: Path, base_dir: Path, prev_dir: Path | None, out_dir: Path,
                  show_progress: bool = True, progress_lines: bool = True,
                  curves: dict[str, Path] | None = None) -> dict:
    """Train g_inc for one session and write out_dir/{state.safetensors, metrics.json}; returns the metrics.
    show_progress: a bar (a terminal); progress_lines: plain progress lines (logs, dvc repro)."""
    started = time.time()
    device = run_device(cfg)
    base_ckpt = Path(base_dir) / MODEL_FILE
    tensors, base_meta = load_checkpoint(base_ckpt, {"kind": "base-model", **config_stamp(cfg)}, BASE_RERUN)
    store = FeatureStore.open(store_path, pack_hash=base_meta["data"], checkpoint_sha256=file_digest(base_ckpt))
    _check_session(session, int(store.attrs["num_sessions"]), prev_dir)
    store.verify()  # every chunk readable and as written, before any training
    projector, classifier, memory = start_session(cfg, session, store, tensors, int(base_meta["num_classes"]),
                                                  prev_dir)
    frozen_before = frozen_digest(projector)
    projector.to(device)
    classifier.to(device)
    data = session_data(store, session, memory, cfg.incremental, device)
    vertices = match_vertices(projector, classifier, data, cfg.incremental, device)
    history, fit = fit_session(cfg, session, projector, classifier, data, store, device, show_progress,
                               progress_lines, curves)
    if cfg.incremental.freeze_base and frozen_digest(projector) != frozen_before:
        raise RuntimeError("frozen projector parts changed during an incremental session")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    evaluation = evaluate_session(cfg, session, projector, classifier, store, tensors, data.num_seen, device, out_dir)
    write_session_state(cfg, session, projector, classifier, memory, data, store, frozen_before, out_dir)
    steps = cfg.incremental.session_value("steps", session)
    result = {"session": session, "preset": cfg.preset, "variant": cfg.variant, "seed": cfg.seed,
              **{k: v for k, v in evaluation.items() if k not in ("prototype", "prototype_session0", "diagnostics")},
              "steps": steps, "train_samples": int(len(data.y)),
              "final_loss": history["loss"][-1] if steps else None, "history": history,
              "fit_loss": {k: round(v, 6) for k, v in fit.items()}, "frozen_sha256": frozen_before, **vertices,
              **{k: evaluation[k] for k in ("prototype", "prototype_session0") if k in evaluation},
              "diagnostics": evaluation["diagnostics"],
              "projector_parameters": sum(p.numel() for p in projector.parameters()),
              "seconds": round(time.time() - started, 2)}
    write_metrics(out_dir / METRICS_FILE, result)
    return result


def session_stage(cfg, session: int, store_path: Path, base_dir: Path, prev_dir: Path | None, out_dir: Path,
                  show_progress: bool = True, progress_lines: bool = True,
                  curves: dict[str, Path] | None = None) -> dict:
    """Incremental session `session` (g_inc trained on cached features) into out_dir, from session - 1's prev_dir;
    its curves (when given) written as it trains."""
    with atomic_output(out_dir, directory=True) as tmp:
        return train_session(cfg, session, store_path, base_dir, prev_dir, tmp, show_progress=show_progress,
                             progress_lines=progress_lines, curves=curves)
