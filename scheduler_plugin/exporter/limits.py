"""The bounds of the exporter's HTTP listener (:mod:`.server`), apart so that the command line reads its defaults
without importing the server."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ServeLimits:
    """Bounds of the exporter's listener (``kelvin exporter --max-connections/--header-timeout/--idle-timeout``)."""

    max_connections: int = 64
    """Open connections at most; one more is answered 503 and closed. Prometheus, the scrape source and the probes
    use a handful."""
    header_timeout_s: float = 10.0
    """Seconds a new connection has to deliver its first request's line and headers."""
    idle_timeout_s: float = 75.0
    """Seconds a keep-alive connection may wait for its next request: longer than a 60 s scrape interval, so that
    Prometheus reuses its connection instead of racing the server's close."""
    workers: int = 4
    """Threads that run requests (NVML reads, renderings)."""

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1 (got {self.max_connections})")
        for name in ("header_timeout_s", "idle_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number of seconds above 0 (got {value})")
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1 (got {self.workers})")
