"""Typed params sections: the checks every params.yaml section shares (unknown keys, value types).

A section is a dataclass deriving from `SectionConfig`: `from_dict` rejects unknown keys (naming them and the
valid ones), and `check_types` (called from `__post_init__`) checks every value against its field's type hint:
null only where the field's type allows it (`x | None`). Range checks stay in each section's own `__post_init__`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, ClassVar

from pipeline.errors import FSCILError


def fail(section: str, key: str, why: str) -> typing.NoReturn:
    raise FSCILError(f"params: {section + '.' if section else ''}{key} {why}")


def check(cond: bool, section: str, key: str, why: str) -> None:
    if not cond:
        fail(section, key, why)


def check_value(section: str, key: str, value: Any, hint: Any) -> Any:
    """`value` checked against bool, int, float, str, list[...], dict[str, str] or an Optional of those."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin = typing.get_origin(hint)
    if origin in (list, tuple):
        check(isinstance(value, (list, tuple)), section, key, f"must be a list, got {value!r}")
        item = typing.get_args(hint)[0]
        return [check_value(section, key, v, item) for v in value]
    if origin is dict:
        check(isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()),
              section, key, f"must be a mapping of strings to strings, got {value!r}")
        return dict(value)
    if hint is bool:
        check(isinstance(value, bool), section, key, f"must be true or false, got {value!r}")
    elif hint is int:
        check(isinstance(value, int) and not isinstance(value, bool), section, key,
              f"must be an integer, got {value!r}")
    elif hint is float:
        check(isinstance(value, (int, float)) and not isinstance(value, bool), section, key,
              f"must be a number, got {value!r}")
        return float(value)
    elif hint is str:
        check(isinstance(value, str), section, key, f"must be a string, got {value!r}")
    return value


def choice(default: str, registry: Any) -> Any:
    """A field whose value must name an entry of `registry` (pipeline/registry.py: its names are the only list of
    them; the key docs and the one-line error list them)."""
    return dataclasses.field(default=default, metadata={"choices": registry})


def added_later(default: Any) -> Any:
    """A field added after runs were stored: at its default it is left out of what a run records (data/config/
    run.yaml, the DVC params, checkpoint digests), so those runs keep their bytes and DVC reruns nothing; a value
    set to anything else is recorded as every other key is."""
    return dataclasses.field(default=default, metadata={"added_later": True})


def choices(f: dataclasses.Field) -> Any:
    """The registry a field's value must name, or None."""
    return f.metadata.get("choices")


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (list, tuple):
        return "a list"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, "a mapping")


class SectionConfig:
    """Mixin for the params.yaml section dataclasses."""

    section: ClassVar[str] = ""

    @classmethod
    def from_dict(cls, values: dict[str, Any]):
        if not isinstance(values, dict):
            raise FSCILError(f"params: {cls.section} must be a mapping, got {type(values).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in values if k not in names]
        if unknown:
            raise FSCILError(f"params: unknown key {cls.section}.{unknown[0]} (valid: {', '.join(names)})")
        return cls(**values)

    def values(self) -> dict[str, Any]:
        """The section's values as a run records them: every field but an `added_later` one at its default."""
        out = dataclasses.asdict(self)
        for f in dataclasses.fields(self):
            if f.metadata.get("added_later") and out[f.name] == f.default:
                del out[f.name]
        return out

    def digest_values(self) -> dict[str, Any]:
        """The section's values as config digests hash them: `values` (a new key changes every digest once, unless
        it is `added_later`)."""
        return self.values()

    def check_types(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                hint = hints[f.name]
                optional = typing.get_origin(hint) in (typing.Union, types.UnionType)
                check(optional and type(None) in typing.get_args(hint),
                      self.section, f.name, f"must be {_type_name(hint)}, got null (leave the key out to keep the "
                      "value of the layer below)")
                continue
            setattr(self, f.name, check_value(self.section, f.name, value, hints[f.name]))
            registry = choices(f)
            check(registry is None or value in registry, self.section, f.name,
                  f"must be one of {', '.join(registry or ())}, got {value!r}")
