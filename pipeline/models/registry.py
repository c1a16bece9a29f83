"""The model registries (pipeline/registry.py): backbones, the selective-SSM branch, the token mixers that replace
it, projector kinds and classifier heads. A new kind is its class plus one line here."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.registry import Registry

# model.backbone: images (N, 3, S, S) -> maps (N, C, H, W)
BACKBONES = Registry("backbone", {
    "resnet12": ("pipeline.models.backbones.resnet12:resnet12", "ResNet-12 (CIFAR-100, miniImageNet; slim on a CPU)"),
    "resnet18": ("pipeline.models.backbones.resnet18:resnet18", "ResNet-18 (CUB-200, from ImageNet weights)"),
    "vit_b16": ("pipeline.models.backbones.timm_backbones:vit_b16", "ViT-B/16 (timm)"),
    "swin_t": ("pipeline.models.backbones.timm_backbones:swin_t", "Swin-T (timm)"),
})

# model.ssm_branch: the selective-SSM branch of the dual_ssm / single_ssm projectors
MAMBA_1D = "mamba_1d"  # the authors' shared 1-D branch: the config's d_conv rule and the scan benchmark ask for it
SSM_BRANCHES = Registry("selective-SSM branch", {
    "ss2d": ("pipeline.models.ss2d:SS2DBranch", "SS2D: K scan paths over the map, each with its own parameters"),
    MAMBA_1D: ("pipeline.models.mamba1d:SharedMamba1DBranch",
                 "one 1-D Mamba block shared by 4 token orders (the authors' CIFAR-100 / mini code)"),
})

ATTENTION_HEADS = 8  # the appendix's 8-head Transformer mixer

# the token mixers that replace the selective scan in a branch (paper table diff_archs; model.projector picks one)
MIXERS = Registry("token mixer", {
    "mlp": ("pipeline.models.mixers:MLPBranch", "a 3-layer MLP per token"),
    "s4": ("pipeline.models.mixers:S4Branch", "S4: input-independent B, C, Delta"),
    "transformer": ("pipeline.models.mixers:TransformerBranch", "8-head self-attention"),
    "gru": ("pipeline.models.mixers:GRUBranch", "a GRU over the tokens"),
    "lstm": ("pipeline.models.mixers:LSTMBranch", "an LSTM over the tokens"),
})


@dataclass(frozen=True)
class ProjectorKind:
    mixer: str | None  # a MIXERS name; None: the selective-SSM branch model.ssm_branch names (SSM_BRANCHES)
    dual: bool  # a separate g_inc; otherwise g_base adapts in incremental sessions
    expanding: bool = False  # g_inc grows by one branch per session

    def branch(self, ssm_branch: str = "ss2d"):
        """The branch class."""
        return SSM_BRANCHES[ssm_branch] if self.mixer is None else MIXERS[self.mixer]


# model.projector: p_iden + g_base (+ g_inc)
PROJECTOR_KINDS = Registry("projector", {
    "dual_ssm": (ProjectorKind(None, dual=True), "the paper: g_inc trains in the sessions, g_base frozen"),
    "single_ssm": (ProjectorKind(None, dual=False), "ablation row 2: g_base keeps training, no g_inc"),
    **{name: (ProjectorKind(name, dual=True), f"the dual structure with the {name} mixer (table diff_archs)")
       for name in MIXERS},
    "expanding_mlp": (ProjectorKind("mlp", dual=True, expanding=True),
                      "the expanding baseline: g_inc adds one MLP branch per session"),
}, lazy=False)

# model.classifier: the head and the loss it trains with
HEADS = Registry("classifier head", {
    "etf": ("pipeline.models.classifier:ETF_HEAD", "fixed simplex ETF + DR loss (the paper)"),
    "linear": ("pipeline.models.classifier:LINEAR_HEAD", "learnable linear head + cross-entropy (the ETF ablation)"),
})
