"""The `selection` section of params.yaml: the pseudo-incremental protocol of `fscil select` and the candidate sets it
compares (pipeline/research/selection.py runs them). The run does not read it: its values go through the same layers
as the run's (`load_selection`), and `fscil select` and `fscil config show` check them.

Which run keys `fscil select` may search is declared once, in SEARCH; each gets a candidate-list field of the section,
typed as a list of its run key's type, empty (keep the configured value) or the paper's candidates, and every candidate
is checked by the rules of the section its key belongs to.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from pipeline.config.fields import SectionConfig, check, fail
from pipeline.config.layers import nest, resolve_params
from pipeline.config.run import with_origin
from pipeline.config.sections import LAST_EPOCHS_KEYS, RUN_SECTION_TYPES
from pipeline.errors import FSCILError


@dataclass(frozen=True)
class Search:
    """A run key `fscil select` may search: the selection field listing its candidates (`selection.<name>`: base_<key>
    for the base section's keys, else the key), the selection stage that chooses it and the paper's candidates (None:
    searched only when the user lists candidates)."""

    name: str
    stage: str
    key: str
    paper: tuple | None = None

    def __post_init__(self):
        section, key = self.key.split(".")
        if self.name != (f"base_{key}" if section == "base" else key):
            raise ValueError(f"selection.{self.name} must be named after the run key it searches, {self.key}")


# every run key `fscil select` can search (selection.<name>: its candidates), in the order it chooses them (paper
# appendix supp:hyperparameter_protocol; the base and schedule stages are ours and come first when candidates are
# listed). The schedule stage sets the memory before what is built from it: replay and copy act on the earlier
# classes' memory rows, and base_copy's best value depends on how many rows a class keeps.
SEARCH: tuple[Search, ...] = (
    Search("base_epochs", "base", "base.epochs"),
    Search("base_lr", "base", "base.lr"),
    Search("base_dr_scale", "base", "base.dr_scale"),
    Search("base_weight_decay", "base", "base.weight_decay"),
    Search("base_mixup_alpha", "base", "base.mixup_alpha"),
    Search("base_cutmix_alpha", "base", "base.cutmix_alpha"),
    Search("base_mix_prob", "base", "base.mix_prob"),
    Search("base_unmixed_epochs", "base", "base.unmixed_epochs"),
    Search("base_unaugmented_epochs", "base", "base.unaugmented_epochs"),
    Search("base_precise_bn", "base", "base.precise_bn"),
    Search("base_backbone_ce", "base", "base.backbone_ce"),
    Search("lr", "schedule", "incremental.lr"),
    Search("base_lr_scale", "schedule", "incremental.base_lr_scale"),
    Search("weight_decay", "schedule", "incremental.weight_decay"),
    Search("grad_clip_norm", "schedule", "incremental.grad_clip_norm"),
    Search("steps", "schedule", "incremental.steps"),
    Search("mixup_prob", "schedule", "incremental.mixup_prob"),
    Search("deviation_prob", "schedule", "incremental.deviation_prob"),
    Search("augmented_views", "schedule", "extract.augmented_views"),
    Search("memory", "schedule", "extract.memory"),
    Search("memory_k", "schedule", "extract.memory_k"),
    Search("replay", "schedule", "incremental.replay"),
    Search("copy", "schedule", "incremental.copy"),
    Search("base_copy", "schedule", "incremental.base_copy"),
    Search("freeze_base", "architecture", "incremental.freeze_base", (True, False)),
    Search("suppression", "architecture", "incremental.suppression", ("z", "silu_z", "mu_inc")),
    Search("k_paths", "architecture", "model.k_paths", (1, 2, 4)),
    Search("ssm_branch", "architecture", "model.ssm_branch"),
    Search("iden_linear", "architecture", "model.iden_linear"),
    Search("out_norm", "architecture", "model.out_norm"),
    Search("inc_init", "architecture", "incremental.inc_init", ("random", "base")),
    Search("vertex_match", "architecture", "incremental.vertex_match"),
    Search("lambda1", "loss_weights", "incremental.lambda1", (50.0, 100.0, 150.0, 200.0)),
    Search("lambda2", "loss_weights", "incremental.lambda2", (0.001, 0.01, 0.1, 1.0)),
    Search("lambda3", "loss_weights", "incremental.lambda3", (0.05, 0.1, 0.3, 0.5)),
)
SEARCHABLE = {s.name: s.key for s in SEARCH}  # selection field (its candidate list) -> run key
assert len(SEARCHABLE) == len(SEARCH), "two searched keys share a selection field name"


def _run_hint(key: str) -> typing.Any:
    section, name = key.split(".")
    return typing.get_type_hints(RUN_SECTION_TYPES[section])[name]


def _with_candidate_lists(cls: type) -> type:
    """Adds one field per entry of SEARCH before `dataclass` sees the class: list[the run key's type], default the
    paper's candidates (empty when the paper has none)."""
    for s in SEARCH:
        cls.__annotations__[s.name] = list[_run_hint(s.key)]
        setattr(cls, s.name, field(default_factory=lambda paper=s.paper: list(paper or ())))
    return cls


@dataclass
@_with_candidate_lists
class SelectionConfig(SectionConfig):
    """`fscil select`: the pseudo-incremental protocol built from the base session's training data and the candidate
    sets compared on it (paper appendix supp:hyperparameter_protocol). Besides the fields below, one candidate list
    per entry of SEARCH (selection.<name>: empty keeps the configured value)."""

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
        for s in SEARCH:
            self._check_candidates(s)

    def _check_candidates(self, s: Search) -> None:
        """Each candidate must be a valid value of its key (that section's own rule); a key the paper searches needs
        at least one candidate."""
        values = getattr(self, s.name)
        check(s.paper is None or len(values) >= 1, "selection", s.name, "must list at least one candidate")
        check(len({repr(v) for v in values}) == len(values), "selection", s.name, "lists a candidate twice")
        section, key = s.key.split(".")
        for value in values:
            # a count of last epochs is bounded by the run's base.epochs, checked when a candidate's config is built
            bound = {"epochs": max(value, 1)} if section == "base" and key in LAST_EPOCHS_KEYS else {}
            try:
                RUN_SECTION_TYPES[section](**{key: value, **bound})
            except FSCILError as err:
                fail("selection", s.name, f"lists {value!r}: {str(err).removeprefix('params: ')}")


def load_selection(params: dict[str, Any], overrides: list[str] | tuple[str, ...] = (),
                   source: str = "params.yaml") -> SelectionConfig:
    """The `selection` section as the layers of `pipeline.config.layers` resolve it (preset, variant_params, the
    params file, -S), checked: a one-line error names the key and the layer that set it."""
    values, origins = resolve_params(params, overrides, source)
    section = nest(values).get("selection", {})
    names = [f.name for f in dataclasses.fields(SelectionConfig)]
    for key in section:
        if key not in names:
            raise FSCILError(f"{origins[f'selection.{key}']}: unknown key selection.{key} (valid: {', '.join(names)})")
    try:
        return SelectionConfig.from_dict(section)
    except FSCILError as err:
        raise with_origin(err, origins) from None
