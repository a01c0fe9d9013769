"""What one extender verb is, for ``routes.py``'s table: where it is served, how its body is parsed, what answers it
and how an unexpected failure inside kelvin is answered (never a 500).

Expected refusals are :class:`~.errors.HttpError` subclasses and carry their own status; ``on_error`` is only for the
rest (a bug, a failing dependency), logged with its traceback by the route:

* filter replies 200 with ``Error`` set (:func:`filter_failed`): kube-scheduler keeps the pod pending with that
  message and retries;
* bind replies 200 with ``Error`` set and counts a failed bind (:class:`BindFailed`);
* prioritize, explain and preempt reply 503 (:func:`unavailable`): kube-scheduler ignores prioritize failures.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from . import wire
from .metrics import ExtenderMetrics
from .turns import LoopTurns

A = TypeVar("A")

#: A verb's answer to an unexpected failure: (reply body, HTTP status), from the message naming the failure.
ErrorReply = Callable[[str], tuple[Any, int]]


@dataclass(frozen=True, slots=True)
class Verb(Generic[A]):
    """One row of the verbs table."""

    name: str
    """The verb's name in logs, error messages and the metrics' ``verb`` label."""
    paths: tuple[str, ...]
    parse: Callable[[bytes], A]
    """The raw body to the handler's arguments; raises :class:`~.errors.WireError` naming the field. Called in a
    worker thread for big bodies (``routes.decode``): it must not touch the event loop's state."""
    handle: Callable[[A, float], Awaitable[Any]]
    """The parsed arguments and the event loop's time the request arrived at, to the reply (orjson-serialisable)."""
    on_error: ErrorReply


def served_at(verb: str) -> tuple[str, ...]:
    """``/<verb>`` and ``/scheduler/<verb>`` (the prefix used in the captures and examples)."""
    return (f"/{verb}", f"/scheduler/{verb}")


def in_turn(turn: LoopTurns, fn: Callable[[A], Any]) -> Callable[[A, float], Awaitable[Any]]:
    """A handler that runs ``fn`` (CPU work, no await) in its turn with the other verbs (``turns.py``)."""

    async def handle(args: A, arrived: float) -> Any:
        async with turn:
            return fn(args)

    return handle


def filter_failed(message: str) -> tuple[Any, int]:
    return wire.error_result(message), 200


def unavailable(message: str) -> tuple[Any, int]:
    return {"Error": message}, 503


@dataclass(frozen=True, slots=True)
class BindFailed:
    """Bind's reply to an unexpected failure: 200 with ``Error`` set, counted as a failed bind."""

    metrics: ExtenderMetrics

    def __call__(self, message: str) -> tuple[Any, int]:
        self.metrics.decisions.labels("bind", "error").inc()
        return {"Error": message}, 200
