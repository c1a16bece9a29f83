"""dvc.yaml's code dependencies, generated: each stage depends on exactly the code its command imports (and, written
by hand, on data/config/<stage>.yaml, the resolved values it reads: `pipeline.config.STAGE_KEYS`).

A stage's command is `stages/run <name>` (`python -m stages.<name>`, forked by stages/launch.py); its code is those
two launchers, that module and every module of ours it imports, at the top of a file or inside a function,
transitively (read with `ast`, nothing is imported).
A registry (pipeline/<package>/registry.py) names its entries' modules ("module:attribute"): a stage whose code
looks names up in it depends on every entry's module, the config, which only checks names against it, on the
registry's file alone. What is loaded by name otherwise is not followed: the optional GPU kernels
(`pipeline.ops.scan_dispatch.KERNELS`), which a CPU run never runs.

    python -m stages.dvc_deps           # rewrite the code lines of every stage's deps in dvc.yaml
    python -m stages.dvc_deps --check   # exit 1 and list the differences when dvc.yaml is not what it would write
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "stages")
LAUNCHERS = ("stages/run", "stages/launch.py")  # what runs every stage's module: a dep of each
COMMAND = "python -m stages.dvc_deps"


def module_file(dotted: str, root: Path = REPO) -> Path | None:
    path = root.joinpath(*dotted.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def parse(path: Path) -> ast.Module:
    """`path`'s syntax tree, parsed once while the file is unchanged."""
    stat = path.stat()
    return _parsed(path, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _parsed(path: Path, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(path.read_text())


def from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` names (a relative one resolved against `package`)."""
    base = node.module or ""
    if node.level:
        parent = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(parent + ([base] if base else []))
    return base


def imported(tree: ast.AST, package: str, root: Path = REPO) -> set[Path]:
    """Files of our packages that the import statements in `tree` name (every parent package's __init__ too)."""
    files = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = from_module(node, package)
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] in PACKAGES:
                files |= {f for i in range(1, len(parts) + 1) if (f := module_file(".".join(parts[:i]), root))}
    return files


def import_closure(files: set[Path], root: Path = REPO) -> set[Path]:
    """`files` and every file of ours they import, transitively."""
    seen: set[Path] = set()
    todo = list(files)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
        todo += imported(parse(path), package, root) - seen
    return seen


_TARGET = re.compile(r"^((?:pipeline|stages)(?:\.\w+)+):\w+$")


def registry_targets(path: Path, names: set[str] | None, root: Path = REPO) -> set[Path]:
    """The modules a registry file names as entries' targets ("module:attribute") in the definitions of `names`
    (None: all of them) and of the module-level names those definitions use, transitively (PROJECTOR_KINDS's
    ProjectorKind looks its branch up in SSM_BRANCHES and MIXERS)."""
    defs: dict[str, ast.AST] = {}
    for node in parse(path).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            defs[node.name] = node
        for target in getattr(node, "targets", [getattr(node, "target", None)]):
            if isinstance(target, ast.Name):
                defs[target.id] = node
    todo, seen = list(defs if names is None else names & set(defs)), set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += [n.id for n in ast.walk(defs[name]) if isinstance(n, ast.Name) and n.id in defs]
    found = {m.group(1) for name in seen for sub in ast.walk(defs[name]) if isinstance(sub, ast.Constant)
             and isinstance(sub.value, str) and (m := _TARGET.match(sub.value))}
    return {f for name in found if (f := module_file(name, root))}


def looked_up(tree: ast.AST, package: str, registries: set[Path], root: Path = REPO) -> dict[Path, set[str] | None]:
    """{registry file: the registries `tree` imports from it by name (None: the whole module)}."""
    out: dict[Path, set[str] | None] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            f = module_file(from_module(node, package), root)
            if f in registries and out.get(f, set()) is not None:
                out[f] = out.get(f, set()) | {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if (f := module_file(alias.name, root)) in registries:
                    out[f] = None
    return out


def with_registries(files: set[Path], root: Path = REPO) -> set[Path]:
    """`files` (a closure) and, for each registry that code outside pipeline/config imports, its entries' modules
    with their own closures, until nothing is added."""
    config = root / "pipeline" / "config"
    while True:
        registries = {f for f in files if f.name == "registry.py" and f.parent != root / "pipeline"}
        added: set[Path] = set()
        for f in files - registries:
            if config in f.parents:
                continue
            package = ".".join(f.relative_to(root).with_suffix("").parts[:-1])
            for registry, names in looked_up(parse(f), package, registries, root).items():
                added |= registry_targets(registry, names, root)
        added -= files
        if not added:
            return files
        files = import_closure(files | added, root)


def stage_code(stage: str, root: Path = REPO) -> list[str]:
    """The code a stage's command runs, as dvc.yaml paths (empty files left out: they change nothing)."""
    start = module_file(f"stages.{stage}", root)
    if start is None:
        raise SystemExit(f"error: dvc.yaml names stage {stage!r} but stages/{stage}.py does not exist")
    files = with_registries(import_closure({start}, root), root)
    code = {str(f.relative_to(root)) for f in files if f.stat().st_size}
    return sorted(code | set(LAUNCHERS))


def is_code(dep: str, stage: str, root: Path = REPO) -> bool:
    """A dep this generator owns: a code file, or a folder of our packages (the config stage keeps the preset and
    variant folders it reads; the other stages read their resolved values in data/config/<stage>.yaml instead)."""
    if dep.endswith(".py") or dep in LAUNCHERS:
        return True
    return stage != "config" and dep.split("/")[0] in PACKAGES and (root / dep).is_dir()


_STAGE = re.compile(r"^  ([\w-]+):\s*$")
_CMD = re.compile(r"^\s+cmd:\s*stages/run\s+([\w-]+)")
_DEPS = re.compile(r"^(\s+)deps:\s*$")


def generate(text: str, root: Path = REPO) -> str:
    """dvc.yaml's text with each stage's code deps replaced by its import closure (other deps kept, first)."""
    lines = text.splitlines()
    out: list[str] = []
    i, stage = 0, None
    while i < len(lines):
        line = lines[i]
        if _STAGE.match(line):
            stage = None
        if m := _CMD.match(line):
            stage = m.group(1)
        out.append(line)
        i += 1
        m = _DEPS.match(line)
        if not m or stage is None:
            continue
        item = f"{m.group(1)}  - "
        kept = []
        while i < len(lines) and lines[i].startswith(item):
            dep = lines[i][len(item):].strip()
            if not is_code(dep, stage, root):
                kept.append(dep)
            i += 1
        out += [item + dep for dep in kept + stage_code(stage, root)]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Only compare; exit 1 when dvc.yaml differs.")
    args = parser.parse_args(argv)
    path = REPO / "dvc.yaml"
    text = path.read_text()
    want = generate(text)
    if args.check:
        if want != text:
            import difflib

            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), want.splitlines(True), "dvc.yaml",
                                                       "generated"))
            raise SystemExit(f"dvc.yaml's code deps are not the stages' import closures: run `{COMMAND}`")
        return
    if want != text:
        path.write_text(want)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
