"""The layout's import direction, read from the code (every import statement, module level or inside a function):
stages / CLI -> research (pipeline/research) -> the method library (pipeline/*). The library never imports the
research tools or the stages, the models never read presets or files through the config, and the config code
imports no model, loss, store or training module."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, absolute (relative imports resolved against its package)."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
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
    config = ("pipeline.config", "pipeline.config_layers", "pipeline.config_sections", "pipeline.config_selection")
    for folder in ("pipeline/models", "pipeline/ops", "pipeline/losses"):
        assert offenders(folder, config) == [], folder


def test_the_checker_sees_imports_inside_functions():
    names = imports_of(REPO / "stages" / "cli_tools.py")
    assert "pipeline.research.benchmark" in names and "pipeline.atomic" in names


def test_each_registry_is_keyed_by_the_names_the_config_accepts():
    from pipeline import names
    from pipeline.losses.class_sensitive import SEPARATION_FORMS, SUPPRESSION_FORMS, SUPPRESSION_TARGETS
    from pipeline.losses.classification import DR_WEIGHTINGS
    from pipeline.models.backbones import BACKBONES
    from pipeline.models.classifier import HEADS
    from pipeline.models.mixers import SSM_BRANCHES
    from pipeline.models.projector import PROJECTOR_KINDS
    from pipeline.ops.selective_scan import SCAN_CHOICES
    from pipeline.training.schedule import SCHEDULES

    assert tuple(BACKBONES) == names.BACKBONES and tuple(PROJECTOR_KINDS) == names.PROJECTORS
    assert tuple(HEADS) == names.HEADS and tuple(SUPPRESSION_TARGETS) == names.SUPPRESSION_TARGETS
    assert tuple(SUPPRESSION_FORMS) == names.SUPPRESSION_FORMS and tuple(SEPARATION_FORMS) == names.SEPARATION_FORMS
    assert tuple(DR_WEIGHTINGS) == names.DR_WEIGHTINGS and tuple(SCHEDULES) == names.SCHEDULES
    assert tuple(SSM_BRANCHES) == names.SSM_BRANCHES
    assert SCAN_CHOICES is names.SCAN_CHOICES


def test_the_config_imports_no_model_loss_store_training_or_kernel_code():
    """Checked in a fresh interpreter: building a config loads only config, data-description and name modules."""
    import subprocess
    import sys

    code = ("import sys; from pipeline.config import build_config; build_config({}); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(('pipeline', 'torch')))))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.split()
    assert "torch" not in loaded
    assert not [m for m in loaded if m.startswith(("pipeline.models", "pipeline.losses", "pipeline.store",
                                                   "pipeline.training", "pipeline.ops", "pipeline.research"))]


def test_no_function_in_the_library_runs_over_60_lines():
    """Trainers read as named steps (data -> steps -> evaluation -> write), not as one long body."""
    long = []
    for path in sorted((REPO / "pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 60:
                long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} "
                            f"({node.end_lineno - node.lineno + 1} lines)")
    assert long == []
