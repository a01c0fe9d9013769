"""The telemetry source interface. Sources do I/O; the cache turns what they return into snapshots."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ..model import GpuNode


class SourceError(RuntimeError):
    """A refresh failed as a whole (source unreachable, bad answer). The previous snapshot stays in use."""


@runtime_checkable
class TelemetrySource(Protocol):
    """Something that can tell the current state of the fleet.

    ``fetch`` returns every node it knows with ``observed_at`` set per node to the time of that node's newest
    telemetry (so the cache can mark single nodes stale). It raises :class:`SourceError` when it cannot answer at all.
    """

    name: str

    async def fetch(self) -> Sequence[GpuNode]: ...

    async def close(self) -> None: ...


def remember_nodes(
    known: dict[str, GpuNode], fresh: dict[str, GpuNode], now: float, forget_after_s: float
) -> list[GpuNode]:
    """Merge ``fresh`` into ``known`` (mutated): nodes whose telemetry vanished stay, with their old ``observed_at``,
    so the cache marks them stale instead of forgetting them, until ``forget_after_s`` passes. Sorted by name."""
    known.update(fresh)
    for name, node in list(known.items()):
        if name not in fresh and (node.observed_at is None or now - node.observed_at > forget_after_s):
            del known[name]
    return [known[n] for n in sorted(known)]
