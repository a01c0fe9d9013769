"""Policy registry: name -> (typed args model, factory). Unknown names or bad args fail at startup, not per request.

Policies register themselves with :func:`register` at import; ``scheduler_plugin.policies`` imports every policy
module so that importing the package fills the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from ..config import error_message

ArgsT = TypeVar("ArgsT", bound=BaseModel)


class PolicyConfigError(ValueError):
    """A policy name or argument that cannot be used; the message names the field path."""


@dataclass(frozen=True, slots=True)
class Registration(Generic[ArgsT]):
    name: str
    kind: str  # "filter" | "score" | "picker"
    args_model: type[ArgsT]
    factory: Callable[[ArgsT], Any]
    doc: str


_REGISTRY: dict[tuple[str, str], Registration[Any]] = {}


def register(
    kind: str, name: str, args_model: type[ArgsT], doc: str = ""
) -> Callable[[Callable[[ArgsT], Any]], Callable[[ArgsT], Any]]:
    """Decorator for a factory ``(args) -> plugin``."""

    def deco(factory: Callable[[ArgsT], Any]) -> Callable[[ArgsT], Any]:
        key = (kind, name)
        if key in _REGISTRY and _REGISTRY[key].factory is not factory:
            raise PolicyConfigError(f"{kind} policy {name!r} registered twice")
        _REGISTRY[key] = Registration(name, kind, args_model, factory, doc or (factory.__doc__ or "").strip())
        return factory

    return deco


def names(kind: str) -> list[str]:
    return sorted(n for k, n in _REGISTRY if k == kind)


def lookup(kind: str, name: str) -> Registration[Any]:
    try:
        return _REGISTRY[(kind, name)]
    except KeyError:
        known = ", ".join(names(kind)) or "none"
        raise PolicyConfigError(f"unknown {kind} policy {name!r} (known: {known})") from None


def build(kind: str, name: str, raw_args: dict[str, Any] | None, path: str) -> Any:
    """Validate ``raw_args`` against the policy's model and build it. Errors name every bad field by its path."""
    reg = lookup(kind, name)
    try:
        args = reg.args_model.model_validate(raw_args or {})
    except ValidationError as exc:
        problems = "; ".join(f"{path}.{'.'.join(str(p) for p in e['loc'])}: {error_message(e)}" for e in exc.errors())
        raise PolicyConfigError(problems) from None
    return reg.factory(args)
