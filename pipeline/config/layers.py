"""The precedence rule: which layer sets each params value, written once here (`LAYERS`; README "Configuration" and
params.yaml point here). Each later layer replaces the earlier ones' values, key by key; the user's layers (the
params file and -S) are never silently replaced: where the variant fixes a key the user also set to another value,
loading stops with a one-line error naming both. Every resolved value keeps its origin (`fscil config show
--origin`). Also: reading the preset and variant files, flattening params mappings to dotted keys with one-line
errors, and `-S` overrides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config.sections import RUN_SECTION_TYPES, TopLevel
from pipeline.errors import FSCILError

PRESET_DIR = Path(__file__).parents[1] / "presets"
VARIANT_DIR = Path(__file__).parents[1] / "variants"
SECTIONS = tuple(RUN_SECTION_TYPES)  # every params.yaml section a run reads, in params.yaml's order
# sections the run does not read: their values go through the same layers, and the command that reads them checks
# them (`selection`: `fscil select`, pipeline/research/selection_config.py)
TOOL_SECTIONS = ("selection",)
# weakest first: (the origin `fscil config show --origin` prints, what the layer holds)
LAYERS = (
    ("default", "the field's default (pipeline/config/sections.py, data_section.py): the paper's value, or the "
                "authors' CIFAR-100 value where the paper gives none"),
    ("preset <name>", "pipeline/presets/<name>.yaml, over the preset it `extends`"),
    ("preset <name>: variant_params.<variant>", "what `fscil select` chose for the named variant on that preset"),
    ("variant <name>", "pipeline/variants/<name>.yaml: the keys that make the method what its name says"),
    ("params.yaml: variant_params.<variant>", "the params file's own choices for the named variant"),
    ("params.yaml", "the params file (--params FILE): a key that is present is set, null included"),
    ("-S", "section.key=value on the command line (`dvc exp run -S` syntax)"),
)
# the top-level keys and their defaults (`variant_params` is a layer of its own, not a value)
TOP_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(TopLevel)}
TOP_KEYS = (*TOP_DEFAULTS, "variant_params")
# what a variant file may hold besides params sections: the dotted keys its method needs above zero
VARIANT_NONZERO = "nonzero"


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def available_variants() -> list[str]:
    return sorted(p.stem for p in VARIANT_DIR.glob("*.yaml"))


def load_yaml_text(text: str) -> Any:
    """YAML as DVC reads and writes params.yaml: YAML 1.2 (ruamel.yaml's safe loader, `dvc exp run -S` writes
    `1e-05`), where `1e-5`, `5e-4` and `1.0e-05` are numbers (YAML 1.1, PyYAML's, reads the first two as strings) and
    `yes` / `no` are strings. A duplicated key is an error, not the last value."""
    from ruamel.yaml import YAML

    return YAML(typ="safe", pure=True).load(text)


def dump_yaml(values: dict[str, Any]) -> str:
    """`values` as YAML 1.2 in their own key order, the way DVC writes params.yaml (`1e-05`, not PyYAML's `1.0e-05`):
    what `fscil config show` prints reads back the same through `load_yaml_text`."""
    import io

    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False
    out = io.StringIO()
    yaml.dump(values, out)
    return out.getvalue()


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping from `path` (`load_yaml_text`); a missing or unreadable file or a syntax error is one line
    naming the line."""
    from ruamel.yaml import YAMLError

    try:
        values = load_yaml_text(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise FSCILError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise FSCILError(f"{path}: is a directory, not a YAML file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise FSCILError(f"{path}: cannot be read ({err.__class__.__name__})") from None
    except YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).strip().splitlines()[0]
        raise FSCILError(f"{path}: not valid YAML ({where}{problem})") from None
    if not isinstance(values, dict):
        raise FSCILError(f"{path}: expected a mapping at the top level")
    return values


def preset_chain(name: str, seen: tuple[str, ...] = ()) -> list[tuple[str, dict[str, Any]]]:
    """[(preset name, its file's values)] from the preset it extends (first) to `name` (last): a preset with
    `extends: <preset>` is that preset with its own values on top."""
    if name not in available_presets():
        where = f"preset {seen[-1]}: extends preset" if seen else "params: preset"
        raise FSCILError(f"{where} {name!r} does not exist (choose from {', '.join(available_presets())})")
    if name in seen:
        raise FSCILError(f"preset {name}: extends itself ({' -> '.join((*seen, name))})")
    values = read_yaml(PRESET_DIR / f"{name}.yaml")
    parent = values.pop("extends", None)
    if parent is not None and not isinstance(parent, str):
        raise FSCILError(f"preset {name}: extends must name a preset, got {parent!r}")
    return ([] if parent is None else preset_chain(parent, (*seen, name))) + [(name, values)]


def read_preset(name: str) -> dict[str, Any]:
    """A preset's values as they apply (the presets it extends merged under it, key by key)."""
    merged: dict[str, Any] = {}
    for _, values in preset_chain(name):
        merged = _merge(merged, values)
    return merged


def _merge(low: dict[str, Any], high: dict[str, Any]) -> dict[str, Any]:
    """`high` over `low`, mappings merged key by key (params sections, variant_params)."""
    out = dict(low)
    for key, value in high.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def describe_file(path: Path, limit: int = 110) -> str:
    """The first comment line of a preset or variant file (what `fscil list` prints)."""
    for line in Path(path).read_text().splitlines():
        if line.startswith("#"):
            text = line.lstrip("# ").strip()
            return text if len(text) <= limit else text[: limit - 3] + "..."
    return ""


def _variant_file(variant: str) -> dict[str, Any]:
    if variant not in available_variants():
        raise FSCILError(f"params: variant {variant!r} does not exist (choose from {', '.join(available_variants())})")
    return read_yaml(VARIANT_DIR / f"{variant}.yaml")


def variant_sections(variant: str | None) -> dict[str, dict[str, Any]]:
    """What a named variant (pipeline/variants/<name>.yaml) sets itself, by section ({} for none)."""
    if variant is None:
        return {}
    return {k: v for k, v in _variant_file(variant).items() if k != VARIANT_NONZERO}


def variant_keys(variant: str | None) -> set[str]:
    """The dotted keys a named variant fixes (a user's other value for one of them is an error)."""
    return {f"{name}.{key}" for name, section in variant_sections(variant).items() for key in section}


def variant_nonzero(variant: str | None) -> list[str]:
    """The dotted keys a variant's method needs above zero (mamba_fscil: both class-sensitive losses on)."""
    return list(_variant_file(variant).get(VARIANT_NONZERO, [])) if variant else []


def flatten(values: dict[str, Any], where: str, top: bool = True) -> dict[str, Any]:
    """A params mapping as {dotted key: value}, every key checked against the sections' fields (one-line errors that
    name `where`); `variant_params` is left out (a layer of its own)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in RUN_SECTION_TYPES or key in TOOL_SECTIONS:
            if value is None:  # `model:` with nothing under it
                continue
            if not isinstance(value, dict):
                raise FSCILError(f"{where}: {key} must be a mapping of keys to values")
            names = [f.name for f in dataclasses.fields(RUN_SECTION_TYPES[key])] if key in RUN_SECTION_TYPES else None
            for sub, v in value.items():
                if names is not None and sub not in names:  # a tool's section: checked by that tool
                    raise FSCILError(f"{where}: unknown key {key}.{sub} (valid: {', '.join(names)})")
                out[f"{key}.{sub}"] = v
        elif top and key in TOP_DEFAULTS:
            out[key] = value
        elif not (top and key == "variant_params"):
            sections = ", ".join((*SECTIONS, *TOOL_SECTIONS))
            valid = f"{', '.join(TOP_KEYS)}, {sections}" if top else sections
            raise FSCILError(f"{where}: unknown key {key} (valid: {valid})")
    return out


REMOVED = object()
"""The value of a `-S ~key` override: the key is taken out of the params file's layer (the layers below set it)."""


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`-S` overrides read with the grammar `dvc exp run -S` uses (hydra's override parser), so that a value means
    in `fscil` what it means in DVC: `key=value` (numbers such as `1e-5`, `null`, `[1, 2]`, quoted strings),
    `+key=value` / `++key=value` (a key new to params.yaml: the same here), `~key` (the key out of the params file:
    {dotted key: REMOVED}). A sweep (`key=1,2`) is refused: one run takes one value."""
    if not overrides:  # hydra's parser costs ~0.2 s to import: not on the stages' usual path
        return {}
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    out: dict[str, Any] = {}
    for item in overrides:
        try:
            (parsed,) = parser.parse_overrides([item])
        except HydraException as err:
            hint = " (quote a value with special characters: key='value')" if "=" in item else ""
            raise FSCILError(f"-S {item}: expected section.key=value as dvc exp run -S reads it, e.g. "
                             f"-S incremental.lambda1=50{hint}: {str(err).strip().splitlines()[0]}") from None
        if parsed.is_sweep_override():
            raise FSCILError(f"-S {item}: a sweep of several values; one run takes one value "
                             "(dvc exp run --queue -S runs one experiment a value)")
        key = parsed.key_or_group
        if parsed.package is not None:
            raise FSCILError(f"-S {item}: expected section.key=value (no @package)")
        out[key] = REMOVED if parsed.is_delete() else parsed.value()
    nested: dict[str, Any] = {}
    for key, value in out.items():
        section, dot, sub = key.partition(".")
        if dot:
            nested.setdefault(section, {})
            if not isinstance(nested[section], dict):
                raise FSCILError(f"-S {key}: {section} is not a params section")
            nested[section][sub] = value
        else:
            nested[key] = value
    return flatten(nested, "-S")


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
        flatten(sections, f"{where}: variant_params.{variant}", top=False)
        for name, section in sections.items():
            if name not in RUN_SECTION_TYPES:  # a tool's section: checked by that tool
                continue
            try:  # the section's own type and range rules, on these values alone
                RUN_SECTION_TYPES[name].from_dict(section)
            except FSCILError as err:
                raise FSCILError(f"{where}: variant_params.{variant}: {str(err).removeprefix('params: ')}") from None
    return values


def _defaults() -> dict[str, Any]:
    """Layer 1: every top-level key and section field at its default."""
    out = dict(TOP_DEFAULTS)
    for name, cls in RUN_SECTION_TYPES.items():
        for key, value in dataclasses.asdict(cls()).items():
            out[f"{name}.{key}"] = value
    return out


@dataclass(frozen=True)
class Layer:
    origin: str
    values: dict[str, Any]
    user: bool = False
    """The user's own values: never silently replaced (a conflict with the variant is an error)."""


def _show(value: Any) -> str:
    return "null" if value is None else str(value)


def resolve_params(params: dict[str, Any], overrides: list[str] | tuple[str, ...] = (),
                   source: str = "params.yaml") -> tuple[dict[str, Any], dict[str, str]]:
    """The layers of the module docstring merged: ({dotted key: value}, {dotted key: origin})."""
    if not isinstance(params, dict):
        raise FSCILError(f"{source}: expected a mapping at the top level")
    user = flatten(params, source)
    cli = parse_overrides(overrides)
    for key in [k for k, v in cli.items() if v is REMOVED]:  # -S ~key: the params file's value taken out
        if key not in user:
            raise FSCILError(f"-S ~{key}: {source} does not set {key}, so there is nothing to remove")
        del user[key], cli[key]
    chosen = {**user, **cli}
    chain = preset_chain(chosen.get("preset", TOP_DEFAULTS["preset"]))
    variant = chosen.get("variant", TOP_DEFAULTS["variant"])
    if variant is not None and not isinstance(variant, str):
        raise FSCILError(f"params: variant must be a variant name or null, got {variant!r}")
    preset_layers, selected_layers = [], []  # each preset of the chain, the one it extends first
    for name, preset_values in chain:
        where = f"preset {name}"
        for key in ("preset", "variant", "sessions"):
            if key in preset_values:
                raise FSCILError(f"{where}: a preset does not set {key} (params.yaml does)")
        preset_selected = _variant_params(preset_values.pop("variant_params", None), where)
        preset_layers.append(Layer(where, flatten(preset_values, where)))
        if variant is not None:
            selected_layers.append(Layer(f"{where}: variant_params.{variant}",
                                         flatten(preset_selected.get(variant, {}), where, top=False)))
    user_selected = _variant_params(params.get("variant_params"), source)
    fixed = Layer(f"variant {variant}", flatten(variant_sections(variant), f"variant {variant}", top=False))
    layers = [Layer("default", _defaults()), *preset_layers, *selected_layers, fixed]
    if variant is not None:
        layers.append(Layer(f"{source}: variant_params.{variant}",
                            flatten(user_selected.get(variant, {}), source, top=False), user=True))
    layers += [Layer(source, user, user=True), Layer("-S", cli, user=True)]
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for layer in layers:
        for key, value in layer.values.items():
            if layer is not fixed and key in fixed.values and value != fixed.values[key] and layer.origin != "default":
                if layer.user:
                    raise FSCILError(f"params: {key} = {_show(value)} ({layer.origin}) conflicts with variant "
                                     f"{variant}, which fixes it at {_show(fixed.values[key])} "
                                     f"(pipeline/variants/{variant}.yaml); remove one of them")
                if layer.origin.endswith(f"variant_params.{variant}"):
                    raise FSCILError(f"{layer.origin} sets {key}, which variant {variant} fixes")
            values[key] = value
            origins[key] = layer.origin
    if origins["data.seed"] == "default":  # the synthetic images and generated protocols follow the run's seed
        values["data.seed"], origins["data.seed"] = values["seed"], f"seed ({origins['seed']})"
    return values, origins


def nest(values: dict[str, Any]) -> dict[str, Any]:
    """{dotted key: value} back to params sections."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        section, dot, sub = key.partition(".")
        if dot:
            out.setdefault(section, {})[sub] = value
        else:
            out[key] = value
    return out


