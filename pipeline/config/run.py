"""The validated `Config` of a run: the layers of `pipeline.config.layers` merged into the sections of
`pipeline.config.sections`, the checks between sections and against the data, and what each DVC stage reads of it
(STAGE_KEYS)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config.data_section import DataConfig
from pipeline.config.fields import check
from pipeline.config.layers import RUN_SECTION_TYPES, SECTIONS, nest, read_yaml, resolve_params, variant_nonzero
from pipeline.config.sections import BaseConfig, ExtractConfig, IncrementalConfig, ModelConfig, TopLevel
from pipeline.errors import FSCILError
from pipeline.ops.scan_dispatch import SCAN_CHOICES
from pipeline.precision import PRECISIONS


@dataclass(kw_only=True)
class Config(TopLevel):
    """The run: its top-level keys (`TopLevel`) and its sections."""

    data: DataConfig
    model: ModelConfig
    base: BaseConfig
    extract: ExtractConfig
    incremental: IncrementalConfig
    origins: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    """Dotted key -> the layer its value came from (module docstring)."""

    @property
    def method(self) -> str:
        """What ran, in words: the variant on the preset (`preset <name>` alone when no variant is named)."""
        return f"{self.variant or 'preset values'} on {self.preset}"

    def to_dict(self, for_digest: bool = False) -> dict[str, Any]:
        """Every value; for_digest: the sections as digests hash them (`SectionConfig.digest_values`)."""
        out = {"preset": self.preset, "seed": self.seed, "device": self.device, "deterministic": self.deterministic,
               "scan": self.scan, "precision": self.precision, "threads": self.threads,
               "nproc_per_node": self.nproc_per_node, "variant": self.variant}
        if for_digest:
            del out["nproc_per_node"]  # results do not depend on it (tests/test_distributed.py)
        if for_digest and self.device == "cpu":
            del out["deterministic"], out["scan"]  # a CPU run reads neither (stored runs keep their keys)
        for name in SECTIONS:
            section = getattr(self, name)
            out[name] = section.digest_values() if for_digest else section.values()
        return out


# what each dvc.yaml stage reads of the resolved config. `fscil stage config` writes every resolved value to
# data/config/run.yaml and, for each stage, these keys to data/config/<stage>.yaml, the file that stage depends on
# (tests/test_dvc_deps.py checks dvc.yaml against this table): a changed value re-runs exactly its readers.
# `device` is written resolved (auto -> cpu or cuda), so a run moved to a GPU re-runs the stages that compute.
STAGE_KEYS = {
    "prepare": ("seed", "data", "sessions"),
    "base": ("seed", "threads", "device", "deterministic", "scan", "precision", "data", "model", "base"),
    "extract": ("seed", "threads", "device", "deterministic", "scan", "precision", "data", "model", "base", "extract"),
    "incremental": ("seed", "threads", "device", "deterministic", "scan", "precision", "data", "model", "base",
                    "extract", "incremental"),
    "report": ("preset", "variant", "method", "seed", "model.projector"),
}


def run_values(cfg: Config, device: str | None = None) -> dict[str, Any]:
    """Every resolved value as data/config/run.yaml holds it: the run's identity (preset, variant, method), the
    top-level keys (`device` as resolved on this machine when given) and the run sections."""
    out = {"preset": cfg.preset, "variant": cfg.variant, "method": cfg.method, **cfg.to_dict(),
           "sessions": cfg.sessions}
    out["device"] = device or cfg.device
    return out


def stage_values(values: dict[str, Any], stage: str) -> dict[str, Any]:
    """What data/config/<stage>.yaml holds: the part of `run_values` that `stage` reads (STAGE_KEYS; a dotted key
    such as model.projector keeps its section around it)."""
    out: dict[str, Any] = {}
    for key in STAGE_KEYS[stage]:
        section, _, name = key.partition(".")
        if name:
            out.setdefault(section, {})[name] = values[section][name]
        else:
            out[key] = values[key]
    return out


def session_map(count: int, data_dir: str = "data") -> dict[str, str]:
    """params.yaml `sessions` for `count` incremental sessions: session -> the stage output it starts from (dvc.yaml
    makes one stage incremental@N per entry and orders them by these paths)."""
    return {str(n): f"{data_dir}/features.zarr" if n == 1 else f"{data_dir}/sessions/session_{n - 1}"
            for n in range(1, count + 1)}


def config_from_values(values: dict[str, Any]) -> Config:
    """The Config of a run from its recorded values (`Config.to_dict`, as a model file keeps them), validated."""
    try:
        return _build({**values, "sessions": values.get("sessions")})
    except (KeyError, TypeError) as err:
        raise FSCILError(f"the recorded run values cannot be read as a config ({err})") from None


def head_classes(cfg: Config, protocol) -> int:
    """The classes the head is built for at base training: model.num_classes, or the protocol's total (null)."""
    return cfg.model.num_classes or protocol.num_classes


def check_session_map(sessions: Any) -> dict[str, str] | None:
    """Validate params.yaml `sessions` (None when absent): quoted keys "1".."N", each with its predecessor."""
    if sessions is None:
        return None
    if not isinstance(sessions, dict) or not sessions:
        raise FSCILError("params: sessions must map each incremental session to what it starts from "
                         "(`fscil config sessions --count N` prints it)")
    if any(not isinstance(k, str) for k in sessions):
        raise FSCILError('params: sessions keys must be quoted ("1": ...): DVC makes no stage for unquoted numbers '
                         "(`fscil config sessions --count N` prints the block)")
    want = session_map(len(sessions))
    if sessions != want:
        bad = next(k for k in [*want, *sessions] if sessions.get(k) != want.get(k))
        raise FSCILError(f"params: sessions[{bad!r}] must be {want.get(bad)!r} for {len(sessions)} sessions "
                         f"(`fscil config sessions --count {len(sessions)}` prints the block)")
    return dict(sessions)


def check_against_data(cfg: Config, protocol) -> None:
    """Every combination of the config and the data's protocol that could not run, as a one-line error naming the key
    (called by stages prepare and base, once the class count is known, never after work has started)."""
    num_classes, num_incremental = protocol.num_classes, protocol.num_incremental
    check(cfg.model.num_classes is None or cfg.model.num_classes >= num_classes, "model", "num_classes",
          f"must be >= the {num_classes} classes of the data (or null), got {cfg.model.num_classes}")
    if cfg.model.classifier == "etf":
        room = head_classes(cfg, protocol)
        check(room <= cfg.model.dim, "model", "dim",
              f"must be >= the {room} classes the head has room for with an ETF classifier (it is {cfg.model.dim}); "
              "raise it or set model.classifier linear")
    check(num_classes >= 2, "data", "dataset", f"has {num_classes} class; FSCIL needs at least 2")
    base_train = len(protocol.sessions[0].train_ids)
    check(cfg.base.batch_size <= base_train, "base", "batch_size",
          f"must be <= the {base_train} base training images (it is {cfg.base.batch_size})")
    for key in ("steps", "base_copy"):
        values = getattr(cfg.incremental, key)
        check(len(values) == 1 or len(values) >= num_incremental, "incremental", key,
              f"lists {len(values)} values: give one, or one per session ({num_incremental})")
    check_sessions_match(cfg, num_incremental)


def check_sessions_match(cfg: Config, num_incremental: int) -> None:
    """params.yaml `sessions` (when given) must list exactly the data protocol's incremental sessions."""
    if cfg.sessions is not None and len(cfg.sessions) != num_incremental:
        raise FSCILError(f"params: sessions lists {len(cfg.sessions)} incremental sessions but the data's protocol has "
                         f"{num_incremental}; replace it with `fscil config sessions --count {num_incremental}`")


def preset_model_config(preset: str, overrides: dict[str, Any]) -> tuple[ModelConfig, dict[str, Any]]:
    """A preset's model section with non-null `overrides`, validated alone (the preset's data paths are not needed).

    Returns (ModelConfig, the merged params as sections).
    """
    values, _ = resolve_params({"preset": preset, "model": {k: v for k, v in overrides.items() if v is not None}})
    merged = nest(values)
    return ModelConfig.from_dict(merged["model"]), merged


def with_origin(err: FSCILError, origins: dict[str, str]) -> FSCILError:
    """A section's one-line error with the origin of the key it names appended."""
    text = str(err)
    key = text.removeprefix("params: ").split(" ", 1)[0]
    if key in origins and text.startswith("params: "):
        where = "not set: no layer gives it a value" if origins[key] == "default" else f"set by {origins[key]}"
        return FSCILError(f"{text} ({where})")
    return err


def build_config(params: dict[str, Any], overrides: list[str] | tuple[str, ...] = (),
                 source: str = "params.yaml") -> Config:
    """`params` (a params file's mapping, named `source` in errors) and `-S` overrides over their preset and variant
    (module docstring), validated."""
    values, origins = resolve_params(params, overrides, source)
    try:
        cfg = _build(nest(values))
        cfg.origins = origins
        check_combination(cfg)
        for key in variant_nonzero(cfg.variant):
            section, name = key.split(".")
            check(getattr(getattr(cfg, section), name) > 0, section, name,
                  f"must be > 0 with variant {cfg.variant} (pipeline/variants/{cfg.variant}.yaml: its method trains "
                  "with it), got 0")
    except FSCILError as err:
        raise with_origin(err, origins) from None
    return cfg


def _build(merged: dict[str, Any]) -> Config:
    seed = merged["seed"]
    check(isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0, "", "seed",
          "must be a non-negative integer")
    device = merged["device"]
    check(device in ("auto", "cpu", "cuda") or str(device).startswith("cuda:"), "", "device",
          "must be auto, cpu or cuda[:N]")
    deterministic = merged["deterministic"]
    check(isinstance(deterministic, bool), "", "deterministic", "must be true or false")
    scan = merged["scan"]
    check(scan in SCAN_CHOICES, "", "scan", f"must be one of {', '.join(SCAN_CHOICES)}")
    precision = merged["precision"]
    check(precision in PRECISIONS, "", "precision", f"must be one of {', '.join(PRECISIONS)}")
    nproc = merged["nproc_per_node"]
    check(isinstance(nproc, int) and not isinstance(nproc, bool) and nproc >= 1, "", "nproc_per_node",
          "must be a positive integer")
    threads = merged["threads"]
    check(isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1, "", "threads",
          "must be a positive integer")
    sections = {name: cls.from_dict(merged[name]) for name, cls in RUN_SECTION_TYPES.items()}
    return Config(preset=merged["preset"], seed=seed, device=device, threads=threads, variant=merged["variant"],
                  sessions=check_session_map(merged["sessions"]), deterministic=deterministic, scan=scan,
                  precision=precision, nproc_per_node=nproc, **sections)


def check_combination(cfg: Config) -> None:
    """The rules between sections (each section checks its own values when it is built): for build_config and for
    every config the selection derives from one."""
    if cfg.model.projector == "single_ssm":
        # with one branch the class-sensitive losses would act on g_base, the branch that carries the base
        # classes; the paper's row 2 has none (variant single_ssm)
        for key in ("lambda1", "lambda2", "lambda3"):
            check(getattr(cfg.incremental, key) == 0, "incremental", key,
                  "must be 0 with model.projector single_ssm (it has no g_inc to regularise; use variant single_ssm)")
    check(cfg.incremental.deviation_prob == 0 or cfg.extract.deviations > 0, "incremental", "deviation_prob",
          "needs base deviations in the feature store: set extract.deviations > 0")
    check(cfg.incremental.inc_init == "random" or cfg.model.projector not in ("single_ssm", "expanding_mlp"),
          "incremental", "inc_init", f"must be random with model.projector {cfg.model.projector} (it has no single "
          "g_inc to start from g_base)")
    check(not cfg.incremental.vertex_match or cfg.model.classifier == "etf", "incremental", "vertex_match",
          "needs model.classifier etf (a linear head has no fixed vertices to give)")


def load_config(path: str | Path = "params.yaml", overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """The params file at `path` with `-S` overrides, resolved and validated."""
    return build_config(read_yaml(Path(path)), overrides, source=str(path))
