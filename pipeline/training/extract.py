"""Fill the feature store from the frozen base backbone (eval mode, test-time transform).

Writes the maps of every test image, of every few-shot training image (plus optional augmented views), and the
class-mean maps of the base classes (the prototype baseline's), streaming batch by batch, the base classes'
memory by the extract.memory rule (eq. memory: the class means; or random / sampled training maps), and optionally
extract.deviations base training maps per class minus their class mean (their within-class spread).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from pipeline.atomic import atomic_output
from pipeline.data.augment import pack_batch, test_transform, train_augment
from pipeline.data.pack import ImagePack
from pipeline.data.presets import get_preset
from pipeline.precision import autocast, image_layout, memory_format
from pipeline.seeding import DEVIATION, EXTRACT_VIEW, MEMORY, seeded_generator
from pipeline.store.feature_store import FeatureStoreWriter
from pipeline.store.memory import drawn_rows
from pipeline.store.registry import MEMORY_RULES
from pipeline.training.base_model import load_base_model
from pipeline.training.distributed import (
    ProcessGroup,
    barrier,
    cleanup,
    gather_rows,
    init_process_group,
    is_launch_main,
)
from pipeline.training.progress import ProgressLog
from pipeline.training.runtime import run_device


def _batches(ids: np.ndarray, size: int):
    for start in range(0, len(ids), size):
        yield start, ids[start:start + size]


class _NoWriter:
    """What a process other than the main one writes under torchrun: nothing (it computes its part of each batch)."""

    def write(self, *args) -> None:
        pass

    write_view = write

    def finish(self) -> None:
        pass


class Extractor:
    """Maps of the frozen backbone written into the store, batch by batch, with one progress bar and line. Under
    torchrun each process runs the backbone on its part of every batch (the batch and its augmentation draws are
    the same everywhere) and the main process writes the gathered maps."""

    def __init__(self, cfg, pack: ImagePack, backbone, preset, device, writer: FeatureStoreWriter | _NoWriter,
                 total: int, show_progress: bool, progress_lines: bool, group: ProcessGroup | None = None):
        self.cfg, self.pack, self.backbone, self.preset, self.device, self.writer = (cfg, pack, backbone, preset,
                                                                                     device, writer)
        self.group = group or ProcessGroup()
        self.size, self.dtype = cfg.extract.batch_size, np.dtype(cfg.extract.dtype)
        main = self.group.is_main
        self.bar = tqdm(total=total, desc="extract", unit="img", disable=None if show_progress and main else True)
        self.progress = ProgressLog("extract", total, "image", enabled=progress_lines and main)

    def maps_of(self, ids: np.ndarray, gen: torch.Generator | None = None) -> np.ndarray:
        """Backbone maps (float32) of images `ids`, test transform (or the train augmentation drawn from `gen`)."""
        images, extents = pack_batch(self.pack, ids, self.device)
        x = test_transform(images, self.preset, extents) if gen is None else train_augment(images, self.preset, gen,
                                                                                            extents)
        with autocast(self.device, self.cfg.precision):  # params precision; the store keeps float32 (extract.dtype)
            local = self.backbone(image_layout(x[self.group.local_part(len(ids))], self.cfg.precision)).float()
        return gather_rows(local.contiguous(), len(ids), self.group).cpu().numpy()

    def advance(self, count: int) -> None:  # the bar (a terminal) and the progress line (logs, dvc repro)
        self.bar.update(count)
        self.progress.update(self.bar.n)

    def write_split(self, part: str, ids: np.ndarray, session: np.ndarray | None = None) -> None:
        """`part`/maps, labels, ids (and the session of each few-shot image)."""
        for start, chunk in _batches(ids, self.size):
            self.writer.write(f"{part}/maps", start, self.maps_of(chunk).astype(self.dtype))
            self.advance(len(chunk))
        self.writer.write(f"{part}/labels", 0, self.pack.labels[ids])
        self.writer.write(f"{part}/ids", 0, ids)
        if session is not None:
            self.writer.write(f"{part}/session", 0, session)

    def write_views(self, fewshot_ids: np.ndarray, views: int) -> None:
        """extract.augmented_views seeded train-augmented views of every few-shot image."""
        for view in range(views):
            gen = seeded_generator(self.cfg.seed, EXTRACT_VIEW + view, self.device)
            for start, chunk in _batches(fewshot_ids, self.size):
                self.writer.write_view(view, start, self.maps_of(chunk, gen).astype(self.dtype))
                self.advance(len(chunk))

    def base_means(self, base_ids: np.ndarray, base_classes: np.ndarray,
                   map_shape: tuple[int, ...]) -> tuple[np.ndarray, dict[int, int]]:
        """Class-mean maps of the base classes, accumulated in float64 (eq. memory), and each class's row."""
        sums = np.zeros((len(base_classes), *map_shape), dtype=np.float64)
        counts = np.zeros(len(base_classes), dtype=np.int64)
        slot = {int(c): i for i, c in enumerate(base_classes)}
        for _, chunk in _batches(base_ids, self.size):
            rows = np.array([slot[int(c)] for c in self.pack.labels[chunk]])
            np.add.at(sums, rows, self.maps_of(chunk))
            np.add.at(counts, rows, 1)
            self.advance(len(chunk))
        self.bar.close()
        return (sums / counts[:, None, None, None]).astype(np.float32), slot

    def write_memory(self, means: np.ndarray, base_classes: np.ndarray, memory_ids: np.ndarray | None) -> None:
        """The base classes' memory: their means (eq. memory) or the rows the random / sampled rule drew."""
        self.writer.write("memory/base_means", 0, means)
        self.writer.write("memory/base_classes", 0, base_classes.astype(np.int64))
        if memory_ids is None:
            self.writer.write("memory/base_maps", 0, means)
            self.writer.write("memory/base_map_classes", 0, base_classes.astype(np.int64))
            return
        for start, chunk in _batches(memory_ids, self.size):
            self.writer.write("memory/base_maps", start, self.maps_of(chunk))
        self.writer.write("memory/base_map_classes", 0, self.pack.labels[memory_ids].astype(np.int64))

    def write_deviations(self, deviation_ids: np.ndarray, means: np.ndarray, slot: dict[int, int]) -> None:
        """extract.deviations base maps per class, each minus its own class's mean (ours)."""
        for start, chunk in _batches(deviation_ids, self.size):
            self.writer.write("memory/base_deviations", start,
                              self.maps_of(chunk) - means[[slot[int(c)] for c in self.pack.labels[chunk]]])
        if len(deviation_ids):
            self.writer.write("memory/base_deviation_classes", 0, self.pack.labels[deviation_ids].astype(np.int64))


@torch.no_grad()
def extract_features(cfg, pack_path: Path, base_dir: Path, out_path: Path | None, show_progress: bool = True,
                     progress_lines: bool = True) -> dict:
    """Write the store at `out_path` (the caller makes it atomic; None: a process other than torchrun's main one,
    which computes its part and writes nothing); returns a summary."""
    started = time.time()
    device = run_device(cfg)
    group = init_process_group(device)
    with ImagePack.open(pack_path) as pack:
        model, meta, ckpt_sha = load_base_model(cfg, base_dir, pack.content_hash)
        backbone = memory_format(model.backbone.to(device).eval(), cfg.precision)
        preset = get_preset(pack.preset, pack.image_size)
        protocol = pack.protocol
        num_base = len(protocol.sessions[0].classes)
        test_ids = np.asarray(protocol.test_ids)
        fewshot_ids = np.concatenate([s.train_ids for s in protocol.sessions[1:]]).astype(np.int64)
        fewshot_session = np.concatenate([np.full(len(s.train_ids), s.index) for s in protocol.sessions[1:]])
        base_ids = np.asarray(protocol.sessions[0].train_ids)
        base_classes = np.asarray(protocol.sessions[0].classes)
        map_shape = (backbone.out_channels, *backbone.feature_hw(preset.input_size))
        views = cfg.extract.augmented_views
        kind, k = cfg.extract.memory_rule
        # the base classes' memory rows (None: the class means), drawn before anything is written
        memory_rows = MEMORY_RULES[kind](pack.labels[base_ids], k, seeded_generator(cfg.seed, MEMORY))
        memory_ids = None if memory_rows is None else base_ids[memory_rows]
        deviation_ids = base_ids[drawn_rows(pack.labels[base_ids], cfg.extract.deviations,
                                            seeded_generator(cfg.seed, DEVIATION))] if cfg.extract.deviations else []
        writer = _NoWriter() if out_path is None else FeatureStoreWriter(
            out_path, map_shape, {"test": len(test_ids), "fewshot": len(fewshot_ids)}, num_base, views,
            cfg.extract.dtype, cfg.extract.chunk_samples,
            attrs={"pack_hash": pack.content_hash, "checkpoint_sha256": ckpt_sha, "preset": pack.preset,
                   "transform": {"kind": "test", "input_size": preset.input_size}, "num_classes": protocol.num_classes,
                   "num_base": num_base, "num_sessions": len(protocol.sessions), "backbone": cfg.model.backbone,
                   "memory": kind, "memory_k": k, "deviations": cfg.extract.deviations},
            memory_rows=None if memory_ids is None else len(memory_ids), deviation_rows=len(deviation_ids),
        )
        total = len(test_ids) + len(fewshot_ids) * (1 + views) + len(base_ids)
        run = Extractor(cfg, pack, backbone, preset, device, writer, total, show_progress, progress_lines, group)
        run.write_split("test", test_ids)
        run.write_split("fewshot", fewshot_ids, fewshot_session)
        run.write_views(fewshot_ids, views)
        means, slot = run.base_means(base_ids, base_classes, map_shape)
        run.write_memory(means, base_classes, memory_ids)
        run.write_deviations(deviation_ids, means, slot)
        writer.finish()
    barrier(group)
    cleanup(group)
    return {"test": int(len(test_ids)), "fewshot": int(len(fewshot_ids)), "augmented_views": views, "memory": kind,
            "base_classes": int(len(base_classes)), "map_shape": list(map_shape), "checkpoint_sha256": ckpt_sha,
            "seconds": round(time.time() - started, 2)}


def extract_stage(cfg, pack_path: Path, base_dir: Path, out_path: Path, show_progress: bool = True,
                  progress_lines: bool = True) -> dict:
    """The frozen backbone's maps and the class-mean memory into the Zarr store out_path; under torchrun every process
    extracts its part of each batch, only rank 0 writes."""
    if not is_launch_main():
        extract_features(cfg, pack_path, base_dir, None, show_progress=False, progress_lines=False)
        return {}
    with atomic_output(out_path, directory=True) as tmp:
        return extract_features(cfg, pack_path, base_dir, tmp, show_progress=show_progress,
                                progress_lines=progress_lines)
