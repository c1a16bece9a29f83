"""dvc.yaml tells the truth: every stage depends on all the code its command imports (the import graph, read with
`ast`, lazy imports inside functions included) and on the resolved config values it reads."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from pipeline.config import STAGE_KEYS

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "stages")


def _module_file(dotted: str) -> Path | None:
    path = REPO.joinpath(*dotted.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _imported(tree: ast.AST, package: str) -> set[Path]:
    """Files of our packages that the statements in `tree` import (every prefix package's __init__ too)."""
    files = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] not in PACKAGES:
                continue
            files |= {f for i in range(1, len(parts) + 1) if (f := _module_file(".".join(parts[:i])))}
    return files


def import_closure(files: set[Path]) -> set[Path]:
    """`files` and everything they import from our packages, transitively."""
    seen: set[Path] = set()
    todo = list(files)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
        todo += _imported(ast.parse(path.read_text()), package) - seen
    return seen


def command_files(cmd: str) -> set[Path]:
    """What `stages/fscil stage <name> ...` runs: the launcher, the CLI with its module-level imports and the
    command function's own (lazy) imports, and stages/<name>.py."""
    words = cmd.split()
    assert words[0] in ("stages/fscil", "fscil") and words[1] == "stage", cmd
    name = words[2]
    cli = REPO / "stages" / "cli.py"
    tree = ast.parse(cli.read_text())
    top = ast.Module(body=[n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)], type_ignores=[])
    command = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and any(
        isinstance(d, ast.Call) and d.args and getattr(d.args[0], "value", None) == name
        and getattr(d.func, "attr", None) == "command" for d in n.decorator_list))
    calls = {n.func.id for n in ast.walk(command) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    helpers = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in calls]
    files = {REPO / "stages" / "paths.py"} | _imported(top, "stages")
    for node in [command, *helpers]:
        files |= _imported(node, "stages")
    # the other command modules (stages/cli_*.py): their module-level imports run, their commands' lazy ones do not
    tools = {f for f in files if f.parent == cli.parent and f.name.startswith("cli_") and f.name != "cli_common.py"}
    for tool in tools:
        tree = ast.parse(tool.read_text())
        files |= _imported(ast.Module(body=[n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)],
                                      type_ignores=[]), "stages")
    return {REPO / "stages" / "fscil", cli} | tools | import_closure(files - {cli} - tools)


def covered(path: Path, deps: list[str]) -> bool:
    rel = path.relative_to(REPO)
    return any(rel == Path(d) or Path(d) in rel.parents for d in deps)


def expanded_stages(dvc: dict) -> dict[str, dict]:
    """dvc.yaml's stages with foreach stages taken once (their deps do not depend on the item but for ${item})."""
    out = {}
    for name, stage in dvc["stages"].items():
        out[name] = stage["do"] if "foreach" in stage else stage
    return out


STAGES = expanded_stages(yaml.safe_load((REPO / "dvc.yaml").read_text()))


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_deps_cover_its_import_closure(name):
    stage = STAGES[name]
    deps = [d for d in stage["deps"] if "${" not in d]
    missing = sorted(str(f.relative_to(REPO)) for f in command_files(stage["cmd"])
                     if f.stat().st_size and not covered(f, deps))
    assert not missing, f"dvc.yaml stage {name} imports files not in its deps: {missing}"


@pytest.mark.parametrize("name", sorted(STAGE_KEYS))
def test_stage_params_are_the_resolved_values_it_reads(name):
    """Preset and variant files are read through `fscil stage config`, which writes every resolved value to
    data/config/run.yaml: each stage lists exactly its STAGE_KEYS there as DVC params (device and deterministic
    included where a stage computes), and the config stage depends on the presets, the variants and params.yaml."""
    assert STAGES[name]["params"] == [{"data/config/run.yaml": list(STAGE_KEYS[name])}]
    config = STAGES["config"]
    assert {"pipeline/presets", "pipeline/variants"} <= set(config["deps"])
    assert config["params"] == [{"params.yaml": None}]
    assert [next(iter(o)) for o in config["outs"]] == ["data/config/run.yaml"]
    for key in ("device", "deterministic"):
        assert (key in STAGE_KEYS[name]) == (name in ("base", "extract", "incremental"))


def test_closure_sees_lazy_imports():
    """The oracle itself: the incremental command's lazy import of stages.incremental pulls the session code in,
    and a dvc.yaml without it would fail the coverage test."""
    files = command_files("stages/fscil stage incremental --session 1")
    assert REPO / "pipeline" / "training" / "incremental_session.py" in files
    assert REPO / "pipeline" / "training" / "base_session.py" not in files
    assert not covered(REPO / "pipeline" / "training" / "prototype.py", ["pipeline/training/evaluate.py"])
    assert covered(REPO / "pipeline" / "models" / "ss2d.py", ["pipeline/models"])


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_code_deps_are_exactly_its_import_closure(name):
    """No stale code dependency: a code file a stage does not import is not in its deps (a change to a model file
    does not re-run `config`, `prepare` or `report`)."""
    closure = {str(f.relative_to(REPO)) for f in command_files(STAGES[name]["cmd"]) if f.stat().st_size}
    code = {d for d in STAGES[name]["deps"] if d.endswith(".py") or d == "stages/fscil"}
    assert code == closure, f"extra: {sorted(code - closure)}, missing: {sorted(closure - code)}"


def test_the_config_stage_depends_on_config_code_only():
    deps = STAGES["config"]["deps"]
    assert not [d for d in deps if d.startswith(("pipeline/models", "pipeline/losses", "pipeline/store",
                                                 "pipeline/training", "pipeline/ops", "pipeline/research"))]
