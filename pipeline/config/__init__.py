"""The run's configuration, one package: `fields` (a section dataclass that validates itself), `sections` and
`data_section` (each params.yaml section a run reads, one dataclass, a key declared once with its docstring),
`layers` (the precedence rule: which layer sets each value, `LAYERS`), `run` (the validated `Config` and what each
DVC stage reads of it)."""

from pipeline.config.layers import (
    LAYERS,
    PRESET_DIR,
    RUN_SECTION_TYPES,
    SECTIONS,
    TOOL_SECTIONS,
    VARIANT_DIR,
    available_presets,
    available_variants,
    describe_file,
    dump_yaml,
    flatten,
    load_yaml_text,
    nest,
    read_preset,
    read_yaml,
    resolve_params,
    variant_keys,
)
from pipeline.config.run import (
    STAGE_KEYS,
    Config,
    build_config,
    check_against_data,
    check_combination,
    check_session_map,
    check_sessions_match,
    load_config,
    preset_model_config,
    run_values,
    session_map,
    stage_values,
)

__all__ = [
    "LAYERS", "PRESET_DIR", "SECTIONS", "RUN_SECTION_TYPES", "STAGE_KEYS", "TOOL_SECTIONS", "VARIANT_DIR", "Config",
    "available_presets", "available_variants", "build_config", "check_against_data", "check_combination",
    "check_session_map", "check_sessions_match", "describe_file", "dump_yaml", "flatten", "load_config",
    "load_yaml_text", "nest",
    "preset_model_config", "read_preset", "read_yaml", "resolve_params", "run_values", "session_map", "stage_values",
    "variant_keys",
]
