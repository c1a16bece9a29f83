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

from pipeline.data.augment import test_transform, train_augment
from pipeline.data.pack import ImagePack
from pipeline.data.presets import get_preset
from pipeline.precision import autocast, image_layout, memory_format
from pipeline.seeding import DEVIATION, EXTRACT_VIEW, MEMORY, seeded_generator
from pipeline.store.feature_store import FeatureStoreWriter
from pipeline.store.memory import memory_rows
from pipeline.training.base_model import load_base_model
from pipeline.training.progress import ProgressLog
from pipeline.training.runtime import run_device


def _batches(ids: np.ndarray, size: int):
    for start in range(0, len(ids), size):
        yield start, ids[start:start + size]


@torch.no_grad()
def extract_features(cfg, pack_path: Path, base_dir: Path, out_path: Path, show_progress: bool = True,
                     progress_lines: bool = True) -> dict:
    """Write the store at `out_path` (the caller makes it atomic); returns a summary."""
    started = time.time()
    device = run_device(cfg)
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
        hw = backbone.feature_hw(preset.input_size)
        map_shape = (backbone.out_channels, *hw)
        views = cfg.extract.augmented_views
        kind, k = cfg.extract.memory_rule
        # the base classes' memory rows (random / sampled rules), drawn before anything is written
        memory_ids = None if kind == "mean" else base_ids[memory_rows(pack.labels[base_ids], kind, k,
                                                                      seeded_generator(cfg.seed, MEMORY))]
        deviation_ids = base_ids[memory_rows(pack.labels[base_ids], "sampled", cfg.extract.deviations,
                                             seeded_generator(cfg.seed, DEVIATION))] if cfg.extract.deviations else []
        writer = FeatureStoreWriter(
            out_path, map_shape, {"test": len(test_ids), "fewshot": len(fewshot_ids)}, num_base, views,
            cfg.extract.dtype, cfg.extract.chunk_samples,
            attrs={"pack_hash": pack.content_hash, "checkpoint_sha256": ckpt_sha, "preset": pack.preset,
                   "transform": {"kind": "test", "input_size": preset.input_size}, "num_classes": protocol.num_classes,
                   "num_base": num_base, "num_sessions": len(protocol.sessions), "backbone": cfg.model.backbone,
                   "memory": kind, "memory_k": k, "deviations": cfg.extract.deviations},
            memory_rows=None if memory_ids is None else len(memory_ids), deviation_rows=len(deviation_ids),
        )
        size = cfg.extract.batch_size
        np_dtype = np.dtype(cfg.extract.dtype)

        def maps_of(ids: np.ndarray, gen: torch.Generator | None = None) -> np.ndarray:
            images = torch.from_numpy(pack.read_images(ids)).to(device)
            x = test_transform(images, preset) if gen is None else train_augment(images, preset, gen)
            with autocast(device, cfg.precision):  # params precision; the store keeps float32 (or extract.dtype)
                return backbone(image_layout(x, cfg.precision)).float().cpu().numpy()

        total = len(test_ids) + len(fewshot_ids) * (1 + views) + len(base_ids)
        bar = tqdm(total=total, desc="extract", unit="img", disable=not show_progress)
        progress = ProgressLog("extract", total, "image", enabled=progress_lines)

        def advance(count: int) -> None:  # the bar (a terminal) and the progress line (logs, dvc repro)
            bar.update(count)
            progress.update(bar.n)

        for part, ids, extra in (("test", test_ids, None), ("fewshot", fewshot_ids, fewshot_session)):
            for start, chunk in _batches(ids, size):
                writer.write(f"{part}/maps", start, maps_of(chunk).astype(np_dtype))
                advance(len(chunk))
            writer.write(f"{part}/labels", 0, pack.labels[ids])
            writer.write(f"{part}/ids", 0, ids)
            if extra is not None:
                writer.write(f"{part}/session", 0, extra)
        for view in range(views):
            gen = seeded_generator(cfg.seed, EXTRACT_VIEW + view, device)
            for start, chunk in _batches(fewshot_ids, size):
                writer.write_view(view, start, maps_of(chunk, gen).astype(np_dtype))
                advance(len(chunk))
        # class-mean maps of the base classes, accumulated in float64 (eq. memory)
        base_classes = np.asarray(protocol.sessions[0].classes)
        sums = np.zeros((len(base_classes), *map_shape), dtype=np.float64)
        counts = np.zeros(len(base_classes), dtype=np.int64)
        slot = {int(c): i for i, c in enumerate(base_classes)}
        for _, chunk in _batches(base_ids, size):
            maps = maps_of(chunk)
            rows = np.array([slot[int(c)] for c in pack.labels[chunk]])
            np.add.at(sums, rows, maps)
            np.add.at(counts, rows, 1)
            advance(len(chunk))
        bar.close()
        means = (sums / counts[:, None, None, None]).astype(np.float32)
        writer.write("memory/base_means", 0, means)
        writer.write("memory/base_classes", 0, base_classes.astype(np.int64))
        if memory_ids is None:  # eq. memory: the class means
            writer.write("memory/base_maps", 0, means)
            writer.write("memory/base_map_classes", 0, base_classes.astype(np.int64))
        else:
            for start, chunk in _batches(memory_ids, size):
                writer.write("memory/base_maps", start, maps_of(chunk))
            writer.write("memory/base_map_classes", 0, pack.labels[memory_ids].astype(np.int64))
        for start, chunk in _batches(deviation_ids, size):  # each map minus its own class's mean
            writer.write("memory/base_deviations", start,
                         maps_of(chunk) - means[[slot[int(c)] for c in pack.labels[chunk]]])
        if len(deviation_ids):
            writer.write("memory/base_deviation_classes", 0, pack.labels[deviation_ids].astype(np.int64))
        writer.finish()
    return {"test": int(len(test_ids)), "fewshot": int(len(fewshot_ids)), "augmented_views": views, "memory": kind,
            "base_classes": int(len(base_classes)), "map_shape": list(map_shape), "checkpoint_sha256": ckpt_sha,
            "seconds": round(time.time() - started, 2)}
