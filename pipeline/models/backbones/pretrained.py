"""Load backbone weights from a local file: safetensors preferred, `.pt`/`.pth`/`.bin` as plain tensors only.

Nothing here downloads: pretrained weights are a file the user points to (and, ideally, pins by sha256).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from pipeline.errors import FSCILError
from pipeline.file_digest import file_digest

# wrappers added by DDP / mmcls / our own timm wrapper; stripped only while a key does not match as is
STRIP_PREFIXES = ("module.", "backbone.", "model.")
# classifier parts of a timm/torchvision/mmcls checkpoint that a headless backbone does not have
HEAD_NAMES = frozenset({"fc", "fc_norm", "head", "head_dist", "heads", "classifier"})
# nested dicts that checkpoints commonly keep the weights under
WRAPPER_KEYS = ("state_dict", "model", "module")
TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def read_state_dict(path: str | os.PathLike[str], sha256: str | None = None) -> dict[str, torch.Tensor]:
    """Read a flat name -> tensor dict from `path` (on CPU), after checking its sha256 when given."""
    path = Path(path)
    if not path.is_file():
        raise FSCILError(f"pretrained weights file not found: {path}")
    if sha256 is not None:
        actual = file_digest(path)
        if actual != sha256.strip().lower():
            raise FSCILError(f"{path}: sha256 mismatch (expected {sha256.strip().lower()}, got {actual})")
    suffix = path.suffix.lower()
    if suffix != ".safetensors" and suffix not in TORCH_SUFFIXES:
        raise FSCILError(f"{path}: unsupported weights format {suffix!r} (use .safetensors, .pt, .pth or .bin)")
    try:
        if suffix == ".safetensors":
            obj = load_file(str(path), device="cpu")
        else:
            # weights_only: a checkpoint is data, never code to run
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except (SafetensorError, pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FSCILError(f"{path}: cannot read weights ({first_line})") from e
    return _unwrap(obj, path)


def _unwrap(obj: object, path: Path) -> dict[str, torch.Tensor]:
    """Find the tensor dict inside a checkpoint ({"state_dict": ...}, {"model": ...}) and keep only the backbone."""
    while isinstance(obj, dict) and not all(isinstance(v, torch.Tensor) for v in obj.values()):
        inner = next((obj[k] for k in WRAPPER_KEYS if isinstance(obj.get(k), dict)), None)
        if inner is None:
            bad = next(k for k, v in obj.items() if not isinstance(v, torch.Tensor))
            raise FSCILError(f"{path}: not a state dict (key {bad!r} holds a {type(obj[bad]).__name__}, not a tensor)")
        obj = inner
    if not isinstance(obj, dict) or not obj:
        raise FSCILError(f"{path}: not a state dict (found {type(obj).__name__} with no tensors)")
    state = {str(k): v for k, v in obj.items()}
    # DDP first, then a whole-classifier checkpoint (mmcls: backbone.* / neck.* / head.*): keep the backbone
    if all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    if any(k.startswith("backbone.") for k in state):
        state = {k: v for k, v in state.items() if k.startswith("backbone.")}
    return state


def _match_key(key: str, targets: set[str]) -> str:
    """`key` with wrapper prefixes stripped until it names a target (or no prefix is left)."""
    while key not in targets:
        prefix = next((p for p in STRIP_PREFIXES if key.startswith(p)), None)
        if prefix is None:
            break
        key = key[len(prefix) :]
    return key


def load_pretrained(
    model: nn.Module, path: str | os.PathLike[str], sha256: str | None = None, strict: bool = True
) -> None:
    """Load the weights in `path` into `model` in place.

    Keys are matched after stripping `module.` / `backbone.` / `model.` prefixes, and classifier keys
    (`fc.*`, `head.*`, ...) the model does not have are ignored, so a torchvision, timm or mmcls
    ImageNet checkpoint loads into a headless backbone. Raises FSCILError naming the file and the first
    offending key on a missing file, a sha256 mismatch, a shape mismatch, or (strict) a missing or
    unexpected key. BatchNorm `num_batches_tracked` counters may be absent (old torchvision files).
    For the timm backbones pass the inner timm model (`backbone.model`).
    """
    path = Path(path)
    own = model.state_dict()
    targets = set(own)
    state: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for key, value in read_state_dict(path, sha256).items():
        name = _match_key(key, targets)
        if name in targets:
            state[name] = value
        elif name.split(".")[0] not in HEAD_NAMES:
            unexpected.append(key)
    # model order, so the first offending key is the first the model would use (file order may be sorted)
    for name, expected in own.items():
        found = state.get(name)
        if found is not None and found.shape != expected.shape:
            raise FSCILError(
                f"{path}: shape mismatch for key {name!r}: file {tuple(found.shape)} vs model {tuple(expected.shape)}"
            )
    missing = [k for k in own if k not in state and not k.endswith("num_batches_tracked")]
    if strict and missing:
        raise FSCILError(f"{path}: missing key {missing[0]!r} ({len(missing)} model keys not in the file)")
    if strict and unexpected:
        raise FSCILError(f"{path}: unexpected key {unexpected[0]!r} ({len(unexpected)} file keys not in the model)")
    # keys were checked above; strict=False only lets absent num_batches_tracked counters keep their value
    model.load_state_dict(state, strict=False)


def load_optional_pretrained(model: nn.Module, owner: str, path: str | None, sha256: str | None) -> None:
    """The constructors' `pretrained=` / `pretrained_sha256=` arguments: load when a file is given."""
    if path is not None:
        load_pretrained(model, path, sha256)
    elif sha256 is not None:
        raise FSCILError(f"{owner}: pretrained_sha256 is set but pretrained (the weights file) is not: set "
                         "model.pretrained to that file, or model.pretrained_sha256: null to start from random weights")
