"""The bounds of the exporter's HTTP listener (:mod:`.server`), apart so that the command line reads its defaults
without importing the server."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServeLimits:
    """Bounds of the exporter's listener (``kelvin exporter --max-connections/--idle-timeout``)."""

    max_connections: int = 64
    """Open connections at most; one more is answered 503 and closed. Prometheus, the scrape source and the probes
    use a handful."""
    idle_timeout_s: float = 15.0
    """Seconds a connection may stay open without delivering a request head (first request, and between requests)."""
    workers: int = 4
    """Threads that run requests (NVML reads, renderings)."""

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1 (got {self.max_connections})")
        if not self.idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be more than 0 (got {self.idle_timeout_s})")
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1 (got {self.workers})")
