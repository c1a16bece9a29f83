"""Teach a trained model the user's own classes (`fscil learn`): one incremental session on a class-folder tree, run
by the pipeline's own session code (`incremental_session`: the training set of eq. batch_split, the variant's
objective and schedule, g_inc only, the memory rule), on the frozen backbone's maps of the shots, computed as the
extract stage computes them. The model file carries what the next session needs (`LearnState`), so learns chain.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from pipeline.config.run import Config, config_from_values
from pipeline.data.augment import test_transform, train_augment
from pipeline.data.presets import get_preset
from pipeline.errors import FSCILError
from pipeline.models.classifier import LinearClassifier
from pipeline.models.fscil import FSCILModel
from pipeline.precision import autocast, image_layout, memory_format
from pipeline.seeding import EXTRACT_VIEW, MEMORY, seeded_generator
from pipeline.store.memory import ClassMemory
from pipeline.training.incremental_session import (
    SessionData,
    fit_session,
    frozen_digest,
    match_vertices,
    session_training_set,
)

PREFIX = "learn."


@dataclasses.dataclass
class LearnState:
    """What a later session needs beyond the network (a feature store's part, kept in the model file)."""

    run: dict
    """Every resolved value of the run (`Config.to_dict`): the session's objective, schedule, memory rule, seed."""
    base_maps: np.ndarray  # the base classes' memory (what extract stored: class means, or the rule's rows)
    base_classes: np.ndarray
    memory: ClassMemory  # the classes learned in sessions so far (eq. memory)
    shots: np.ndarray  # every session's shot maps and labels so far (incremental.replay shots)
    shot_labels: np.ndarray
    deviations: np.ndarray | None = None  # base deviations (incremental.deviation_prob), when the store kept them

    def config(self) -> Config:
        return config_from_values(self.run)

    def to_tensors(self) -> dict[str, torch.Tensor]:
        arrays = {"base_maps": self.base_maps, "base_classes": self.base_classes, "memory_maps": self.memory.maps,
                  "memory_classes": self.memory.classes, "shots": self.shots, "shot_labels": self.shot_labels}
        if self.deviations is not None:
            arrays["deviations"] = self.deviations
        return {PREFIX + k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], run: dict | None) -> LearnState | None:
        """The state in an exported file, or None where the file was written without it (before `fscil learn`)."""
        names = ("base_maps", "base_classes", "memory_maps", "memory_classes", "shots", "shot_labels")
        if run is None or any(PREFIX + k not in tensors for k in names):
            return None
        a = {k: tensors[PREFIX + k].numpy() for k in (*names, "deviations") if PREFIX + k in tensors}
        return cls(run, a["base_maps"], a["base_classes"], ClassMemory(a["memory_maps"], a["memory_classes"]),
                   a["shots"], a["shot_labels"], a.get("deviations"))


class _StateStore:
    """What the session code reads of a feature store, served from a `LearnState`."""

    def __init__(self, state: LearnState, source: str):
        self.state, self.path = state, source

    def shots_before(self, session: int) -> tuple[np.ndarray, np.ndarray]:
        return self.state.shots, self.state.shot_labels

    def base_deviations(self) -> np.ndarray | None:
        return self.state.deviations


@dataclasses.dataclass
class ClassFolders:
    """The user's classes: names (sorted folder names), and for each image its file and class (0-based here)."""

    names: list[str]
    files: list[Path]
    labels: np.ndarray
    skipped: dict[Path, str]


def read_class_folders(root: Path, known: list[str], decode: Callable[[list[Path]], tuple]) -> tuple:
    """The class folders under `root` checked before any work (each problem one line): folders of classes, each
    with at least one readable image, none a class the model knows. `decode(files)` -> (images, extents, skipped);
    returns (ClassFolders, images, extents)."""
    from pipeline.training.apply import image_files

    root = Path(root)
    if not root.is_dir():
        raise FSCILError(f"{root}: not a folder (give a folder with one sub-folder of images per class)")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise FSCILError(f"{root}: no class folders (one sub-folder per class, named by the class, images inside)")
    taken = sorted(set(known) & {p.name for p in folders})
    if taken:
        raise FSCILError(f"{root}: the model already knows class {taken[0]!r}"
                         + (f" (and {len(taken) - 1} more)" if len(taken) > 1 else "") + "; rename its folder")
    files, labels = [], []
    for index, folder in enumerate(folders):
        try:
            found = image_files([folder])
        except FSCILError:
            raise FSCILError(f"{folder}: class {folder.name!r} has no image files") from None
        files += found
        labels += [index] * len(found)
    images, extents, skipped = decode(files)
    kept = [f not in skipped for f in files]
    labels = np.asarray(labels)
    for index, folder in enumerate(folders):
        if not any(k for k, c in zip(kept, labels, strict=True) if c == index):
            first = next(skipped[f] for f, c in zip(files, labels, strict=True) if c == index)
            raise FSCILError(f"{folder}: class {folder.name!r} has no readable image ({first})")
    return (ClassFolders([p.name for p in folders], [f for f, k in zip(files, kept, strict=True) if k],
                         labels[np.asarray(kept)], skipped), images, extents)


def capacity(trained) -> int | None:
    """The classes the head has room for (the ETF's vertices), or None where it grows (a linear head)."""
    return None if trained.head.classifier is LinearClassifier else int(trained.meta["num_classes"])


def check_capacity(trained, new: int) -> None:
    room = capacity(trained)
    if room is not None and trained.num_seen + new > room:
        raise FSCILError(f"the model knows {trained.num_seen} classes and its ETF head has room for {room}: "
                         f"{new} new classes do not fit; train the base model with model.num_classes >= "
                         f"{trained.num_seen + new} for room (e.g. -S +model.num_classes={trained.num_seen + new})")


def session_config(cfg: Config, session: int) -> Config:
    """cfg for session `session`: per-session lists (incremental.steps, base_copy) past their end take their last
    value (a learned session may come after the protocol's)."""
    inc = cfg.incremental
    fixed = {key: [getattr(inc, key)[min(session, len(getattr(inc, key))) - 1]] for key in ("steps", "base_copy")
             if len(getattr(inc, key)) > 1}
    return dataclasses.replace(cfg, incremental=dataclasses.replace(inc, **fixed)) if fixed else cfg


def start_session(projector, classifier, previous: int, inc, num_seen: int, device, seed: int):
    """Projector and classifier as the pipeline starts a session after session `previous`
    (`incremental_session.start_session`); a linear head grown by rows to `num_seen` (the new rows drawn from
    `seed`). Returns the classifier."""
    if previous >= 1:
        projector.set_sessions(previous + 1)  # the expanding baseline: a new zero-gated branch
    elif inc.inc_init == "base":
        projector.start_inc_from_base()
    if inc.freeze_base:
        projector.freeze_base()
    if isinstance(classifier, LinearClassifier) and classifier.fc.out_features < num_seen:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            grown = LinearClassifier(classifier.fc.in_features, num_seen).to(device)
        grown.fc.weight.data[:classifier.fc.out_features] = classifier.fc.weight.data
        grown.fc.bias.data[:classifier.fc.out_features] = classifier.fc.bias.data
        return grown
    return classifier


@torch.no_grad()
def shot_maps(cfg: Config, backbone, preset, images: np.ndarray, extents: np.ndarray | None, device
              ) -> tuple[np.ndarray, np.ndarray | None]:
    """The frozen backbone's maps of the shots (test transform) and their extract.augmented_views seeded train-
    augmented views, in batches of extract.batch_size, as the extract stage computes them: ((n, C, H, W),
    (V, n, C, H, W) or None)."""
    size = cfg.extract.batch_size

    def maps(gen: torch.Generator | None) -> np.ndarray:
        out = []
        for start in range(0, len(images), size):
            x = torch.from_numpy(images[start:start + size]).to(device)
            part = None if extents is None else torch.from_numpy(extents[start:start + size]).to(device)
            x = test_transform(x, preset, part) if gen is None else train_augment(x, preset, gen, part)
            with autocast(device, cfg.precision):
                out.append(backbone(image_layout(x, cfg.precision)).float().cpu().numpy())
        return np.concatenate(out).astype(np.dtype(cfg.extract.dtype)).astype(np.float32)

    views = [maps(seeded_generator(cfg.seed, EXTRACT_VIEW + v, device)) for v in range(cfg.extract.augmented_views)]
    return maps(None), np.stack(views) if views else None


def learn_classes(trained, folder: Path, device: torch.device | str = "cpu", log: Callable[[str], None] = print,
                  progress_lines: bool = True):
    """`trained` (a `TrainedModel` holding a `LearnState`) after one more session on the class folders under
    `folder`: a new `TrainedModel` knowing their classes by their folder names. Every check runs before any work."""
    from pipeline.training.apply import TrainedModel, decode_images

    started = time.time()
    device = torch.device(device)
    state = trained.learn
    if state is None:
        raise FSCILError("this model file was written without the class memory a new session needs (before `fscil "
                         "learn`); export it again with `fscil export --session N`")
    classes, images, extents = read_class_folders(folder, trained.class_names,
                                                  lambda files: decode_images(trained, files))
    for path, why in classes.skipped.items():
        log(f"skipped {path}: {why}")
    new = len(classes.names)
    check_capacity(trained, new)
    session = trained.session + 1
    cfg = session_config(state.config(), session)
    inc = cfg.incremental
    model: FSCILModel = copy.deepcopy(trained.model).to(device)
    backbone, projector, classifier = memory_format(model.backbone.eval(), cfg.precision), model.projector, \
        model.classifier
    preset = get_preset(trained.preset, trained.image_size)
    maps, views = shot_maps(cfg, backbone, preset, images, extents, device)
    labels = (trained.num_seen + classes.labels).astype(np.int64)
    num_seen = trained.num_seen + new
    log(f"session {session}: {len(labels)} images of {new} new classes ({', '.join(classes.names)}), "
        f"{trained.num_seen} classes known")
    classifier = model.classifier = start_session(projector, classifier, trained.session, inc, num_seen, device,
                                                       cfg.seed + session)
    frozen_before = frozen_digest(projector)
    store = _StateStore(state, str(folder))
    arrays = session_training_set(store, session, (maps, labels, views), state.memory, state.base_maps,
                                  state.base_classes, inc)
    x, y, is_base = (torch.from_numpy(a).to(device) for a in arrays)
    data = SessionData(x, y, is_base, maps, labels, num_seen)
    match_vertices(projector, classifier, data, inc, device)
    fit_session(cfg, session, projector, classifier, data, store, device, show_progress=False,
                progress_lines=progress_lines)
    if inc.freeze_base and frozen_digest(projector) != frozen_before:
        raise RuntimeError("frozen projector parts changed during a learned session")
    kind, k = cfg.extract.memory_rule
    grown_state = dataclasses.replace(
        state, memory=state.memory.added(maps, labels, kind, k, seeded_generator(cfg.seed, MEMORY + session)),
        shots=np.concatenate([state.shots, maps]), shot_labels=np.concatenate([state.shot_labels, labels]))
    meta = {**trained.meta, "num_classes": max(num_seen, int(trained.meta["num_classes"])),
            "seconds": round(time.time() - started, 2)}
    return TrainedModel(model.cpu().eval(), session, num_seen, [*trained.class_names, *classes.names],
                        trained.preset, trained.image_size, meta, grown_state)
