"""One key style in the policy file: camelCase, in every section (the extender's and the operator's).

Each model field has one camelCase key, :func:`camel` of its Python name (``max_age_seconds`` -> ``maxAgeSeconds``;
a trailing ``_s`` is spelled out: ``hold_s`` -> ``holdSeconds``). The old snake_case spelling (the Python name) is
deprecated and still accepted until kelvin 0.3.0 (``REMOVED_IN``): :func:`normalise` finds it, renames it to the key
the model validates and reports it, so that the loader warns once per key, naming the old and the new spelling and the
removal version. Setting a key in both spellings is an error. Keys that match no field are left as they are, for the
model to refuse with their path. A section left empty (YAML null) is ``{}``, at every depth.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.alias_generators import to_camel

from ..model.deprecation import REMOVED_IN

# Unit suffixes spelled out in the camelCase key (Kubernetes style: timeoutSeconds, periodSeconds).
_SPELLED_OUT = (("_c_per_min", "_celsius_per_minute"), ("_s", "_seconds"))


def camel(name: str) -> str:
    """The camelCase key of a field: ``tolerance_ratio`` -> ``toleranceRatio``, ``grace_s`` -> ``graceSeconds``."""
    for short, full in _SPELLED_OUT:
        if name.endswith(short):
            name = name[: -len(short)] + full
            break
    return to_camel(name)


@dataclass(frozen=True, slots=True)
class Renamed:
    """A key written in the old spelling: dotted paths of the old and the camelCase key."""

    old: str
    new: str

    def warning(self, source: str) -> str:
        return (
            f"{source}: {self.old} is the old snake_case spelling, deprecated and refused from kelvin {REMOVED_IN}; "
            f"write {self.new}"
        )


@dataclass(slots=True)
class Normalised:
    data: Any
    renamed: list[Renamed] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    """``path: camelKey and old_key are both set`` per key given twice."""


def _models_in(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """The model a field holds and how: ``(M, "one")`` for ``M`` or ``M | None``; ``(M, "dict")`` for
    ``dict[str, M]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, "one"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        for a in args:
            model, how = _models_in(a)
            if model is not None:
                return model, how
    if origin in (dict, Mapping) and len(args) == 2:
        model, how = _models_in(args[1])
        if model is not None and how == "one":
            return model, "dict"
    return None, ""


def _is_section(annotation: Any) -> bool:
    """Whether a field holds a mapping (a model or a dict, not optional): a key left empty in YAML (null) means
    ``{}`` for it (``operator:``, ``args:`` with nothing under them, or only comments)."""
    origin = typing.get_origin(annotation) or annotation
    return origin in (dict, Mapping) or (isinstance(origin, type) and issubclass(origin, BaseModel))


def _key_of(model: type[BaseModel], name: str) -> str:
    """The key pydantic validates a field by (its alias when the model has aliases, else its name)."""
    return model.model_fields[name].alias or name


def normalise(model: type[BaseModel], data: Any, path: str = "") -> Normalised:
    """``data`` with every field's key (camelCase or old spelling) replaced by the key ``model`` validates, nested
    sections included; ``path`` prefixes the reported paths (``"operator."``)."""
    out = Normalised(data)
    out.data = _walk(model, data, path, out)
    return out


def _walk(model: type[BaseModel], data: Any, path: str, out: Normalised) -> Any:
    if not isinstance(data, Mapping):
        return data
    spellings: dict[str, tuple[str, bool]] = {}  # input key -> (field name, is the old spelling)
    for name, info in model.model_fields.items():
        new = camel(name)
        spellings[new] = (name, False)
        if info.alias:
            spellings[info.alias] = (name, False)
        if name != new:
            spellings.setdefault(name, (name, True))
    seen: dict[str, str] = {}  # field name -> input key
    result: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str) or key not in spellings:
            result[key] = value
            continue
        name, old = spellings[key]
        new = camel(name)
        if name in seen:
            out.duplicates.append(f"{path}{new}: set twice, as {seen[name]} and as {key}; keep {new}")
            continue
        seen[name] = key
        if old:
            out.renamed.append(Renamed(f"{path}{key}", f"{path}{new}"))
        annotation = model.model_fields[name].annotation
        if value is None and _is_section(annotation):
            value = {}
        sub, how = _models_in(annotation)
        if sub is not None and how == "one":
            value = _walk(sub, value, f"{path}{new}.", out)
        elif sub is not None and how == "dict" and isinstance(value, Mapping):
            value = {k: _walk(sub, {} if v is None else v, f"{path}{new}.{k}.", out) for k, v in value.items()}
        result[_key_of(model, name)] = value
    return result


def display_path(model: type[BaseModel] | None, loc: Sequence[int | str]) -> str:
    """A validation error's location as the user writes it: field names become their camelCase keys."""
    parts: list[str] = []
    how = "one"
    for seg in loc:
        s = str(seg)
        if model is None or how == "dict":
            parts.append(s)
            how = "one"
            continue
        name = next((n for n, i in model.model_fields.items() if s in (n, i.alias)), None)
        if name is None:
            parts.append(s)
            model = None
            continue
        parts.append(camel(name))
        model, how = _models_in(model.model_fields[name].annotation)
    return ".".join(parts)
