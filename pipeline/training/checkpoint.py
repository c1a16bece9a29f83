"""Safe checkpoints: tensors in safetensors, metadata (config, data hash, step) as JSON in its header.

Loading never unpickles anything. `load_checkpoint` refuses a file whose metadata does not match what the caller
expects (another config, another data pack), naming the mismatching key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from pipeline.atomic import atomic_output
from pipeline.errors import FSCILError

_META_KEY = "fscil"


def save_checkpoint(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, Any]) -> None:
    """Write `tensors` (contiguous CPU copies) and JSON `metadata` atomically."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    with atomic_output(path) as tmp:
        save_file(tensors, str(tmp), metadata={_META_KEY: json.dumps(metadata, sort_keys=True)})


# what a run measured of this machine, not what it computed: kept out of the files a stage writes into DVC's outputs,
# so that the same inputs give the same bytes (dvc.lock unchanged by a rerun); the stages print them
RUN_TIMES = ("seconds", "images_per_second", "seconds_per_epoch")


def write_metrics(path: str | Path, result: dict[str, Any]) -> None:
    """`result` as JSON at `path`, without its RUN_TIMES."""
    Path(path).write_text(json.dumps({k: v for k, v in result.items() if k not in RUN_TIMES}, indent=2))


def read_metadata(path: str | Path) -> dict[str, Any]:
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FSCILError(f"{path}: checkpoint not found")
    try:
        with safe_open(str(path), framework="pt") as fh:
            raw = (fh.metadata() or {}).get(_META_KEY)
    except (SafetensorError, OSError, ValueError) as err:
        raise FSCILError(f"{path}: not a readable safetensors checkpoint ({err})") from None
    if raw is None:
        raise FSCILError(f"{path}: checkpoint has no fscil metadata")
    return json.loads(raw)


def load_checkpoint(path: str | Path, expect: dict[str, Any] | None = None,
                    rerun: str = "rerun the stage that writes it") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read tensors and metadata; every key of `expect` must equal the stored metadata value, but "config_values"
    (a `config_stamp`'s): not compared itself, it names the keys that differ when "config" does not match; rerun:
    what to run then."""
    metadata = read_metadata(path)
    for key, value in (expect or {}).items():
        if key == "config_values" or metadata.get(key) == value:
            continue
        if key == "config" and "config_values" in expect and isinstance(metadata.get("config_values"), dict):
            raise FSCILError(f"{path}: made with other params "
                             f"({_differences(metadata['config_values'], expect['config_values'])}); {rerun}")
        raise FSCILError(f"{path}: checkpoint {key} does not match (stored {_short(metadata.get(key))}, "
                         f"expected {_short(value)}); {rerun}")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise FSCILError(f"{path}: corrupt checkpoint ({err})") from None
    return tensors, metadata


def _differences(old: dict[str, Any], new: dict[str, Any], shown: int = 4) -> str:
    keys = [k for k in dict.fromkeys([*old, *new]) if old.get(k, "absent") != new.get(k, "absent")]
    text = "; ".join(f"{k}: {_short(old.get(k, 'absent'))} there, {_short(new.get(k, 'absent'))} now"
                     for k in keys[:shown])
    return text + (f"; {len(keys) - shown} more" if len(keys) > shown else "")


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def prefixed(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {f"{prefix}.{k}": v for k, v in state.items()}


def unprefixed(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    head = prefix + "."
    return {k[len(head):]: v for k, v in tensors.items() if k.startswith(head)}
