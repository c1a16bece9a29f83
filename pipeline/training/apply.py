"""Apply a trained model: the network as it stands after session N (the frozen backbone, the projector with that
session's g_inc, the ETF head over the N sessions' classes), exported to one self-contained safetensors file, and the
class of new images under the test-time preprocessing (the pack's resize and crop, then the test transform)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.config.sections import ModelConfig
from pipeline.data.augment import test_transform
from pipeline.data.class_folder import IMAGE_SUFFIXES
from pipeline.data.pack import ImagePack
from pipeline.data.presets import get_preset
from pipeline.data.source import decode_rgb, fit_shorter_side, fit_square
from pipeline.errors import FSCILError
from pipeline.models.classifier import Head
from pipeline.models.fscil import FSCILModel, build_model
from pipeline.models.registry import HEADS
from pipeline.store.feature_store import FeatureStore
from pipeline.store.memory import ClassMemory
from pipeline.training.base_model import config_digest, config_stamp, load_base_model
from pipeline.training.checkpoint import load_checkpoint, prefixed, read_metadata, save_checkpoint, unprefixed
from pipeline.training.incremental_session import SECTIONS, STATE_FILE, load_session_state, session_rerun
from pipeline.training.learn import LearnState

EXPORT_KIND = "fscil-export"


@dataclass
class TrainedModel:
    model: FSCILModel
    session: int
    num_seen: int
    class_names: list[str]
    """The names of the seen classes, in class-id order (the logits' order)."""
    preset: str
    """The image preset (normalisation) the images were trained under, at `image_size`."""
    image_size: int
    meta: dict
    learn: LearnState | None = None
    """What a further session needs (`fscil learn`): the run's values and the class memory; None in a file
    exported before `fscil learn` existed."""

    @property
    def mode(self) -> str:
        return "base" if self.session == 0 else "incremental"

    @property
    def head(self) -> Head:
        return HEADS[self.meta["model"]["classifier"]]

    @property
    def num_base(self) -> int | None:
        """The base session's classes (class ids 0..num_base-1); None for a file exported before it was recorded
        and holding no class memory to tell."""
        if "num_base" in self.meta:
            return int(self.meta["num_base"])
        if self.session == 0:
            return self.num_seen
        if self.learn is not None:
            return len(np.unique(self.learn.base_classes))
        return None


def load_session_model(cfg, base_dir: Path, pack_path: Path, sessions_dir: Path, session: int,
                       store_path: Path | None = None) -> TrainedModel:
    """The model of session `session` (0: the base model) of the run `cfg` describes, from the stage outputs; a
    checkpoint made by other params is refused. With `store_path` (the feature store), also what a further session
    needs (`LearnState`: `fscil learn`, and exports that learn)."""
    model, base_meta, base_sha = load_base_model(cfg, base_dir)
    if not Path(pack_path).is_file():
        raise FSCILError(f"{pack_path}: image pack not found (its class names are needed); run `fscil stage prepare`")
    with ImagePack.open(pack_path) as pack:
        names, num_sessions = list(pack.class_names), len(pack.protocol.sessions)
        num_base = len(pack.protocol.sessions[0].classes)
    if not 0 <= session < num_sessions:
        raise FSCILError(f"--session {session}: this run has sessions 0 (base) to {num_sessions - 1}")
    num_seen, meta, state = num_base, {"config": config_digest(cfg)}, None
    if session > 0:
        path = Path(sessions_dir) / f"session_{session}" / STATE_FILE
        if not path.is_file():
            raise FSCILError(f"{path}: session {session} has not run; run `fscil stage incremental --session "
                             f"{session}` (or dvc repro)")
        state, meta = load_checkpoint(path, {"kind": "session", "session": session, **config_stamp(cfg, SECTIONS)},
                                      session_rerun(session))
        load_session_state(model.projector, model.classifier, state, cfg, session)
        num_seen = int(meta["num_seen"])
    learn = None if store_path is None else learn_state(cfg, store_path, session, state, base_meta, base_sha)
    return TrainedModel(model.eval(), session, num_seen, names[:num_seen], base_meta["preset"],
                        int(base_meta["input_size"]), {"model": dataclasses.asdict(cfg.model), **meta,
                                                       "num_classes": int(base_meta["num_classes"]),
                                                       "num_base": num_base}, learn)


def learn_state(cfg, store_path: Path, session: int, state: dict | None, base_meta: dict, base_sha: str
                ) -> LearnState:
    """The run's `LearnState` after session `session`: the store's base memory (the store must be this base
    model's), the session state's memory, the stored shots of sessions 1..session."""
    if not Path(store_path).exists():
        raise FSCILError(f"{store_path}: feature store not found (its class memory is needed); run `fscil stage "
                         "extract` (or dvc repro)")
    store = FeatureStore.open(store_path, pack_hash=base_meta["data"], checkpoint_sha256=base_sha)
    base_maps, base_classes = store.base_memory()
    memory = ClassMemory.empty(store.map_shape) if state is None else ClassMemory.from_tensors(state)
    shots, shot_labels = store.shots_before(session + 1)
    deviations = store.base_deviations() if cfg.incremental.deviation_prob > 0 else None
    return LearnState({**cfg.to_dict(), "sessions": cfg.sessions}, base_maps, base_classes, memory, shots,
                      shot_labels, deviations)


def export_model(trained: TrainedModel, path: Path, code_version: str) -> None:
    """One safetensors file holding every tensor of the session's model and what `load_exported` needs: the model
    section, classes seen (names), image preset and size, session, config digest and the code version; and, where the
    model holds one, its `LearnState` (tensors `learn.*`, meta `run`: what `fscil learn` needs for a next session)."""
    model_cfg = {**trained.meta["model"], "pretrained": None, "pretrained_sha256": None}  # the weights are here
    tensors = prefixed(trained.model.state_dict(), "model")
    extra = {}
    if trained.learn is not None:  # what `fscil learn` needs for a further session
        tensors.update(trained.learn.to_tensors())
        extra["run"] = trained.learn.run
    save_checkpoint(path, tensors, {
        "kind": EXPORT_KIND, "session": trained.session, "num_seen": trained.num_seen,
        "num_classes": trained.meta["num_classes"], "class_names": trained.class_names, "model": model_cfg,
        **({} if trained.num_base is None else {"num_base": trained.num_base}),
        "preset": trained.preset, "image_size": trained.image_size, "config": trained.meta["config"],
        "code_version": code_version, **extra})


def is_export(path: Path) -> bool:
    """A file `export_model` wrote."""
    try:
        return read_metadata(path).get("kind") == EXPORT_KIND
    except FSCILError:
        return False


PREDICTION_COLUMNS = ("path", "class_id", "class")  # then the head's score column and "skipped"


def prediction_columns(trained: TrainedModel) -> list[str]:
    """The columns of `fscil predict`'s table."""
    return [*PREDICTION_COLUMNS, trained.head.score, "skipped"]


def is_prediction_csv(path: Path) -> bool:
    """A CSV `fscil predict` wrote (its header)."""
    try:
        with open(path, errors="replace") as fh:
            return fh.readline().startswith(",".join(PREDICTION_COLUMNS) + ",")
    except OSError:
        return False


def load_exported(path: Path) -> TrainedModel:
    """A file written by `export_model`; anything else (another checkpoint, a corrupt file) is a one-line error."""
    tensors, meta = load_checkpoint(path)
    if meta.get("kind") != EXPORT_KIND:
        raise FSCILError(f"{path}: not an exported model (kind {meta.get('kind')!r}); write one with `fscil export`")
    model_cfg = ModelConfig.from_dict(meta["model"])
    model = build_model(model_cfg, int(meta["num_classes"]), int(meta["image_size"]))
    model.projector.set_sessions(int(meta["session"]))
    try:
        model.load_state_dict(unprefixed(tensors, "model"))
    except RuntimeError as err:
        raise FSCILError(f"{path}: its tensors do not fit its model section ({str(err).splitlines()[0]})") from None
    return TrainedModel(model.eval(), int(meta["session"]), int(meta["num_seen"]), list(meta["class_names"]),
                        meta["preset"], int(meta["image_size"]), meta, LearnState.from_tensors(tensors,
                                                                                                meta.get("run")))


def image_files(inputs: list[Path]) -> list[Path]:
    """Image files among `inputs` (files, or folders searched recursively, sorted); none is a one-line error."""
    files: list[Path] = []
    for item in inputs:
        if Path(item).is_dir():
            for dirpath, dirnames, names in os.walk(item):
                dirnames.sort()
                files += [Path(dirpath) / n for n in sorted(names)
                          if not n.startswith(".") and Path(n).suffix.lower() in IMAGE_SUFFIXES]
        elif Path(item).is_file():
            files.append(Path(item))
        else:
            raise FSCILError(f"{item}: no such file or folder")
    if not files:
        raise FSCILError(f"no image files in {', '.join(map(str, inputs))}")
    unique: dict[Path, Path] = {}  # a file given directly and inside a folder is predicted once
    for f in files:
        unique.setdefault(f.resolve(), f)
    return list(unique.values())


@torch.no_grad()
def predict_arrays(trained: TrainedModel, images: np.ndarray, device: torch.device, batch_size: int = 256,
                   extents: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """images (N, S, S, 3) uint8 as the model's pack stores them (extents: the shorter_side view's, else None) ->
    (class ids, their scores: the cosine to the class's ETF vertex, or a linear head's softmax probability)."""
    preset = get_preset(trained.preset, trained.image_size)
    model = trained.model.to(device)
    ids, scores = [], []
    for start in range(0, len(images), batch_size):
        part = None if extents is None else torch.from_numpy(extents[start:start + batch_size]).to(device)
        x = test_transform(torch.from_numpy(images[start:start + batch_size]).to(device), preset, part)
        score, idx = trained.head.confidence(model(x, trained.num_seen, mode=trained.mode).float()).max(dim=1)
        ids.append(idx.cpu())
        scores.append(score.cpu())
    return torch.cat(ids).numpy(), torch.cat(scores).numpy()


def predict_files(trained: TrainedModel, files: list[Path], device: torch.device) -> list[dict]:
    """One row per file: path, class id, class name, its score (column `cosine` or `probability`:
    `TrainedModel.head.score`) and `skipped` (empty, or why the file was not predicted: unreadable or not an image).
    The readable files are predicted whatever the others are; none readable is a one-line error."""
    images, extents, skipped = decode_images(trained, files)
    if images is None:
        first = next(iter(skipped.values()))
        raise FSCILError(f"none of the {len(files)} files could be read as an image (first: {first})")
    ids, scores = predict_arrays(trained, images, device, extents=extents)
    done = {f: (int(i), float(s)) for f, i, s in zip([f for f in files if f not in skipped], ids, scores,
                                                     strict=True)}
    columns = prediction_columns(trained)
    return [dict(zip(columns, (str(f), done[f][0], trained.class_names[done[f][0]], round(done[f][1], 6), "")
                     if f in done else (str(f), None, None, None, skipped[f]), strict=True)) for f in files]


def decode_images(trained: TrainedModel, files: list[Path]) -> tuple[np.ndarray | None, np.ndarray | None, dict]:
    """The readable files as the model's pack stores images (any mode converted to RGB, resized as the preset
    says): (images (N, S, S, 3) uint8 or None when none is readable, their extents (shorter_side view) or None,
    {unreadable file: why})."""
    preset = get_preset(trained.preset, trained.image_size)
    loaded, skipped = {}, {}
    for f in files:
        try:
            img = decode_rgb(f)
        except FSCILError as err:
            skipped[f] = str(err)
            continue
        if preset.view == "shorter_side":  # as the pack stores them: whole, on a canvas, with their extents
            loaded[f] = fit_shorter_side(img, preset.test_resize, preset.canvas)
        else:
            loaded[f] = (fit_square(img, trained.image_size), None)
    if not loaded:
        return None, None, skipped
    images = np.stack([image for image, _ in loaded.values()])
    extents = None if preset.view != "shorter_side" else np.array([size for _, size in loaded.values()])
    return images, extents, skipped


def describe(trained: TrainedModel) -> str:
    return (f"session {trained.session}: {trained.num_seen} classes, {trained.meta['model']['projector']} projector, "
            f"{trained.preset} images at {trained.image_size} px")
