"""RFC 3339 times as Kubernetes writes them (``2026-01-02T03:04:05Z``, fractions to nanoseconds, offsets): parsed to
Unix time and written back. One place for the operator's annotations, the pod times it reads, and the bind time the
extender records for the device plugin (``kelvin.dev/gpu-assigned-at``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

NS_PER_S = 1_000_000_000
_RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})?$")


def parse_time_ns(text: object) -> int | None:
    """RFC 3339 text as Unix nanoseconds (no offset means UTC); ``None`` if it is not one."""
    m = _RFC3339.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        return None
    zone = m.group(3) or "+00:00"
    try:
        base = datetime.fromisoformat(m.group(1) + ("+00:00" if zone in ("Z", "z") else zone))
    except ValueError:
        return None
    return int(base.timestamp()) * NS_PER_S + int((m.group(2) or "0").ljust(9, "0"))


def parse_time(text: object) -> float | None:
    """RFC 3339 text as Unix time in seconds; ``None`` if it is not one."""
    ns = parse_time_ns(text)
    return None if ns is None else ns / NS_PER_S


def format_time_ns(ns: int) -> str:
    """Unix nanoseconds as RFC 3339 UTC with nanoseconds (``2026-01-02T03:04:05.123456789Z``)."""
    secs, frac = divmod(ns, NS_PER_S)
    return datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


def format_time(ts: float) -> str:
    """Unix time as RFC 3339 UTC with microseconds (``2026-01-02T03:04:05.123456Z``)."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
