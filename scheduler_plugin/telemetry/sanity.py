"""Plausibility of telemetry values, and the one place that reports the samples a source drops or corrects.

A source checks each value against the :class:`Range` of its signal before it enters the model: a value outside it
(a memory total of 1e30 bytes, a temperature of 10,000 °C, NaN) is dropped, as if the series were absent, instead of
failing the whole refresh later (an ``OverflowError`` in the snapshot's int64 columns naming nothing) or misleading a
policy. :class:`SampleIssues` counts every dropped or corrected sample by reason (the snapshot cache publishes the
counts as ``kelvin_telemetry_bad_samples_total{source,reason}``) and logs one warning per kind of problem per
``every_s`` (naming the first offender and how many more there were), so that a fleet of bad series cannot flood the
log. See docs/telemetry-sources.md.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from ..model import GpuInfo, GpuNode

#: Largest plausible byte count (memory of one GPU or process): 8 PiB, exact in a float64, far from int64 overflow.
MAX_BYTES = 2**53
#: Reasons a sample is dropped (or, for ``future_timestamp``, corrected): ``kelvin_telemetry_bad_samples_total``'s
#: ``reason`` label.
BAD_SAMPLE_REASONS = ("out_of_range", "bad_value", "bad_labels", "bad_sample", "future_timestamp")
#: Timestamps further ahead of the local clock than this are warned about (all are clamped to the local clock).
FUTURE_SKEW_S = 5.0


@dataclass(frozen=True, slots=True)
class Range:
    """Inclusive bounds of a plausible value, and its unit (for messages)."""

    lo: float
    hi: float
    unit: str

    def check(self, value: float) -> str | None:
        """``None`` when ``value`` is plausible, else why not."""
        if not math.isfinite(value):
            return "not a finite number"
        if not self.lo <= value <= self.hi:
            return f"outside {self.lo:g}..{self.hi:g} {self.unit}"
        return None


BYTES = Range(0, MAX_BYTES, "bytes")
MEBIBYTES = Range(0, MAX_BYTES / 2**20, "MiB")
CELSIUS = Range(-50, 200, "°C")
BITMASK = Range(0, 2**63 - 1, "(a bitmask)")
HERTZ = Range(0, 1e11, "Hz")
MEGAHERTZ = Range(0, 1e5, "MHz")
RATIO = Range(0, 1, "(a ratio)")
PERCENT = Range(0, 100, "%")
WATTS = Range(0, 1e5, "W")
NUMA = Range(-1, 4095, "(a NUMA node)")
COUNT = Range(0, 2**31 - 1, "(a count)")
LEVEL = Range(0, 1000, "(a topology level)")
UNIX_TIME = Range(0, 1e11, "s since 1970")
ANY = Range(-math.inf, math.inf, "")


class SampleIssues:
    """Counts bad samples by reason and logs them, one warning per ``key`` per ``every_s`` at most.

    ``counts`` only grows (the cache turns it into a Prometheus counter). :meth:`once` is for a condition that lasts
    (a node whose clock runs ahead): counted and warned when it starts, again only after :meth:`clear` ends it.
    """

    def __init__(
        self, logger: logging.Logger, *, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.log = logger
        self.every_s = every_s
        self.clock = clock
        self.counts: Counter[str] = Counter()
        """Samples dropped or corrected so far, by reason."""
        self._last: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()
        self._ongoing: set[str] = set()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def report(self, reason: str, key: str, message: str) -> None:
        """Count one bad sample; warn ``message`` unless ``key`` was warned about within ``every_s``."""
        self.counts[reason] += 1
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.every_s:
            self._suppressed[key] += 1
            return
        more = self._suppressed.pop(key, 0)
        self._last[key] = now
        if more:
            message += f" ({more} more like it since the last warning)"
        self.log.warning("%s", message)

    def once(self, reason: str, key: str, message: str) -> None:
        """Count and warn when the condition ``key`` starts; nothing while it lasts."""
        if key in self._ongoing:
            return
        self._ongoing.add(key)
        self.counts[reason] += 1
        self.log.warning("%s", message)

    def clear(self, keys: Iterable[str]) -> None:
        """The conditions ``keys`` are over (a later :meth:`once` warns again)."""
        self._ongoing.difference_update(keys)


def clamp_future(
    fresh: Mapping[str, GpuNode], now: float, issues: SampleIssues | None, source: str
) -> dict[str, GpuNode]:
    """``fresh`` with every ``observed_at`` later than ``now`` set to ``now``.

    A sample stamped in the future (a clock that runs ahead, a bad ``timestamp()``) would keep its node fresh for as
    long as the clock is wrong, even after its series vanished. More than :data:`FUTURE_SKEW_S` ahead is reported
    once per node while it lasts (reason ``future_timestamp``).
    """
    out: dict[str, GpuNode] = {}
    ahead: set[str] = set()
    for name, node in fresh.items():
        seen = node.observed_at
        if seen is not None and seen > now:
            if seen > now + FUTURE_SKEW_S:
                ahead.add(name)
                if issues is not None:
                    issues.once(
                        "future_timestamp",
                        f"future:{name}",
                        f"{source}: node {name}'s telemetry is stamped {seen - now:.0f} s in the future "
                        f"(observed_at {seen!r}); using the local time instead, so that it goes stale when it stops",
                    )
            node = replace(node, observed_at=now)
        out[name] = node
    if issues is not None:
        issues.clear(f"future:{n}" for n in fresh if n not in ahead)
    return out


#: Plausible ranges of the node model's numbers (the scrape source checks every GPU of every answer against them).
GPU_RANGES: dict[str, Range] = {
    "memory_total_bytes": BYTES,
    "memory_used_bytes": BYTES,
    "temperature_celsius": CELSIUS,
    "memory_temperature_celsius": CELSIUS,
    "slowdown_celsius": CELSIUS,
    "shutdown_celsius": CELSIUS,
    "throttle_reasons": BITMASK,
    "sm_clock_mhz": MEGAHERTZ,
    "sm_clock_max_mhz": MEGAHERTZ,
    "utilization": RATIO,
    "memory_utilization": RATIO,
    "power_watts": WATTS,
    "xid_errors": COUNT,
    "numa_node": NUMA,
    "temperature_trend_c_per_min": Range(-1000, 1000, "°C/min"),
    "thermal_resistance_c_per_w": Range(0, 100, "°C/W"),
}
#: Fields where NaN means "no reading" (not a bad value).
_NAN_MEANS_UNKNOWN = frozenset(
    {"temperature_celsius", "memory_temperature_celsius", "power_watts", "thermal_resistance_c_per_w"}
)


def implausible_gpu(gpu: GpuInfo) -> str | None:
    """``None`` when every number of ``gpu`` (and of its processes) is plausible, else the first that is not."""
    for field, rng in GPU_RANGES.items():
        value = getattr(gpu, field)
        if value is None or (field in _NAN_MEANS_UNKNOWN and math.isnan(value)):
            continue
        why = rng.check(float(value))
        if why is not None:
            return f"{field} {value!r} is {why}"
    for p in gpu.processes:
        why = BYTES.check(float(p.used_bytes))
        if why is not None:
            return f"process {p.pid} used_bytes {p.used_bytes!r} is {why}"
    return None
