"""The exporter's prometheus_client collector: reads NVML on each scrape (no timer) and yields metric families."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from .metrics import families
from .reader import NodeReading, NvmlReader


class NvmlCollector(Collector):
    """Registers with a ``CollectorRegistry``; every ``collect()`` is one fresh NVML read of the node."""

    def __init__(self, reader: NvmlReader) -> None:
        self.reader = reader
        self.last: NodeReading | None = None

    def read(self) -> NodeReading:
        """One fresh NVML read, remembered as :attr:`last` (``/healthz`` reports it)."""
        reading = self.reader.read()
        self.last = reading
        return reading

    def collect(self) -> Iterator[Metric]:
        return families(self.read())

    def describe(self) -> Iterator[Metric]:
        # no NVML call at registration time: the registry learns the names on the first scrape
        return iter(())
