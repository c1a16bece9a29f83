"""The `selection` section of params.yaml: the pseudo-incremental protocol of `fscil select` and the candidate sets it
compares (pipeline/research/selection.py runs them), each candidate checked by the rules of the section it sets.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field

from pipeline import names
from pipeline.config_fields import SectionConfig, check, fail
from pipeline.config_sections import LAST_EPOCHS_KEYS, RUN_SECTION_TYPES
from pipeline.errors import FSCILError

# the base.<key>s the base stage of `fscil select` may choose, in this order (selection.base_<key> lists candidates)
BASE_SELECTION_KEYS = ("epochs", "lr", "dr_scale", "weight_decay", "mixup_alpha", "cutmix_alpha", "mix_prob",
                       "unmixed_epochs", "unaugmented_epochs", "precise_bn", "backbone_ce")
# the session schedule and training-set keys its schedule stage may choose, (section, key) in this order (the selection
# field is named as the key): the memory before what is built from it (replay and copy act on the earlier classes'
# memory rows, base_copy repeats the base classes' rows, so its best value depends on how many rows a class keeps)
SCHEDULE_SELECTION_KEYS = (("incremental", "lr"), ("incremental", "base_lr_scale"), ("incremental", "weight_decay"),
                           ("incremental", "grad_clip_norm"), ("incremental", "steps"), ("incremental", "mixup_prob"),
                           ("incremental", "deviation_prob"), ("extract", "augmented_views"), ("extract", "memory"),
                           ("extract", "memory_k"), ("incremental", "replay"), ("incremental", "copy"),
                           ("incremental", "base_copy"))
# the architecture and loss-weight keys of its later stages (selection field -> run key)
ARCHITECTURE_SELECTION_KEYS = {"freeze_base": "incremental.freeze_base", "suppression": "incremental.suppression",
                               "k_paths": "model.k_paths", "iden_linear": "model.iden_linear",
                               "out_norm": "model.out_norm", "inc_init": "incremental.inc_init",
                               "vertex_match": "incremental.vertex_match", "lambda1": "incremental.lambda1",
                               "lambda2": "incremental.lambda2", "lambda3": "incremental.lambda3"}
# every run key `fscil select` can search: selection field (its candidate list) -> run key
SEARCHABLE = {**{f"base_{key}": f"base.{key}" for key in BASE_SELECTION_KEYS},
              **{key: f"{section}.{key}" for section, key in SCHEDULE_SELECTION_KEYS}, **ARCHITECTURE_SELECTION_KEYS}


@dataclass
class SelectionConfig(SectionConfig):
    """`fscil select`: the pseudo-incremental protocol built from the base session's training data and the candidate
    sets compared on it (paper appendix supp:hyperparameter_protocol)."""

    section: typing.ClassVar[str] = "selection"
    seed: int = 0
    """Seed of the pseudo protocol and of every candidate run (the paper: 0)."""
    protocols: int = 1
    """Pseudo protocols drawn (seeds seed, seed + 1, ...); a candidate's score is its mean pseudo AVG over them
    (the paper: 1). With a few held-out images per class one protocol's margins are often below one image."""
    min_gain_se: float = 0.0
    """Ours: a candidate replaces the configured value only when its pseudo AVG, paired protocol by protocol with
    the configured value's, gains more than this many standard errors of those differences; of the candidates that
    do, the highest mean wins, and when none does the configured value stays (0: the highest mean, the paper's
    rule). Needs protocols >= 2; a key whose configured value is not among its candidates takes the highest mean."""
    val_fraction: float = 0.2
    """Fraction of each base class's training images held out as the pseudo test set."""
    base_fraction: float | None = None
    """Fraction of the base classes forming the pseudo-base session (null: every class the pseudo sessions leave)."""
    sessions: int | None = None
    """Pseudo-incremental sessions (null: min(real sessions, (base classes // 3) // ways))."""
    ways: int | None = None
    """Classes per pseudo-incremental session (null: the real protocol's)."""
    shots: int | None = None
    """Training images per class in pseudo-incremental sessions (null: the real protocol's)."""
    base_epochs: list[int] = field(default_factory=list)
    """Base stage (ours, first: everything later runs on its base model) candidates of base.epochs (empty: keep
    base.epochs; one value: every candidate's base trains that long, and it is written as chosen)."""
    base_lr: list[float] = field(default_factory=list)
    """Base stage candidates of base.lr (empty: keep the configured value). Each trains its own pseudo base model."""
    base_dr_scale: list[float] = field(default_factory=list)
    """Base stage candidates of base.dr_scale (empty: keep the configured value)."""
    base_weight_decay: list[float] = field(default_factory=list)
    """Base stage candidates of base.weight_decay (empty: keep the configured value)."""
    base_mixup_alpha: list[float] = field(default_factory=list)
    """Base stage candidates of base.mixup_alpha (0: no batch Mixup; empty: keep the configured value)."""
    base_cutmix_alpha: list[float] = field(default_factory=list)
    """Base stage candidates of base.cutmix_alpha (0: no batch CutMix; empty: keep the configured value)."""
    base_mix_prob: list[float] = field(default_factory=list)
    """Base stage candidates of base.mix_prob (the share of batches mixed; empty: keep the configured value)."""
    base_unmixed_epochs: list[int] = field(default_factory=list)
    """Base stage candidates of base.unmixed_epochs (empty: keep the configured value)."""
    base_unaugmented_epochs: list[int] = field(default_factory=list)
    """Base stage candidates of base.unaugmented_epochs (empty: keep the configured value)."""
    base_precise_bn: list[bool] = field(default_factory=list)
    """Base stage candidates of base.precise_bn (empty: keep the configured value)."""
    base_backbone_ce: list[float] = field(default_factory=list)
    """Base stage candidates of base.backbone_ce (0: no auxiliary cross-entropy on the backbone; empty: keep the
    configured value)."""
    lr: list[float] = field(default_factory=list)
    """Stage 0 candidates of incremental.lr (empty: keep the configured value; not in the paper's list: a variant
    whose head or frozen parts change what the sessions train, e.g. linear + CE, may need its own)."""
    base_lr_scale: list[float] = field(default_factory=list)
    """Stage 0 candidates of incremental.base_lr_scale (empty: keep the configured value; ours: how fast p_iden /
    g_base move when freeze_base is false)."""
    weight_decay: list[float] = field(default_factory=list)
    """Stage 0 candidates of incremental.weight_decay (empty: keep the configured value; not in the paper's list: with
    p_iden / g_base trained in the sessions too, their decay acts on the base classes' features in every session)."""
    grad_clip_norm: list[float | None] = field(default_factory=list)
    """Stage 0 candidates of incremental.grad_clip_norm (null: no clipping; empty: keep the configured value)."""
    steps: list[list[int]] = field(default_factory=list)
    """Stage 0 candidates of incremental.steps (empty: keep the configured schedule; not in the paper's list: at CPU
    budgets a session can end before it fits its own shots)."""
    mixup_prob: list[float] = field(default_factory=list)
    """Stage 0 candidates of incremental.mixup_prob (empty: keep the configured value)."""
    deviation_prob: list[float] = field(default_factory=list)
    """Stage 0 candidates of incremental.deviation_prob (empty: keep the configured value; ours: base deviations
    lent to the novel rows; needs extract.deviations > 0, set in params)."""
    replay: list[str] = field(default_factory=list)
    """Stage 0 candidates of incremental.replay (empty: keep the configured value)."""
    copy: list[int] = field(default_factory=list)
    """Stage 0 candidates of incremental.copy (empty: keep the configured value)."""
    base_copy: list[list[int]] = field(default_factory=list)
    """Stage 0 candidates of incremental.base_copy (empty: keep the configured value)."""
    augmented_views: list[int] = field(default_factory=list)
    """Stage 0 candidates of extract.augmented_views (empty: keep the configured value; ours: augmented views of each
    shot stored with the shots, the sessions' image augmentation on cached features). Each extracts its own store."""
    memory: list[str] = field(default_factory=list)
    """Stage 0 candidates of extract.memory (the paper's memory ablation; empty: keep the configured value). Each
    extracts its own feature store from the shared pseudo base model."""
    memory_k: list[int] = field(default_factory=list)
    """Stage 0 candidates of extract.memory_k, after extract.memory (empty: keep the configured value)."""
    freeze_base: list[bool] = field(default_factory=lambda: [True, False])
    """Stage 1a candidates of incremental.freeze_base."""
    suppression: list[str] = field(default_factory=lambda: ["z", "silu_z", "mu_inc"])
    """Stage 1b candidates of incremental.suppression."""
    k_paths: list[int] = field(default_factory=lambda: [1, 2, 4])
    """Stage 1c candidates of model.k_paths (each trains its own base model)."""
    iden_linear: list[bool] = field(default_factory=list)
    """Stage 1c candidates of model.iden_linear, after k_paths (empty: keep the configured value; ours: a trained
    linear p_iden at C == D'). Each trains its own base model."""
    out_norm: list[bool] = field(default_factory=list)
    """Stage 1c candidates of model.out_norm, after iden_linear (empty: keep the configured value; the authors' code
    has the LayerNorm on the merged scan output, the paper's equations do not). Each trains its own base model."""
    inc_init: list[str] = field(default_factory=lambda: ["random", "base"])
    """Stage 1d candidates of incremental.inc_init (not in the paper's list: how g_inc starts in session 1)."""
    vertex_match: list[bool] = field(default_factory=list)
    """Stage 1e candidates of incremental.vertex_match, after inc_init (empty: keep the configured value; ours: the
    free ETF vertices given by the new classes' features)."""
    lambda1: list[float] = field(default_factory=lambda: [50.0, 100.0, 150.0, 200.0])
    """Stage 2 candidates of incremental.lambda1 (chosen with lambda2 = lambda3 = 0)."""
    lambda2: list[float] = field(default_factory=lambda: [0.001, 0.01, 0.1, 1.0])
    """Stage 2 candidates of incremental.lambda2 (chosen with lambda3 = 0)."""
    lambda3: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.3, 0.5])
    """Stage 2 candidates of incremental.lambda3."""

    def __post_init__(self):
        self.check_types()

        check(0 < self.val_fraction < 1, "selection", "val_fraction", "must be in (0, 1)")
        check(self.base_fraction is None or 0 < self.base_fraction < 1, "selection", "base_fraction",
              "must be in (0, 1) or null")
        for key in ("sessions", "ways", "shots"):
            check(getattr(self, key) is None or getattr(self, key) >= 1, "selection", key, "must be >= 1 or null")
        check(self.protocols >= 1, "selection", "protocols", "must be >= 1")
        check(self.min_gain_se >= 0, "selection", "min_gain_se", "must be >= 0")
        check(self.min_gain_se == 0 or self.protocols >= 2, "selection", "min_gain_se",
              "needs protocols >= 2 (a standard error over pseudo protocols)")
        # a base-stage or schedule-stage candidate must be a valid value of its key: that section's own rule
        for section, key, name in ([("base", key, f"base_{key}") for key in BASE_SELECTION_KEYS]
                                   + [(section, key, key) for section, key in SCHEDULE_SELECTION_KEYS]):
            for value in getattr(self, name):
                # a count of last epochs is bounded by the run's base.epochs, checked when a candidate's config is built
                bound = {"epochs": max(value, 1)} if section == "base" and key in LAST_EPOCHS_KEYS else {}
                try:
                    RUN_SECTION_TYPES[section](**{key: value, **bound})
                except FSCILError as err:
                    fail("selection", name, f"lists {value!r}: {str(err).removeprefix('params: ')}")
        for key in ("freeze_base", "suppression", "k_paths", "inc_init", "lambda1", "lambda2", "lambda3"):
            values = getattr(self, key)
            check(len(values) >= 1, "selection", key, "must list at least one candidate")
            check(len(set(values)) == len(values), "selection", key, "lists a candidate twice")
        check(set(self.suppression) <= set(names.SUPPRESSION_TARGETS), "selection", "suppression",
              f"must be a list of {sorted(names.SUPPRESSION_TARGETS)}")
        check(set(self.k_paths) <= {1, 2, 4}, "selection", "k_paths", "must be a list of 1, 2 or 4")
        check(set(self.inc_init) <= {"random", "base"}, "selection", "inc_init", "must be a list of random or base")
        for key in ("lambda1", "lambda2", "lambda3"):
            check(min(getattr(self, key)) >= 0, "selection", key, "must be >= 0")
