"""The params.yaml sections a run reads, one dataclass each, each validating itself: model, base, extract and
incremental, the top-level keys, and RUN_SECTION_TYPES naming them with data (pipeline/config/data_section.py; the
selection section: pipeline/research/selection_config.py). `pipeline.config` merges params.yaml over its preset and
builds them into a `Config`.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field

from pipeline.config.data_section import DataConfig
from pipeline.config.fields import SectionConfig, added_later, check, choice
from pipeline.errors import FSCILError
from pipeline.losses.registry import (
    BASE_MIX_LOSSES,
    DR_WEIGHTINGS,
    SEPARATION_DELTAS,
    SEPARATION_FORMS,
    SEPARATION_PATHS,
    SUPPRESSION_FORMS,
    SUPPRESSION_TARGETS,
)
from pipeline.models.registry import ATTENTION_HEADS, BACKBONES, HEADS, MAMBA_1D, PROJECTOR_KINDS, SSM_BRANCHES
from pipeline.store.registry import MEMORY_RULES
from pipeline.training.registry import BASE_SCHEDULES, SCHEDULES


@dataclass
class ModelConfig(SectionConfig):
    section: typing.ClassVar[str] = "model"
    backbone: str = choice("resnet12", BACKBONES)
    """The backbone (pipeline/models/registry.py)."""
    backbone_widths: list[int] | None = None
    """ResNet-12 stage widths (None: 64-160-320-640); CPU configs use a slim one."""
    resnet18_stem: str = "cifar"
    """ResNet-18 stem: cifar (3x3, no max-pool) or imagenet (7x7 + max-pool)."""
    timm_name: str | None = None
    """timm model name overriding the default of vit_b16 / swin_t."""
    pretrained: str | None = None
    """Local path of backbone weights (.safetensors or .pt/.pth); never downloaded."""
    pretrained_sha256: str | None = None
    """Expected sha256 of the pretrained file (checked when given)."""
    projector: str = choice("dual_ssm", PROJECTOR_KINDS)
    """The projector: p_iden + g_base (+ g_inc) and the branch's token mixer (pipeline/models/registry.py)."""
    dim: int = 640
    """Projector width D'."""
    d_state: int = 256
    """SSM state size (D_B = D_C)."""
    dt_rank: int = 256
    """Low-rank width of f_Delta (D_Delta)."""
    k_paths: int = 4
    """Number of scan paths K: 1, 2 or 4."""
    expand: int = 1
    """d_inner = expand * D'."""
    d_conv: int | None = None
    """Depthwise conv kernel of the x stream (null: the branch's own, 3 x 3 over the map; mamba_1d: 4, causal)."""
    ssm_branch: str = choice("ss2d", SSM_BRANCHES)
    """The selective-SSM branch of dual_ssm / single_ssm (docs/deviations.md: the paper's SS2D, the authors' 1-D
    block)."""
    mlp_layers: int = 2
    """p_mlp depth: 2 or 3."""
    inc_mlp_layers: int | None = None
    """p_mlp depth of g_inc (null: mlp_layers; the authors' CUB config: 3)."""
    out_norm: bool = False
    """LayerNorm on the merged scan output before gating (the authors' code; the paper has none)."""
    iden_linear: bool = False
    """When C == D': p_iden a trained Linear starting from the identity (ours; false: the identity, the
    authors' code; docs/deviations.md)."""
    classifier: str = choice("etf", HEADS)
    """The classifier head and the loss it trains with."""
    num_classes: int | None = added_later(None)
    """Classes the head has room for, fixed at base training (null: the data's protocol total). More leaves ETF
    vertices free for `fscil learn` to give the user's own classes."""

    def __post_init__(self):
        self.check_types()
        check(self.resnet18_stem in ("cifar", "imagenet"), "model", "resnet18_stem", "must be cifar or imagenet")
        for key in ("dim", "d_state", "dt_rank", "expand"):
            check(getattr(self, key) >= 1, "model", key, "must be >= 1")
        check(self.d_conv is None or self.d_conv >= 1, "model", "d_conv", "must be >= 1 or null")
        check(self.k_paths in (1, 2, 4), "model", "k_paths", "must be 1, 2 or 4")
        check(self.num_classes is None or self.num_classes >= 2, "model", "num_classes", "must be >= 2 or null")
        check(self.mlp_layers in (2, 3), "model", "mlp_layers", "must be 2 or 3")
        check(self.inc_mlp_layers in (None, 2, 3), "model", "inc_mlp_layers", "must be 2, 3 or null")
        check(self.d_conv is None or self.d_conv % 2 == 1 or (self.ssm_branch == MAMBA_1D and self.projector in (
            "dual_ssm", "single_ssm")), "model", "d_conv", "must be odd for a k x k conv over the map (only "
              f"ssm_branch {MAMBA_1D}'s causal conv1d takes an even kernel)")
        check(self.projector != "transformer" or (self.expand * self.dim) % ATTENTION_HEADS == 0, "model",
              "dim", f"times model.expand must be divisible by the transformer's {ATTENTION_HEADS} heads")


# base.<key>s that count the last epochs of the training (each at most base.epochs)
LAST_EPOCHS_KEYS = ("unmixed_epochs", "unaugmented_epochs")


@dataclass
class BaseConfig(SectionConfig):
    section: typing.ClassVar[str] = "base"
    epochs: int = 200
    """Base-session epochs."""
    batch_size: int = 512
    """Global batch size (split evenly over processes; results depend on this, not on the process count)."""
    lr: float = 0.25
    """Peak SGD learning rate of the projector (and of the backbone, times backbone_lr_scale)."""
    backbone_lr_scale: float = 1.0
    """Backbone learning-rate multiplier (CUB: 0.1; 0: the backbone keeps its weights, BatchNorm still moves)."""
    momentum: float = 0.9
    """SGD momentum."""
    weight_decay: float = 5e-4
    """SGD weight decay."""
    device_batch: int | None = None
    """Rows of the global batch one of the authors' GPUs held: BatchNorm statistics and Mixup partners per
    group of that many rows (null: one group; docs/deviations.md). Results never depend on the process count."""
    schedule: str = choice("warmup_cosine", BASE_SCHEDULES)
    """The base lr schedule by step (the authors' mmcv schedules: docs/deviations.md)."""
    warmup_steps: int = 100
    """Linear warm-up steps."""
    warmup_ratio: float = 0.0
    """Where the warm-up starts, as a fraction (mmcv schedules: a factor of the scheduled value; the authors' 0.1,
    miniImageNet 0.25)."""
    min_lr_ratio: float = 0.0
    """Final learning rate as a fraction of lr (cosine schedules)."""
    cooldown_steps: int = 0
    """mmcv_cosine_cooldown: the last this many steps at cooldown_ratio x min_lr_ratio x lr (the authors' 10)."""
    cooldown_ratio: float = 0.1
    """mmcv_cosine_cooldown: the cool-down lr as a fraction of the cosine's floor."""
    step_epochs: list[int] = field(default_factory=list)
    """mmcv_step: the epochs (0-based, counted from the start) from which the lr is multiplied by step_gamma once
    more (the authors' miniImageNet: 200, 300, 350, 400, 450)."""
    step_gamma: float = 0.1
    """mmcv_step: the factor at each of step_epochs (miniImageNet: 0.25)."""
    drop_last: bool = True
    """Drop the last, smaller batch of each pass over the images (ours); false: keep it, as the authors' sampler did
    (CUB: 24 iterations per 4 epochs, not 20)."""
    repeat: int = 1
    """Epochs that share one shuffled pass over `repeat` copies of the images (the authors' RepeatDataset);
    base.epochs and checkpoint_every are multiples of it."""
    dr_weighting: str = choice("uniform", DR_WEIGHTINGS)
    """How the samples weigh in the base DR loss (the authors' miniImageNet: class_balanced)."""
    mixup_alpha: float = 0.0
    """Batch Mixup alpha (0: off)."""
    cutmix_alpha: float = 0.0
    """Batch CutMix alpha (0: off)."""
    mix_prob: float = 1.0
    """Probability of mixing a batch when mixup/cutmix is on."""
    mix_loss: str = choice("lam_weighted", BASE_MIX_LOSSES)
    """The head's loss on a Mixup / CutMix batch: the paper's, or the authors' with the first targets' loss counted
    again (docs/deviations.md)."""
    unmixed_epochs: int = 0
    """The last this many epochs train on unmixed batches (ours; 0: mixed to the end)."""
    unaugmented_epochs: int = 0
    """The last this many epochs train under the test transform (ours, FixRes-like; 0: augmented to the end)."""
    dr_scale: float = 10.0
    """Multiplier of the DR loss (the authors' 10; the paper's eq. has none)."""
    precise_bn: bool = False
    """After training, the backbone's BatchNorm statistics measured on the training images under the test
    transform (ours)."""
    checkpoint_every: int = 1
    """Write a resumable checkpoint every this many epochs."""
    eval_batch_size: int = 256
    """Batch size of the base-class test evaluation and precise BatchNorm (no effect on results)."""
    backbone_ce: float = 0.0
    """Weight of an auxiliary cross-entropy head on the backbone's pooled map during base training (ours; 0:
    off; docs/research/findings.md)."""

    def __post_init__(self):
        self.check_types()
        for key in ("epochs", "batch_size", "checkpoint_every", "eval_batch_size"):
            check(getattr(self, key) >= 1, "base", key, "must be >= 1")
        check(self.lr > 0, "base", "lr", "must be > 0")
        check(self.dr_scale > 0, "base", "dr_scale", "must be > 0")
        for key in ("backbone_lr_scale", "weight_decay", "backbone_ce", "mixup_alpha", "cutmix_alpha",
                    *LAST_EPOCHS_KEYS):
            check(getattr(self, key) >= 0, "base", key, "must be >= 0")
        check(0 <= self.mix_prob <= 1, "base", "mix_prob", "must be in [0, 1]")
        for key in LAST_EPOCHS_KEYS:  # a preset's count must not swallow a shorter training
            check(getattr(self, key) <= self.epochs, "base", key, f"must be <= base.epochs ({self.epochs})")
        check(self.warmup_steps >= 0, "base", "warmup_steps", "must be >= 0")
        check(0 <= self.warmup_ratio <= 1, "base", "warmup_ratio", "must be in [0, 1]")
        for key in ("cooldown_steps", "cooldown_ratio", "step_gamma"):
            check(getattr(self, key) >= 0, "base", key, "must be >= 0")
        check(all(0 < e < self.epochs for e in self.step_epochs) and self.step_epochs == sorted(set(self.step_epochs)),
              "base", "step_epochs", f"must be increasing epochs between 1 and {self.epochs - 1}")
        check(self.device_batch is None or (self.device_batch >= 1 and self.batch_size % self.device_batch == 0),
              "base", "device_batch", f"must be null or divide base.batch_size ({self.batch_size})")
        check(self.repeat >= 1 and self.epochs % self.repeat == 0, "base", "repeat",
              f"must be >= 1 and divide base.epochs ({self.epochs})")
        check(self.checkpoint_every % self.repeat == 0, "base", "checkpoint_every",
              f"must be a multiple of base.repeat ({self.repeat})")


@dataclass
class ExtractConfig(SectionConfig):
    section: typing.ClassVar[str] = "extract"
    batch_size: int = 256
    """Images per backbone forward."""
    augmented_views: int = 0
    """Extra augmented views stored per few-shot training image."""
    chunk_samples: int = 256
    """Zarr chunk length along the sample axis."""
    dtype: str = "float32"
    """Stored map dtype: float32 or float16."""
    memory: str = choice("mean", MEMORY_RULES)
    """What stands for a learned class in the memory (the paper's memory ablation; the sessions follow the store's
    rule)."""
    memory_k: int = 4
    """Maps kept per class by memory=sampled."""
    deviations: int = 0
    """Base training maps per class whose difference from their class mean the store keeps, for
    incremental.deviation_prob (ours; 0: none)."""

    @property
    def memory_rule(self) -> tuple[str, int]:
        """(memory, maps kept per class): memory_k counts only under the sampled rule, 1 otherwise."""
        return self.memory, self.memory_k if self.memory == "sampled" else 1

    def __post_init__(self):
        self.check_types()
        check(self.memory_k >= 1, "extract", "memory_k", "must be >= 1")
        check(self.deviations >= 0, "extract", "deviations", "must be >= 0")
        check(self.batch_size >= 1, "extract", "batch_size", "must be >= 1")
        check(self.augmented_views >= 0, "extract", "augmented_views", "must be >= 0")
        check(self.chunk_samples >= 1, "extract", "chunk_samples", "must be >= 1")
        check(self.dtype in ("float32", "float16"), "extract", "dtype", "must be float32 or float16")


@dataclass
class IncrementalConfig(SectionConfig):
    section: typing.ClassVar[str] = "incremental"
    steps: list[int] = field(default_factory=lambda: [200])
    """Training steps per session: one value for all sessions, or one per session."""
    lr: float = 0.25
    """Peak SGD learning rate of a session (a fresh SGD each session)."""
    batch_size: int = 64
    """Global batch size (shuffled, drop_last, cycled for `steps`)."""
    momentum: float = 0.9
    """SGD momentum."""
    weight_decay: float = 5e-4
    """SGD weight decay."""
    schedule: str = choice("warmup_cosine", SCHEDULES)
    """The session's lr schedule (the authors' mmcv schedule: docs/deviations.md)."""
    warmup_steps: int = 5
    """Linear warm-up steps."""
    warmup_ratio: float = 0.1
    """Where the warm-up starts, as a fraction of lr (mmcv_cosine_cooldown: of the cosine value)."""
    min_lr_ratio: float = 0.01
    """Cosine schedule ends at min_lr_ratio * lr."""
    cooldown_steps: int = 5
    """mmcv_cosine_cooldown: the last this many steps run at cooldown_ratio * min_lr_ratio * lr."""
    cooldown_ratio: float = 0.1
    """mmcv_cosine_cooldown: the cool-down lr as a fraction of the cosine's floor."""
    copy: int = 1
    """Copies of each earlier novel class's replayed samples in a session's training set."""
    replay: str = "mean"
    """What stands for an earlier novel class in later sessions: mean (its class-mean map, the paper's memory) or
    shots (its few stored shot maps, already in the feature store)."""
    base_copy: list[int] = field(default_factory=lambda: [1])
    """Copies of each base-class prototype: one value, or one per session."""
    lambda1: float = 100.0
    """Suppression weight on base inputs (eq. loss_supp)."""
    lambda2: float = 1e-5
    """Activation weight on novel inputs (eq. loss_supp; the authors' CIFAR-100 value)."""
    lambda3: float = 1e-3
    """Separation weight (eq. loss_sep; the authors' CIFAR-100 value)."""
    lambda3_base: float = 0.0
    """Separation weight on g_base's B, C, Delta in the sessions (the authors' CUB config: 1e-3, with g_base
    training at 0.2x lr); needs freeze_base false."""
    suppression: str = choice("z", SUPPRESSION_TARGETS)
    """What the suppression loss acts on (z_channel_flip: docs/deviations.md)."""
    suppression_form: str = choice("squared_mean", SUPPRESSION_FORMS)
    """S of eq. loss_supp: the paper's or the authors' form (docs/deviations.md)."""
    separation_form: str = choice("abs_cos", SEPARATION_FORMS)
    """The separation of eq. loss_sep: the paper's or the authors' form (docs/deviations.md)."""
    separation_delta: str = choice("delta", SEPARATION_DELTAS)
    """What the separation reads as Delta (docs/deviations.md)."""
    separation_paths: str = choice("all", SEPARATION_PATHS)
    """Which scan paths the separation's means average (docs/deviations.md)."""
    loss_groups: int = 1
    """Groups the class-sensitive losses are computed on (row r in group r % loss_groups), each term gated
    on every group holding its rows: 8 is the authors' 8 GPUs (docs/deviations.md); 1: the whole batch."""
    dr_weighting: str = choice("uniform", DR_WEIGHTINGS)
    """How the samples weigh in the session's DR loss (the authors' CIFAR-100 / mini: class_balanced)."""
    freeze_base: bool = True
    """Freeze p_iden and g_base after the base session (the paper); false: they train in every session too."""
    base_lr_scale: float = 1.0
    """With freeze_base false: the lr multiplier of p_iden and g_base in the sessions (ours)."""
    inc_init: str = "random"
    """How g_inc starts in session 1: random (the paper) or base (a copy of g_base); its gate starts shut
    either way."""
    vertex_match: bool = False
    """Give new classes the free ETF vertices their shots already point to (ours; false: class order, the
    paper)."""
    mixup_prob: float = 0.0
    """Feature-mixup probability per batch (0: off)."""
    deviation_prob: float = 0.0
    """Probability that a novel row of a batch gets a base deviation added (extract.deviations; ours; 0: off)."""
    dr_scale: float = 10.0
    """Multiplier of the DR loss in the sessions (the authors' 10)."""
    grad_clip_norm: float | None = None
    """Clip the norm of the session's whole gradient (every trainable projector and classifier parameter) to this
    value each step (null: no clipping, the paper's setting)."""
    eval_batch_size: int = 512
    """Batch size of evaluation and of the once-per-session frozen outputs (no effect on results)."""

    def __post_init__(self):
        self.check_types()
        check(len(self.steps) >= 1 and min(self.steps) >= 1, "incremental", "steps", "must be >= 1")
        check(len(self.base_copy) >= 1 and min(self.base_copy) >= 0, "incremental", "base_copy", "must be >= 0")
        check(self.batch_size >= 1, "incremental", "batch_size", "must be >= 1")
        check(self.copy >= 0, "incremental", "copy", "must be >= 0")
        check(self.replay in ("mean", "shots"), "incremental", "replay", "must be mean or shots")
        check(self.lr > 0, "incremental", "lr", "must be > 0")
        check(self.base_lr_scale > 0, "incremental", "base_lr_scale", "must be > 0 (freeze_base true freezes them)")
        check(self.loss_groups >= 1 and self.batch_size % self.loss_groups == 0, "incremental", "loss_groups",
              f"must be >= 1 and divide incremental.batch_size ({self.batch_size})")
        check(self.cooldown_steps >= 0, "incremental", "cooldown_steps", "must be >= 0")
        check(self.cooldown_ratio >= 0, "incremental", "cooldown_ratio", "must be >= 0")
        check(self.lambda3_base >= 0, "incremental", "lambda3_base", "must be >= 0")
        check(not self.lambda3_base or not self.freeze_base, "incremental", "lambda3_base",
              "needs freeze_base false (a separation on g_base's parameters trains g_base)")
        check(0 <= self.mixup_prob <= 1, "incremental", "mixup_prob", "must be in [0, 1]")
        check(0 <= self.deviation_prob <= 1, "incremental", "deviation_prob", "must be in [0, 1]")
        for key in ("weight_decay", "lambda1", "lambda2", "lambda3"):
            check(getattr(self, key) >= 0, "incremental", key, "must be >= 0")
        check(self.inc_init in ("random", "base"), "incremental", "inc_init", "must be random or base")
        check(self.grad_clip_norm is None or self.grad_clip_norm > 0, "incremental", "grad_clip_norm",
              "must be > 0 or null")

    def digest_values(self) -> dict:
        """As every section's, but without base_lr_scale when freeze_base is true: it scales the lr of parts that are
        then frozen, so it changes nothing a session computes (and stored runs and candidates stay valid)."""
        values = super().digest_values()
        if self.freeze_base:
            values.pop("base_lr_scale", None)
        return values

    @property
    def suppression_on(self) -> bool:
        """Whether sessions train with the suppression loss (eq. loss_supp); off (lambda1 = lambda2 = 0), its
        target `suppression` is never read."""
        return bool(self.lambda1 or self.lambda2)

    def session_value(self, key: str, session: int) -> int:
        """`steps` / `base_copy` of incremental session `session` (1-based): per-session lists or one value."""
        values = getattr(self, key)
        if len(values) == 1:
            return values[0]
        if session > len(values):
            raise FSCILError(f"params: incremental.{key} has {len(values)} values but session {session} was asked")
        return values[session - 1]


@dataclass(kw_only=True)
class TopLevel:
    """The top-level keys of params.yaml (the run's `Config` carries them with the sections)."""

    preset: str = "synthetic"
    """The preset: benchmark, widths and schedule (pipeline/presets; `fscil list`)."""
    variant: str | None = None
    """The method on top of the preset (pipeline/variants; null: the preset's values alone)."""
    seed: int = 0
    """Seed of the data split (synthetic), the initialisation and every random draw."""
    device: str = "auto"
    """auto (CUDA when there is one), cpu, cuda or cuda:N."""
    deterministic: bool = True
    """CUDA only: bit-for-bit reruns in full float32 (true) or the faster kernels (false); `pipeline.device`."""
    scan: str = "auto"
    """CUDA only: which selective scan runs (`pipeline.ops.scan_dispatch.SCAN_CHOICES`; docs/gpu.md)."""
    precision: str = "fp32"
    """fp32, or bf16 autocast in the training steps and extraction (`pipeline.precision`; the fast profile)."""
    threads: int = 2
    """CPU intra-op threads (CPU results depend on it)."""
    nproc_per_node: int = 1
    """Processes of base training and extraction (torchrun, one GPU each); results depend on base.batch_size, not
    on this."""
    sessions: dict[str, str] | None = None
    """params.yaml `sessions`: the incremental sessions `dvc repro` runs (dvc.yaml's foreach); None outside DVC."""


# every params.yaml section a run reads, and its dataclass (`fscil select`'s: pipeline/research/selection_config.py)
RUN_SECTION_TYPES: dict[str, type[SectionConfig]] = {
    "data": DataConfig, "model": ModelConfig, "base": BaseConfig, "extract": ExtractConfig,
    "incremental": IncrementalConfig}
