"""The base checkpoint's identity: its file name, the config digest it is keyed by, and its loader (used by the base
session that writes it and by every later stage that reads it)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from pipeline.file_digest import file_digest
from pipeline.models.fscil import FSCILModel, build_model
from pipeline.models.registry import PROJECTOR_KINDS, ProjectorKind
from pipeline.training.checkpoint import load_checkpoint

MODEL_FILE = "model.safetensors"
BASE_MODEL_SECTIONS = ("data", "model", "base")  # the config sections a base model depends on (with the seed)


def config_digest(cfg, sections=BASE_MODEL_SECTIONS) -> str:
    """A hash of the config sections that determine the base model (plus the seed)."""
    full = cfg.to_dict(for_digest=True)
    blob = json.dumps({k: full[k] for k in ("seed", *sections)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def config_values(cfg, sections=BASE_MODEL_SECTIONS) -> dict:
    """The values `config_digest` hashes, as {section.key: value}: stored beside the digest in a checkpoint, so that a
    mismatch can name the keys that differ (`load_checkpoint`)."""
    full = cfg.to_dict(for_digest=True)
    flat = {"seed": full["seed"]}
    for section in sections:
        flat.update({f"{section}.{k}": v for k, v in full[section].items()})
    return flat


def config_stamp(cfg, sections=BASE_MODEL_SECTIONS) -> dict:
    """What a checkpoint records of the config that made it: the digest and the values."""
    return {"config": config_digest(cfg, sections), "config_values": config_values(cfg, sections)}


BASE_RERUN = "run `fscil stage base` with these params first (or `dvc repro`)"


def load_base_model(cfg, base_dir: Path, pack_hash: str | None = None) -> tuple[FSCILModel, dict, str]:
    """The trained base model, refusing a checkpoint trained with other params or on another data pack.

    Returns (model on CPU, checkpoint metadata, sha256 of the checkpoint file).
    """
    path = Path(base_dir) / MODEL_FILE
    expect = {"kind": "base-model", **config_stamp(cfg)}
    if pack_hash is not None:
        expect["data"] = pack_hash
    tensors, meta = load_checkpoint(path, expect, BASE_RERUN)
    model = build_model(cfg.model, meta["num_classes"], meta["input_size"], seed=cfg.seed)
    model.load_state_dict(tensors)
    return model, meta, file_digest(path)


# where a model without g_inc trains its base session exactly as its twin with one: nothing initialised or drawn
# after the projector takes from the global torch generator (the ETF head is fixed by its own seed, our ResNets have
# no dropout; a linear head's init and timm's stochastic depth do draw from it, after g_inc has)
TWIN_HEADS, TWIN_BACKBONES = ("etf",), ("resnet12", "resnet18")


def base_twin(cfg):
    """The config whose base model is cfg's plus g_inc, for a projector without g_inc (single_ssm: dual_ssm) on an
    ETF head and one of our ResNets, else None. There the base session trains backbone, p_iden, g_base and the head
    the same way for both (g_inc is built last and gets no gradient in base mode), so the two trained base models are
    equal tensor for tensor except g_inc's (tests/test_study.py checks this), and `fscil study` / `fscil select`
    train the twin's once and derive cfg's from it (base_session.derive_base_model)."""
    spec = PROJECTOR_KINDS[cfg.model.projector]
    if spec.dual or cfg.model.classifier not in TWIN_HEADS or cfg.model.backbone not in TWIN_BACKBONES:
        return None
    twin = next(name for name, kind in PROJECTOR_KINDS.items() if kind == ProjectorKind(spec.mixer, dual=True))
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, projector=twin))
