"""Typed configuration: params.yaml over its preset and variant -> a validated `Config` of the sections in
pipeline/config_sections.py, plus the checks that need the data (`check_against_data`) and DVC's per-stage values.

params.yaml names a `preset` (pipeline/presets/<name>.yaml) that gives every key a value; any non-null key in
params.yaml overrides it. `load_config` merges the two and returns a validated `Config`; an unknown key, a wrong
type or an out-of-range value is an `FSCILError` that names it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.config_fields import SectionConfig, check
from pipeline.config_sections import (
    RUN_SECTION_TYPES,
    BaseConfig,
    DataConfig,
    ExtractConfig,
    IncrementalConfig,
    ModelConfig,
)
from pipeline.config_selection import SelectionConfig
from pipeline.errors import FSCILError

PRESET_DIR = Path(__file__).parent / "presets"
VARIANT_DIR = Path(__file__).parent / "variants"
# every params.yaml section and its dataclass, in params.yaml's order
SECTION_TYPES: dict[str, type[SectionConfig]] = {**RUN_SECTION_TYPES, "selection": SelectionConfig}
SECTIONS = tuple(SECTION_TYPES)


@dataclass
class Config:
    preset: str
    seed: int
    device: str
    threads: int
    variant: str | None
    data: DataConfig
    model: ModelConfig
    base: BaseConfig
    extract: ExtractConfig
    incremental: IncrementalConfig
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    sessions: dict[str, str] | None = None
    """params.yaml `sessions`: the incremental sessions `dvc repro` runs (dvc.yaml's foreach); None outside DVC."""
    deterministic: bool = True
    """CUDA only: bit-for-bit reruns in full float32 (true) or the faster kernels (false); `pipeline.device`."""

    def to_dict(self, for_digest: bool = False) -> dict[str, Any]:
        """Every value; for_digest: the sections as digests hash them (`SectionConfig.digest_values`)."""
        out = {"preset": self.preset, "seed": self.seed, "device": self.device, "deterministic": self.deterministic,
               "threads": self.threads, "variant": self.variant}
        if for_digest and self.device == "cpu":
            del out["deterministic"]  # a CPU run does not read it (stored runs keep their keys)
        for name in SECTIONS:
            section = getattr(self, name)
            out[name] = section.digest_values() if for_digest else dataclasses.asdict(section)
        return out


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def available_variants() -> list[str]:
    return sorted(p.stem for p in VARIANT_DIR.glob("*.yaml"))


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise FSCILError(f"{path}: no such file") from None
    except yaml.YAMLError as err:
        raise FSCILError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(values, dict):
        raise FSCILError(f"{path}: expected a mapping at the top level")
    return values


def variant_sections(variant: str | None) -> dict[str, dict[str, Any]]:
    """What a named variant (pipeline/variants/<name>.yaml) sets itself, by section ({} for none)."""
    if variant is None:
        return {}
    if variant not in available_variants():
        raise FSCILError(f"params: variant {variant!r} does not exist (choose from {', '.join(available_variants())})")
    return read_yaml(VARIANT_DIR / f"{variant}.yaml")


def variant_keys(variant: str | None) -> set[str]:
    """The dotted keys a named variant sets itself (they win over the preset, params and variant_params)."""
    return {f"{name}.{key}" for name, section in variant_sections(variant).items() for key in section}


def _variant_params(values: Any, where: str) -> dict[str, dict[str, dict[str, Any]]]:
    """`variant_params: {<variant>: {<section>: {<key>: value}}}` checked for known variants and sections, and each
    section's values by that section's own rules (on every run, not only the variant's)."""
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise FSCILError(f"{where}: variant_params must be a mapping of variant names to params sections")
    for variant, sections in values.items():
        if variant not in available_variants():
            raise FSCILError(f"{where}: variant_params names variant {variant!r}, which does not exist "
                             f"(choose from {', '.join(available_variants())})")
        if not isinstance(sections, dict) or not all(isinstance(v, dict) for v in sections.values()):
            raise FSCILError(f"{where}: variant_params.{variant} must map params sections to mappings")
        for name, section in sections.items():
            if name not in SECTION_TYPES:
                raise FSCILError(f"{where}: variant_params.{variant}.{name} is not a params section "
                                 f"(valid: {', '.join(SECTIONS)})")
            try:  # the section's own key, type and range rules, on these values alone
                SECTION_TYPES[name].from_dict(section)
            except FSCILError as err:
                raise FSCILError(f"{where}: variant_params.{variant}: {str(err).removeprefix('params: ')}") from None
    return values


def resolve_params(params: dict[str, Any]) -> dict[str, Any]:
    """Merge params (nulls mean "the preset's value") over the named preset, then, for a named variant (params', else
    the preset's own `variant`), the values chosen for it (`variant_params`) and the variant's own keys; returns
    plain dicts."""
    params = dict(params)
    top = ("preset", "variant", "seed", "device", "deterministic", "threads", "sessions", "variant_params")
    unknown = sorted(set(params) - {*top, *SECTIONS})
    if unknown:
        raise FSCILError(f"params: unknown key {unknown[0]} (valid: {', '.join(top)}, {', '.join(SECTIONS)})")
    preset = params.get("preset") or "synthetic"
    if preset not in available_presets():
        raise FSCILError(f"params: preset {preset!r} does not exist (choose from {', '.join(available_presets())})")
    merged = read_yaml(PRESET_DIR / f"{preset}.yaml")
    merged["preset"] = preset
    # the row a preset's selection chose as its method (omniglot: dual_ssm), run when params name no variant
    preset_variant = merged.pop("variant", None)
    # values chosen for one named variant (`fscil select` run with that variant): the preset's, then params.yaml's
    per_variant = [_variant_params(merged.pop("variant_params", None), f"preset {preset}"),
                   _variant_params(params.get("variant_params"), "params")]
    for key in ("seed", "device", "deterministic", "threads"):
        if params.get(key) is not None:
            merged[key] = params[key]
    for name in SECTIONS:
        section = params.get(name) or {}
        if not isinstance(section, dict):
            raise FSCILError(f"params: {name} must be a mapping")
        merged.setdefault(name, {})
        merged[name].update({k: v for k, v in section.items() if v is not None})
    variant = params.get("variant") or preset_variant
    # a named ablation row (pipeline/variants/<name>.yaml) is what its name says: the keys it sets (projector, which
    # losses are off) win over the preset, params.yaml and the values selected for it; every other key comes from them
    own = variant_sections(variant)
    if variant is not None:
        for source in per_variant:
            for name, section in source.get(variant, {}).items():
                merged[name].update({k: v for k, v in section.items() if v is not None})
    for name, section in own.items():
        merged.setdefault(name, {}).update(section)
    merged["variant"] = variant
    merged["sessions"] = params.get("sessions")
    return merged


# what each dvc.yaml stage reads of the resolved config; `fscil stage config` writes one file per stage, and each
# stage depends on its file, so a changed value (in params.yaml, a preset or a variant) re-runs exactly its readers
STAGE_KEYS = {
    "prepare": ("seed", "data", "sessions"),
    "base": ("seed", "threads", "data", "model", "base"),
    "extract": ("seed", "threads", "data", "model", "base", "extract"),
    "incremental": ("seed", "threads", "data", "model", "base", "incremental"),
}


def stage_config(cfg: Config, stage: str) -> dict[str, Any]:
    """The resolved values `stage` reads (STAGE_KEYS), as plain data."""
    full = {**cfg.to_dict(), "sessions": cfg.sessions}
    return {key: full[key] for key in STAGE_KEYS[stage]}


def session_map(count: int, data_dir: str = "data") -> dict[str, str]:
    """params.yaml `sessions` for `count` incremental sessions: session -> the stage output it starts from (dvc.yaml
    makes one stage incremental@N per entry and orders them by these paths)."""
    return {str(n): f"{data_dir}/features.zarr" if n == 1 else f"{data_dir}/sessions/session_{n - 1}"
            for n in range(1, count + 1)}


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
    if cfg.model.classifier == "etf":
        check(num_classes <= cfg.model.dim, "model", "dim",
              f"must be >= the {num_classes} classes of the data for an ETF classifier (it is {cfg.model.dim}); "
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

    Returns (ModelConfig, the merged params as plain dicts).
    """
    merged = resolve_params({"preset": preset, "model": {k: v for k, v in overrides.items() if v is not None}})
    return ModelConfig.from_dict(merged["model"]), merged


def build_config(params: dict[str, Any]) -> Config:
    merged = resolve_params(params)
    seed = merged.get("seed", 0)
    check(isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0, "", "seed",
           "must be a non-negative integer")
    device = merged.get("device", "auto")
    check(device in ("auto", "cpu", "cuda") or str(device).startswith("cuda:"), "", "device",
           "must be auto, cpu or cuda[:N]")
    deterministic = merged.get("deterministic", True)
    check(isinstance(deterministic, bool), "", "deterministic", "must be true or false")
    data = dict(merged["data"])
    data.setdefault("seed", seed)
    threads = merged.get("threads", 2)
    check(isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1, "", "threads",
          "must be a positive integer")
    cfg = Config(preset=merged["preset"], seed=seed, device=device, threads=threads, variant=merged.get("variant"),
                 data=DataConfig.from_dict(data),
                 model=ModelConfig.from_dict(merged["model"]), base=BaseConfig.from_dict(merged["base"]),
                 extract=ExtractConfig.from_dict(merged["extract"]),
                 incremental=IncrementalConfig.from_dict(merged["incremental"]),
                 selection=SelectionConfig.from_dict(merged["selection"]),
                 sessions=check_session_map(merged.get("sessions")), deterministic=deterministic)
    check_combination(cfg)
    return cfg


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


def load_config(path: str | Path = "params.yaml") -> Config:
    return build_config(read_yaml(Path(path)))
