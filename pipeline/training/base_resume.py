"""The base session's resume point (`base.checkpoint_every`): model, auxiliary head and SGD momentum written next to
the output every few epochs, and read back when a killed run starts again with the same config and pack.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from pipeline.models.fscil import FSCILModel
from pipeline.training.checkpoint import load_checkpoint, read_metadata, save_checkpoint
from pipeline.training.sgd import SGD

RESUME_FILE = "resume.safetensors"
AUX_PREFIX = "aux_head."  # base.backbone_ce's head in the resumable checkpoint (never in the saved base model)


def trained_parameters(model: FSCILModel, aux_head: nn.Linear | None) -> dict[str, nn.Parameter]:
    """Every parameter base training may update, by the name its checkpoint keys use (the auxiliary head's under
    AUX_PREFIX, outside the saved model)."""
    named = dict(model.named_parameters())
    if aux_head is not None:
        named.update({AUX_PREFIX + n: p for n, p in aux_head.named_parameters()})
    return named


def _optimizer_tensors(opt: SGD, params: dict[str, nn.Parameter]) -> dict[str, torch.Tensor]:
    names = {id(p): n for n, p in params.items()}
    out = {}
    for group in opt.param_groups:
        for p in group["params"]:
            buf = opt.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                out[f"optim.{names[id(p)]}"] = buf
    return out


def _load_optimizer(opt: SGD, params: dict[str, nn.Parameter], tensors: dict[str, torch.Tensor]) -> None:
    for key, value in tensors.items():
        if key.startswith("optim."):
            p = params[key[len("optim."):]]
            opt.state[p]["momentum_buffer"] = value.to(p.device).clone()


def resume_point(ckpt: Path, meta: dict, model: FSCILModel, aux_head: nn.Linear | None,
            opt: SGD) -> tuple[int, list]:
    """(first epoch, curve rows: each epoch's loss, lr and training accuracy) from the resumable checkpoint when it
    belongs to this config and pack, else (0, []); loads the model, the auxiliary head and the optimizer state in
    place."""
    if not ckpt.is_file():
        return 0, []
    stored = read_metadata(ckpt)
    if stored.get("config") != meta["config"] or stored.get("data") != meta["data"] or "curve" not in stored:
        return 0, []
    tensors, stored = load_checkpoint(ckpt)
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    if aux_head is not None:
        aux_head.load_state_dict({k[len(AUX_PREFIX):]: v for k, v in tensors.items() if k.startswith(AUX_PREFIX)})
    _load_optimizer(opt, trained_parameters(model, aux_head), tensors)
    return int(stored["epoch"]), list(stored["curve"])


def save_resume_point(run, ckpt: Path, meta: dict, done: int, curve: list[dict]) -> None:
    """The resumable checkpoint after epoch `done` of `run` (a base_session.BaseRun): model, auxiliary head and
    optimizer state."""
    tensors = {f"model.{k}": v for k, v in run.model.state_dict().items()}
    if run.aux_head is not None:
        tensors.update({AUX_PREFIX + k: v for k, v in run.aux_head.state_dict().items()})
    tensors.update(_optimizer_tensors(run.opt, trained_parameters(run.model, run.aux_head)))
    save_checkpoint(ckpt, tensors, {**meta, "epoch": done, "curve": curve})
