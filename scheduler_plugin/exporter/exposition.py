"""The ``/metrics`` body: prometheus_client's own encoders over a node reading, with the slow-moving parts cached.

Most of a scrape's samples change far less often than scrapes come: GPU identity, thresholds, limits, MIG mode,
NVLink and topology (with the hardware), the per-reason throttle series (with the reason bitmask) and the XID counts
(with an XID event). Each such part (:data:`~.metrics.CACHED_PARTS`) is rendered with the negotiated
prometheus_client encoder once per value of its key and kept; the workload families are rendered afresh on every
scrape with the same encoder; the body is the parts concatenated. The keys are the very values the parts render from,
so a cached part is never stale. Each part holds whole families, so no family appears twice. The only splice is
OpenMetrics' ``# EOF`` terminator, dropped from the cached parts so that the body ends with exactly one.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Collection, Iterator

from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from .metrics import CACHED_PARTS, CachedPart, PartKey, dynamic_families, families
from .reader import NodeReading

Encoder = Callable[[Collector], bytes]
_EOF = b"# EOF\n"
_MAX_SLOTS = 32
"""Cache entries kept at most: the content type echoes the client's ``version=``, so a client could vary it."""


class _Families(Collector):
    """Already-built metric families, so that prometheus_client's encoders can render them."""

    def __init__(self, families: Iterator[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


class ScrapeRenderer:
    """Renders node readings for ``/metrics``; keeps the latest rendering of each cached part per content type."""

    def __init__(self, parts: tuple[CachedPart, ...] = CACHED_PARTS) -> None:
        self._parts = parts
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], tuple[PartKey, bytes]] = {}
        self.renders = {part.name: 0 for part in parts}
        """Per cached part, how many times it was rendered rather than served from the cache."""

    def render(self, reading: NodeReading, accept: str | None = None, names: Collection[str] = ()) -> tuple[bytes, str]:
        """The exposition of ``reading`` for an ``Accept`` header, and its content type.

        ``names`` (the ``name[]`` query parameter) keeps only the families with that family or sample name; such
        filtered bodies are rendered uncached.
        """
        encoder, content_type = choose_encoder(accept or "")
        if names:
            wanted = set(names)
            kept = (f for f in families(reading) if f.name in wanted or any(s.name in wanted for s in f.samples))
            return encoder(_Families(kept)), content_type
        cached = [self._part(part, reading, encoder, content_type) for part in self._parts]
        return b"".join([*cached, encoder(_Families(dynamic_families(reading)))]), content_type

    def _part(self, part: CachedPart, reading: NodeReading, encoder: Encoder, content_type: str) -> bytes:
        key = part.key(reading)
        slot = (part.name, content_type)
        with self._lock:
            hit = self._cache.get(slot)
            if hit is not None and hit[0] == key:
                return hit[1]
        body = encoder(_Families(part.families(reading)))
        if body.endswith(_EOF):  # OpenMetrics: the dynamic part carries the one terminator
            body = body[: -len(_EOF)]
        with self._lock:
            if len(self._cache) >= _MAX_SLOTS and slot not in self._cache:
                self._cache.clear()
            self._cache[slot] = (key, body)
            self.renders[part.name] += 1
        return body


def gzip_accepted(accept_encoding: str | None) -> bool:
    """Whether an ``Accept-Encoding`` header accepts gzip (RFC 9110 section 12.5.3): ``gzip`` (or ``x-gzip``) with a
    non-zero ``q``, or, when neither is named, ``*`` with a non-zero ``q``. ``gzip;q=0`` refuses it.

    Not prometheus_client's ``gzip_accepted``, which drops the parameters and so answers ``gzip;q=0`` with gzip.
    A ``q`` that is not a number makes that entry count as refused."""
    named: float | None = None
    wildcard: float | None = None
    for entry in (accept_encoding or "").split(","):
        coding, *params = (part.strip() for part in entry.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
                if not 0.0 <= q <= 1.0:  # nan fails both comparisons too
                    q = 0.0
        coding = coding.lower()
        if coding in ("gzip", "x-gzip"):
            named = q if named is None else max(named, q)
        elif coding == "*":
            wildcard = q if wildcard is None else max(wildcard, q)
    if named is not None:
        return named > 0
    return wildcard is not None and wildcard > 0


def maybe_gzip(body: bytes, accept_encoding: str | None) -> tuple[bytes, list[tuple[str, str]]]:
    """Compress when the client accepts gzip (:func:`gzip_accepted`), at level 1: on an 86 KB body level 9 costs
    ~1.2 ms for 4.2 KB and level 1 ~0.1 ms for 5.1 KB, and scrapes stay on the node's network."""
    if gzip_accepted(accept_encoding):
        return gzip.compress(body, compresslevel=1), [("Content-Encoding", "gzip")]
    return body, []
