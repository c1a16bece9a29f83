"""The layout's import direction, read from the code (every import statement, module level or inside a function):
stages / CLI -> research (pipeline/research) -> the method library (pipeline/*). The library never imports the
research tools or the stages, the models never read presets or files through the config, and the config code
imports no model, loss, store or training module."""

from __future__ import annotations

import ast
from pathlib import Path

from stages.dvc_deps import from_module

REPO = Path(__file__).resolve().parents[1]


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, absolute (relative imports resolved against its package)."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = from_module(node, package)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def modules(folder: str) -> dict[str, set[str]]:
    return {str(p.relative_to(REPO)): imports_of(p) for p in sorted((REPO / folder).rglob("*.py"))}


def offenders(folder: str, forbidden: tuple[str, ...], exclude: tuple[str, ...] = ()) -> list[str]:
    return [f"{path} imports {name}" for path, names in modules(folder).items()
            if not path.startswith(exclude) for name in sorted(names)
            if any(name == f or name.startswith(f + ".") for f in forbidden)]


def test_the_library_never_imports_the_research_tools_or_the_stages():
    assert offenders("pipeline", ("pipeline.research", "stages"), exclude=("pipeline/research/",)) == []


def test_the_research_tools_never_import_the_stages():
    assert offenders("pipeline/research", ("stages",)) == []


def test_models_ops_and_losses_read_no_presets_or_files_through_the_config():
    config = ("pipeline.config", "pipeline.config.layers", "pipeline.config.sections", "pipeline.config.data_section",
              "pipeline.config.run", "pipeline.research.selection_config")
    for folder in ("pipeline/models", "pipeline/ops", "pipeline/losses"):
        assert offenders(folder, config) == [], folder


def test_the_checker_sees_imports_inside_functions():
    names = imports_of(REPO / "stages" / "cli_tools.py")
    assert "pipeline.research.benchmark" in names and "pipeline.atomic" in names


def test_a_choice_key_accepts_exactly_its_registrys_names():
    """Every key bound to a registry (`choice`): each registered name is accepted, another is refused with the
    registry's names in the one-line error; no key keeps a list of its own."""
    import dataclasses

    import pytest

    from pipeline.config import RUN_SECTION_TYPES
    from pipeline.config.fields import choices
    from pipeline.errors import FSCILError
    from pipeline.registry import all_registries

    bound = {}
    for section, cls in RUN_SECTION_TYPES.items():
        for f in dataclasses.fields(cls):
            if (registry := choices(f)) is not None:
                bound[f"{section}.{f.name}"] = registry
                for name in registry:  # accepted as a name (other rules of the section may still want more keys)
                    try:
                        cls(**{f.name: name})
                    except FSCILError as err:
                        assert f"{section}.{f.name} must be one of" not in str(err), err
                with pytest.raises(FSCILError, match=rf"{section}.{f.name} must be one of {', '.join(registry)}"):
                    cls(**{f.name: "not_registered"})
    # every registry but the model's internal token mixers is some key's choices
    unbound = {n for n, r in all_registries().items() if all(r is not b for b in bound.values())}
    assert unbound == {"pipeline.models.registry.MIXERS"}, unbound


def test_the_config_imports_no_model_loss_store_training_or_kernel_code():
    """Checked in a fresh interpreter: building a config loads only config, data-description and registry modules
    (names and where their entries live, torch-free)."""
    import subprocess
    import sys

    code = ("import sys; from pipeline.config import build_config; build_config({}); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(('pipeline', 'torch')))))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.split()
    assert "torch" not in loaded
    assert not [m for m in loaded if m.startswith(("pipeline.models", "pipeline.losses", "pipeline.store",
                                                   "pipeline.training", "pipeline.ops", "pipeline.research"))
                and not m.endswith((".registry", "pipeline.ops.scan_dispatch")) and "." in m.removeprefix("pipeline.")]


def test_no_function_in_the_library_runs_over_60_lines():
    """Trainers read as named steps (data -> steps -> evaluation -> write), not as one long body."""
    long = []
    for path in sorted((REPO / "pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 60:
                long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} "
                            f"({node.end_lineno - node.lineno + 1} lines)")
    assert long == []
