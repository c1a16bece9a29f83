"""The base checkpoint's identity: its file name, the config digest it is keyed by, and its loader (used by the base
session that writes it and by every later stage that reads it)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pipeline.file_digest import file_digest
from pipeline.models.fscil import FSCILModel, build_model
from pipeline.training.checkpoint import load_checkpoint

MODEL_FILE = "model.safetensors"
BASE_MODEL_SECTIONS = ("data", "model", "base")  # the config sections a base model depends on (with the seed)


def config_digest(cfg, sections=BASE_MODEL_SECTIONS) -> str:
    """A hash of the config sections that determine the base model (plus the seed)."""
    full = cfg.to_dict(for_digest=True)
    blob = json.dumps({k: full[k] for k in ("seed", *sections)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def load_base_model(cfg, base_dir: Path, pack_hash: str | None = None) -> tuple[FSCILModel, dict, str]:
    """The trained base model, refusing a checkpoint trained with other params or on another data pack.

    Returns (model on CPU, checkpoint metadata, sha256 of the checkpoint file).
    """
    path = Path(base_dir) / MODEL_FILE
    expect = {"kind": "base-model", "config": config_digest(cfg)}
    if pack_hash is not None:
        expect["data"] = pack_hash
    tensors, meta = load_checkpoint(path, expect)
    model = build_model(cfg.model, meta["num_classes"], meta["input_size"], seed=cfg.seed)
    model.load_state_dict(tensors)
    return model, meta, file_digest(path)
