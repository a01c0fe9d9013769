"""The telemetry source interface. Sources do I/O; the cache turns what they return into snapshots."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ..model import GpuNode
from .sanity import SampleIssues, clamp_future


class SourceError(RuntimeError):
    """A refresh failed as a whole (source unreachable, bad answer). The previous snapshot stays in use."""


@runtime_checkable
class TelemetrySource(Protocol):
    """Something that can tell the current state of the fleet.

    ``fetch`` returns every node it knows with ``observed_at`` set per node to the time of that node's newest
    telemetry (so the cache can mark single nodes stale). It raises :class:`SourceError` when it cannot answer at all.
    A source that drops implausible samples may expose ``bad_samples`` (a mapping of reason to count, only growing;
    see :class:`~.sanity.SampleIssues`): the cache publishes it as ``kelvin_telemetry_bad_samples_total``.
    """

    name: str

    async def fetch(self) -> Sequence[GpuNode]: ...

    async def close(self) -> None: ...


def remember_nodes(
    known: dict[str, GpuNode],
    fresh: dict[str, GpuNode],
    now: float,
    forget_after_s: float,
    *,
    issues: SampleIssues | None = None,
    source: str = "telemetry",
) -> list[GpuNode]:
    """Merge ``fresh`` into ``known`` (mutated): nodes whose telemetry vanished stay, with their old ``observed_at``,
    so the cache marks them stale instead of forgetting them, until ``forget_after_s`` passes. Sorted by name.

    An ``observed_at`` in the future is clamped to ``now`` first (:func:`~.sanity.clamp_future`): otherwise the node
    would stay fresh long after its telemetry stopped. A fresh node without ``observed_at`` (no live sample said
    when it was seen: e.g. only the static signals a source caches, right after its exporter stopped) does not
    replace a known node that has one: that node's series are vanishing, and it is kept as a vanished one is. Else
    the next refresh, with nothing left of it, would find it known without a time and forget it at once."""
    live: dict[str, GpuNode] = {}
    for name, node in clamp_future(fresh, now, issues, source).items():
        old = known.get(name)
        if node.observed_at is None and old is not None and old.observed_at is not None:
            continue
        live[name] = node
    known.update(live)
    for name, node in list(known.items()):
        if name not in live and (node.observed_at is None or now - node.observed_at > forget_after_s):
            del known[name]
    return [known[n] for n in sorted(known)]
