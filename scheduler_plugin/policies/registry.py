"""Policy registries: (kind, name) -> (typed args model, factory). Unknown names or bad args fail at startup, not per
request.

A :class:`Registry` is an immutable table built explicitly from a list of :class:`Registration` rows; nothing
registers itself on import. The extender's is :data:`scheduler_plugin.policies.plugins.PRODUCTION` (kelvin's own
filters, scores and pickers: what a policy file may name); the simulator's adds the FGD paper's comparison policies
to it (:data:`scheduler_plugin.simulator.baselines.SIMULATOR`), so a production policy file cannot select them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from ..settings import error_message

ArgsT = TypeVar("ArgsT", bound=BaseModel)
Kind = Literal["filter", "score", "picker"]


class PolicyConfigError(ValueError):
    """A policy name or argument that cannot be used; the message names the field path."""


@dataclass(frozen=True, slots=True)
class Registration(Generic[ArgsT]):
    """One policy: its kind, name, the pydantic model of its ``args`` and the factory ``(args) -> plugin``."""

    kind: Kind
    name: str
    args_model: type[ArgsT]
    factory: Callable[[ArgsT], Any]
    doc: str
    """One line: what the policy does (the generated Helm schema and the docs show it)."""


class Registry:
    """An immutable set of :class:`Registration` rows, looked up by (kind, name)."""

    __slots__ = ("_rows",)

    def __init__(self, registrations: Iterable[Registration[Any]]) -> None:
        rows: dict[tuple[str, str], Registration[Any]] = {}
        for reg in registrations:
            key = (reg.kind, reg.name)
            if key in rows:
                raise PolicyConfigError(f"{reg.kind} policy {reg.name!r} registered twice")
            rows[key] = reg
        self._rows = rows

    def extended(self, registrations: Iterable[Registration[Any]]) -> Registry:
        """This registry plus ``registrations`` (a name already here is refused)."""
        return Registry([*self._rows.values(), *registrations])

    def __iter__(self) -> Iterator[Registration[Any]]:
        return iter(self._rows.values())

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def names(self, kind: Kind) -> list[str]:
        return sorted(n for k, n in self._rows if k == kind)

    def lookup(self, kind: Kind, name: str) -> Registration[Any]:
        """The registration of ``name``; :class:`PolicyConfigError` listing the known names of ``kind`` if none."""
        try:
            return self._rows[(kind, name)]
        except KeyError:
            known = ", ".join(self.names(kind)) or "none"
            raise PolicyConfigError(f"unknown {kind} policy {name!r} (known: {known})") from None

    def build(self, kind: Kind, name: str, raw_args: dict[str, Any] | None, path: str) -> Any:
        """Validate ``raw_args`` against the policy's model and build it. Errors name every bad field by its path."""
        reg = self.lookup(kind, name)
        try:
            args = reg.args_model.model_validate(raw_args or {})
        except ValidationError as exc:
            problems = "; ".join(
                f"{path}.{'.'.join(str(p) for p in e['loc'])}: {error_message(e)}" for e in exc.errors()
            )
            raise PolicyConfigError(problems) from None
        return reg.factory(args)
