"""The contract every backbone keeps, and the prefix-based freezing used during base training.

A backbone maps images to an unpooled spatial map:

    x: (N, 3, S, S) -> forward(x): (N, C, H, W),  C = out_channels,  (H, W) = feature_hw(S)

The projector (the neck) decides how to pool or tokenise the map, so nothing here pools.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from pipeline.errors import FSCILError


def matches_prefix(name: str, prefixes: Iterable[str]) -> bool:
    """True when the dotted `name` is one of `prefixes` or lies below one (`layer1` covers `layer1.0.conv1`,
    not `layer10`)."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def complement_prefixes(names: Iterable[str], keep: Iterable[str]) -> tuple[str, ...]:
    """The fewest dotted prefixes that cover every name in `names` not under a `keep` prefix.

    Each uncovered name is cut at its shortest ancestor that holds no `keep` prefix inside it, so
    keeping `blocks.11` and `norm` of a 12-block ViT yields `cls_token, pos_embed, patch_embed,
    blocks.0, ..., blocks.10` (in first-seen order).
    """
    keep = tuple(keep)
    out: list[str] = []
    for name in names:
        if matches_prefix(name, keep) or matches_prefix(name, out):
            continue
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            candidate = ".".join(parts[:depth])
            # an ancestor of a kept part cannot be frozen whole: go one level deeper
            if not any(k == candidate or k.startswith(candidate + ".") for k in keep):
                out.append(candidate)
                break
    return tuple(out)


class Backbone(nn.Module):
    """Base class: `out_channels`, `feature_hw`, and freezing of `frozen_prefixes` for base training.

    Frozen parts also stay in eval mode through later `train()` calls, so their BatchNorm running
    statistics (and any dropout) do not change while the rest trains: the pretrained stem is fixed.
    """

    out_channels: int

    def __init__(self) -> None:
        super().__init__()
        self._frozen: tuple[str, ...] = ()

    @property
    def frozen_prefixes(self) -> tuple[str, ...]:
        """Parameter-name prefixes that `freeze_for_base_training` freezes (empty: nothing)."""
        return ()

    def feature_hw(self, input_size: int) -> tuple[int, int]:
        """(H, W) of the output map for a square input of side `input_size`."""
        raise NotImplementedError

    def freeze_for_base_training(self) -> None:
        """Set requires_grad=False on every parameter under `frozen_prefixes` and keep those parts in eval mode."""
        self._frozen = self.frozen_prefixes
        for name, param in self.named_parameters():
            if matches_prefix(name, self._frozen):
                param.requires_grad_(False)
        self.train(self.training)

    def trained_batchnorms(self) -> list[nn.Module]:
        """The BatchNorm layers base training updates (those outside the frozen parts), in registration order."""
        return [module for name, module in self.named_modules()
                if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats
                and not matches_prefix(name, self._frozen)]

    def train(self, mode: bool = True) -> Backbone:
        super().train(mode)
        if mode and self._frozen:
            for name, module in self.named_modules():
                if name and matches_prefix(name, self._frozen):
                    module.eval()
        return self


def kaiming_init_(model: nn.Module, nonlinearity: str) -> None:
    """Kaiming-normal (fan_out) convolutions for `nonlinearity`; BatchNorm weight 1, bias 0."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity=nonlinearity)
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


def check_input_size(owner: str, input_size: int) -> None:
    """Raise FSCILError unless `input_size` is a positive int (the side of a square image)."""
    if isinstance(input_size, bool) or not isinstance(input_size, int) or input_size < 1:
        raise FSCILError(f"{owner}: input size must be a positive integer, got {input_size!r}")


def check_feature_hw(owner: str, input_size: int, hw: tuple[int, int]) -> tuple[int, int]:
    """Return `hw`, or raise FSCILError when the input is too small to leave a non-empty map."""
    if hw[0] < 1 or hw[1] < 1:
        raise FSCILError(f"{owner}: input size {input_size} is too small (output map would be {hw[0]}x{hw[1]})")
    return hw
