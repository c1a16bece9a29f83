"""The projector (paper sec. "Dual Selective SSM Projector"): p_iden + g_base (+ g_inc), chosen by one string.

The kinds (params.yaml `model.projector`) are `PROJECTOR_KINDS` (pipeline/models/registry.py, `fscil list`): the
paper's dual_ssm, ablation row 2's single_ssm, the dual structure with another token mixer, the expanding baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from pipeline.models.mixers import ExpandingBranches
from pipeline.models.registry import PROJECTOR_KINDS
from pipeline.models.ss2d import BranchAux, BranchBase, BranchDims


def suppression_target(kind: str, configured: str) -> str:
    """What the suppression loss acts on: the configured target (z | silu_z | mu_inc) for gating designs (selective
    SSM, S4), g_inc's output (mu_inc) for the others (appendix "Implementation Details for Different Projections")."""
    spec = PROJECTOR_KINDS[kind]
    return configured if spec.branch().gated and not spec.expanding else "mu_inc"


@dataclass
class ProjectorOutput:
    mu: torch.Tensor  # (N, D'), eq. mu_0 / mu_t
    mu_iden: torch.Tensor
    mu_base: torch.Tensor
    mu_inc: torch.Tensor | None  # None in base mode and for single_ssm
    aux: BranchAux | None = None  # Z / B / C / Delta of the adapting branch (`session_outputs`)
    aux_base: BranchAux | None = None  # the same of g_base next to a g_inc (`session_outputs(base_aux=True)`)


class Projector(nn.Module):
    """f: (N, C, H, W) -> ProjectorOutput. mode "base": mu = mu_iden + mu_base; "incremental" adds mu_inc."""

    def __init__(self, kind: str, in_channels: int, feature_hw: tuple[int, int], dims: BranchDims,
                 iden_linear: bool = False, ssm_branch: str = "ss2d", inc_mlp_layers: int | None = None):
        super().__init__()
        self.kind = kind
        spec = PROJECTOR_KINDS.get_checked(kind)
        # eq. mu_iden_0: Pool then a linear map C -> D'. When C == D' the authors use the identity; `iden_linear`
        # (ours) keeps a trained linear map there too, starting from the identity.
        if in_channels != dims.dim:
            self.p_iden = nn.Linear(in_channels, dims.dim, bias=False)
        elif iden_linear:  # built on "meta" and filled with I: no random draw, so every other init is unchanged
            self.p_iden = nn.Linear(in_channels, dims.dim, bias=False, device="meta").to_empty(device="cpu")
            with torch.no_grad():
                self.p_iden.weight.copy_(torch.eye(dims.dim))
        else:
            self.p_iden = nn.Identity()
        branch = spec.branch(ssm_branch)
        self.g_base = branch(in_channels, feature_hw, dims)
        inc = (lambda *a, **k: ExpandingBranches(branch, *a, **k)) if spec.expanding else branch
        inc_dims = dims if inc_mlp_layers is None else replace(dims, mlp_layers=inc_mlp_layers)  # g_inc's p_mlp depth
        self.g_inc = inc(in_channels, feature_hw, inc_dims, zero_init_gate=True) if spec.dual else None
        self._frozen: list[nn.Module] = []

    @classmethod
    def from_config(cls, model_cfg, in_channels: int, feature_hw: tuple[int, int]) -> Projector:
        """The projector a params `model` section describes, on C x H x W backbone maps."""
        return cls(model_cfg.projector, in_channels, feature_hw, BranchDims.from_config(model_cfg),
                   iden_linear=model_cfg.iden_linear, ssm_branch=model_cfg.ssm_branch,
                   inc_mlp_layers=model_cfg.inc_mlp_layers)

    @property
    def adapting_branch(self) -> BranchBase:
        """The branch trained in incremental sessions (and regularised by the class-sensitive losses)."""
        return self.g_inc if self.g_inc is not None else self.g_base

    def set_sessions(self, count: int) -> None:
        """Shape g_inc for the state of session `count` (the expanding baseline: `count` branches); else nothing."""
        if isinstance(self.g_inc, ExpandingBranches):
            self.g_inc.set_sessions(count)

    @torch.no_grad()
    def start_inc_from_base(self) -> None:
        """g_inc := the trained g_base with its gate p_z zeroed, so mu_inc = 0 still holds when session 1 starts but
        the x path, p_mlp and the scan start from what the base session learned (option incremental.inc_init)."""
        if self.g_inc is None or isinstance(self.g_inc, ExpandingBranches):
            raise ValueError(f"projector {self.kind!r} has no single g_inc to start from g_base")
        self.g_inc.load_state_dict(self.g_base.state_dict())
        self.g_inc.zero_gate()

    def frozen_after_base(self) -> list[nn.Module]:
        return [self.p_iden, self.g_base] if self.g_inc is not None else [self.p_iden]

    def freeze_base(self) -> None:
        """Freeze what the base session trained: no gradients, and eval mode kept through `train()`."""
        self._frozen = self.frozen_after_base()
        for module in self._frozen:
            module.requires_grad_(False)
            module.eval()

    @torch.no_grad()
    def frozen_outputs(self, f: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(mu_iden, mu_base) of every map in f when p_iden and g_base are both frozen (`freeze_base` on a projector
        with g_inc): the part of mu an incremental step would otherwise recompute for the same stored maps. None when
        they train."""
        if self.g_inc is None or not self._frozen:
            return None
        parts = [self._fixed_parts(x) for x in f.split(batch_size)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def _iden(self, f: torch.Tensor) -> torch.Tensor:
        """mu_iden, eq. mu_iden_0: Pool, then p_iden."""
        return self.p_iden(f.mean(dim=(2, 3)))

    def _fixed_parts(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mu_iden, mu_base): eq. mu_iden_0 and g_base's output."""
        return self._iden(f), self.g_base(f)

    def train(self, mode: bool = True):
        super().train(mode)
        for module in self._frozen:
            module.eval()
        return self

    def forward(self, f: torch.Tensor, mode: str = "base",
                frozen: tuple[torch.Tensor, torch.Tensor] | None = None) -> ProjectorOutput:
        """mu of the maps f (N, C, H, W): "base" mode mu = mu_iden + mu_base (base training, extraction, the base
        model), "incremental" adds mu_inc (eq. mu_t). frozen: (mu_iden, mu_base) of these maps from
        `frozen_outputs`, used instead of running the frozen parts."""
        if mode not in ("base", "incremental"):
            raise ValueError(f"mode must be 'base' or 'incremental', got {mode!r}")
        mu_iden, mu_base = frozen if frozen is not None else self._fixed_parts(f)
        mu_inc = self.g_inc(f) if mode == "incremental" and self.g_inc is not None else None
        mu = mu_iden + mu_base if mu_inc is None else mu_iden + mu_base + mu_inc
        return ProjectorOutput(mu=mu, mu_iden=mu_iden, mu_base=mu_base, mu_inc=mu_inc)

    def session_outputs(self, f: torch.Tensor, frozen: tuple[torch.Tensor, torch.Tensor] | None = None,
                        base_aux: bool = False) -> ProjectorOutput:
        """What an incremental session's objective reads: mu in incremental mode and the adapting branch's
        `BranchAux` (g_inc's; single_ssm's g_base); base_aux: g_base's too, next to a g_inc (incremental.lambda3_base:
        g_base then runs on the maps, not from `frozen`)."""
        aux_base = None
        if self.g_inc is None:  # single_ssm: g_base is the adapting branch
            mu_iden = self._iden(f)
            mu_base, aux = self.g_base(f, return_aux=True)
            return ProjectorOutput(mu=mu_iden + mu_base, mu_iden=mu_iden, mu_base=mu_base, mu_inc=None, aux=aux)
        if base_aux:
            if frozen is not None:
                raise ValueError("base_aux needs g_base run on the maps, not its frozen outputs")
            mu_iden = self._iden(f)
            mu_base, aux_base = self.g_base(f, return_aux=True)
        else:
            mu_iden, mu_base = frozen if frozen is not None else self._fixed_parts(f)
        mu_inc, aux = self.g_inc(f, return_aux=True)
        return ProjectorOutput(mu=mu_iden + mu_base + mu_inc, mu_iden=mu_iden, mu_base=mu_base, mu_inc=mu_inc,
                               aux=aux, aux_base=aux_base)
