"""Registries: the only list of one kind's names (timm's `register_model` / `list_models`, without importing every
model to list them).

A registry maps each name to "module:attribute", the object it stands for (a branch class, a loss form, a dataset
reader), imported when the name is first looked up, and a one-line description. The config checks a value against
the names, `fscil list`, the key docs and the CLI help print them, the invariant tests walk every entry; the code
that builds from a registry looks the name up. Adding a kind is its file or function plus one line here. Torch-free:
the config reads names without importing models.

DVC's dependencies follow (stages/dvc_deps.py): a stage whose code looks names up in a registry depends on every
entry's module; the config, which reads names only, on the registry's file alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline.errors import FSCILError


def load(target: str) -> Any:
    """The object "module:attribute" names, its module imported."""
    module, attribute = target.split(":")
    return getattr(importlib.import_module(module), attribute)


class Registry(Mapping[str, Any]):
    """name -> object, given as {name: ("module:attribute", description)}; `reg[name]` imports and returns it.
    lazy=False: the entries are the objects themselves (plain data that needs no import)."""

    def __init__(self, kind: str, entries: dict[str, tuple[Any, str]], lazy: bool = True):
        self.kind, self.lazy = kind, lazy
        self.entries: dict[str, tuple[Any, str]] = {}
        self._loaded: dict[str, Any] = {}
        for name, (target, doc) in entries.items():
            self.register(name, target, doc)

    def register(self, name: str, target: Any, doc: str) -> None:
        """Add an entry (a new file's class or function: its registry line does this; tests add throwaway ones)."""
        if self.lazy and (not isinstance(target, str) or target.count(":") != 1):
            raise ValueError(f"{self.kind} {name}: the target must be 'module:attribute', got {target!r}")
        self.entries[name] = (target, doc)
        self._loaded.pop(name, None)

    def unregister(self, name: str) -> None:
        del self.entries[name]
        self._loaded.pop(name, None)

    def __getitem__(self, name: str) -> Any:
        if name not in self.entries:
            raise KeyError(name)
        if not self.lazy:
            return self.entries[name][0]
        if name not in self._loaded:
            self._loaded[name] = load(self.entries[name][0])
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def describe(self, name: str) -> str:
        return self.entries[name][1]

    def get_checked(self, name: str) -> Any:
        """`self[name]`, or a one-line error naming the valid choices."""
        if name not in self.entries:
            raise FSCILError(f"unknown {self.kind} {name!r} (valid: {', '.join(self.entries)})")
        return self[name]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self.entries)})"


def all_registries() -> dict[str, Registry]:
    """Every registry of every pipeline/<package>/registry.py (what stages/dvc_deps.py follows too), by its dotted
    name (pipeline.models.registry.SSM_BRANCHES ...): `fscil list`, the invariant tests."""
    out = {}
    for path in sorted(Path(__file__).parent.glob("*/registry.py")):
        module = importlib.import_module(f"pipeline.{path.parent.name}.registry")
        out.update({f"{module.__name__}.{name}": value for name, value in vars(module).items()
                    if isinstance(value, Registry)})
    return out
