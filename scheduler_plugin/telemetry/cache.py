"""The snapshot cache: a background task turns a telemetry source into immutable snapshots.

The extender's hot path only reads :attr:`SnapshotCache.snapshot` (an attribute read, no I/O, no lock). Every
``refresh_interval_s`` the task fetches from the source, builds a new :class:`~scheduler_plugin.model.Snapshot` on the
event loop in small slices, taking turns with requests through a :class:`RequestGate` (a request waits for at most
one turn, never for a whole 40,000-GPU build, and no builder thread competes with it for the GIL; the refresh gets at
least a fixed share of the loop, so it finishes however many requests arrive), fills in the per-GPU temperature trend
from the snapshots it kept, reconciles the assumed-allocation ledger and publishes the new snapshot with one
assignment. When the source fails (:class:`SourceError` or anything else), the last good snapshot stays in use and
the cache reports itself unhealthy until the next success. Each refresh (every query of the source, and the build)
has a total deadline, ``refresh_deadline_s``: a source that answers too slowly (a Prometheus trickling its answer)
fails the refresh with :class:`RefreshDeadlineError` instead of holding it forever.

The numbers that tune it are one :class:`CacheSettings`. The temperature trend is :class:`~.trend.TemperatureTrend`'s,
the request gate :class:`~.gate.RequestGate`. Each GPU's cooling quality (thermal resistance, °C per watt above idle)
is learned across refreshes by a :class:`~scheduler_plugin.telemetry.cooling.CoolingEstimator` and filled in where
the source does not report it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..model import GIB, FleetArrays, GpuNode, Snapshot, empty_snapshot
from ..model.snapshot import ArraysBuilder
from ..policies.ledger import AssumedLedger
from .cooling import CoolingEstimator
from .gate import RequestGate
from .sanity import BAD_SAMPLE_REASONS
from .source import SourceError, TelemetrySource
from .trend import DEFAULT_MIN_TREND_S, DEFAULT_TREND_WINDOW_S, TemperatureTrend

log = logging.getLogger(__name__)

FloatA = npt.NDArray[np.float64]

#: Free memory on a GPU below this is "stranded": too little for the typical shared-GPU request.
DEFAULT_STRANDED_BELOW_BYTES = 8 * GIB
#: Nodes built between two checks of the request gate (32 nodes of 8 GPUs: about 0.5 ms).
DEFAULT_BUILD_SLICE_NODES = 32
#: The default refresh deadline is ``max_age_s``, but never more than this.
MAX_DEFAULT_DEADLINE_S = 300.0


#: Pause between refreshes while the telemetry is out as a whole (:meth:`SnapshotCache.recovering`).
RETRY_INTERVAL_S = 1.0


class RefreshDeadlineError(SourceError):
    """A refresh did not finish within the cache's ``refresh_deadline_s`` (it was cancelled)."""


class TelemetryMetrics:
    """``kelvin_telemetry_*`` and ``kelvin_fleet_stranded_gpu_memory_bytes`` (docs/metrics.md)."""

    def __init__(self, registry: CollectorRegistry, source: str) -> None:
        self.source = source
        self.age = Gauge(
            "kelvin_telemetry_snapshot_age_seconds", "Age of the snapshot scoring reads.", ["source"], registry=registry
        )
        self.nodes = Gauge(
            "kelvin_telemetry_nodes",
            "Nodes in the snapshot by telemetry freshness.",
            ["source", "state"],
            registry=registry,
        )
        self.refresh = Counter(
            "kelvin_telemetry_refresh", "Snapshot refreshes by result.", ["source", "result"], registry=registry
        )
        self.duration = Histogram(
            "kelvin_telemetry_refresh_duration_seconds",
            "Time a refresh took (fetch + build).",
            ["source"],
            registry=registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        )
        self.bad_samples = Counter(
            "kelvin_telemetry_bad_samples",
            "Samples a source dropped (implausible value, labels not strings) or corrected (future timestamp).",
            ["source", "reason"],
            registry=registry,
        )
        self.stranded = Gauge(
            "kelvin_fleet_stranded_gpu_memory_bytes",
            "Free GPU memory on GPUs with too little left for the typical shared request.",
            registry=registry,
        )
        for state in ("fresh", "stale"):
            self.nodes.labels(source, state)
        for result in ("ok", "error"):
            self.refresh.labels(source, result)
        for reason in BAD_SAMPLE_REASONS:
            self.bad_samples.labels(source, reason)
        self.age.labels(source)
        self.duration.labels(source)


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reason: str


@dataclass(frozen=True, slots=True)
class CacheSettings:
    """What tunes a :class:`SnapshotCache`; checked when made (a ``ValueError`` naming every bad field)."""

    refresh_interval_s: float = 5.0
    """Seconds between two refreshes while the telemetry is fine."""
    max_age_s: float = 30.0
    """Age past which a node's telemetry (and the snapshot, for readiness) is stale."""
    refresh_deadline_s: float | None = None
    """Longest one refresh may take, fetch and build together; a refresh past it is cancelled and counted as failed.
    ``None``: ``max_age_s`` (by then the snapshot being served is stale anyway), at most
    :data:`MAX_DEFAULT_DEADLINE_S` (see :attr:`deadline_s`)."""
    retry_interval_s: float | None = None
    """Pause between refreshes while :meth:`SnapshotCache.recovering`. ``None``: ``min(1 s, refresh_interval_s)``
    (see :attr:`retry_s`)."""
    trend_window_s: float = DEFAULT_TREND_WINDOW_S
    """The temperature trend's window (:class:`~.trend.TemperatureTrend`)."""
    min_trend_s: float = DEFAULT_MIN_TREND_S
    """The least span the temperature trend is computed over."""
    stranded_below_bytes: int = DEFAULT_STRANDED_BELOW_BYTES
    """Free memory on a GPU below this counts as stranded (``kelvin_fleet_stranded_gpu_memory_bytes``)."""
    build_slice_nodes: int = DEFAULT_BUILD_SLICE_NODES
    """Nodes whose arrays are built between two checks of the request gate."""
    freeze_gc: bool = False
    """After each refresh, move every live object to the collector's permanent generation (``gc.freeze``): a
    snapshot of 5,000 nodes is ~50,000 objects that would otherwise make each full collection take ~50-100 ms inside
    some request. Snapshot objects hold no reference cycles, so dropping a snapshot still frees it. Meant for the
    server process (``kelvin extender``), not for libraries and tests."""

    def __post_init__(self) -> None:
        problems = []
        if not self.refresh_interval_s > 0:
            problems.append(f"refresh_interval_s must be > 0, got {self.refresh_interval_s!r}")
        retry = self.retry_interval_s
        if retry is not None and not (retry > 0 and math.isfinite(retry)):
            problems.append(f"retry_interval_s must be a finite number > 0, got {retry!r}")
        deadline = self.refresh_deadline_s
        if deadline is not None and not (deadline > 0 and math.isfinite(deadline)):
            problems.append(f"refresh_deadline_s must be a finite number > 0, got {deadline!r}")
        if self.build_slice_nodes < 1:
            problems.append(f"build_slice_nodes must be >= 1, got {self.build_slice_nodes!r}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def deadline_s(self) -> float:
        """:attr:`refresh_deadline_s`, its default resolved."""
        if self.refresh_deadline_s is not None:
            return self.refresh_deadline_s
        return self.max_age_s if 0 < self.max_age_s <= MAX_DEFAULT_DEADLINE_S else MAX_DEFAULT_DEADLINE_S

    @property
    def retry_s(self) -> float:
        """:attr:`retry_interval_s`, its default resolved."""
        if self.retry_interval_s is not None:
            return self.retry_interval_s
        return min(RETRY_INTERVAL_S, self.refresh_interval_s)


class SnapshotCache:
    """Turns a :class:`TelemetrySource` into the current immutable :class:`Snapshot` (:attr:`snapshot`).

    Owns the source's refresh task (:meth:`start` / :meth:`stop`, or one :meth:`refresh_once` at a time in tests and
    the simulator), the kept samples the temperature trend is computed from, the cooling estimator, the request gate
    the build takes turns through and the telemetry metrics. On each successful refresh it reconciles the ledger it is
    given (drops entries the new snapshot shows) and calls ``on_publish`` before replacing :attr:`snapshot` with one
    assignment. Used from one event loop: readers on that loop (or any thread) only read :attr:`snapshot`, which is
    never mutated, so they need no lock."""

    def __init__(
        self,
        source: TelemetrySource,
        settings: CacheSettings | None = None,
        *,
        ledger: AssumedLedger | None = None,
        metrics: TelemetryMetrics | None = None,
        clock: Callable[[], float] = time.time,
        gate: RequestGate | None = None,
        on_publish: Callable[[Snapshot], None] | None = None,
    ) -> None:
        self.source = source
        self.settings = settings if settings is not None else CacheSettings()
        self.ledger = ledger
        self.metrics = metrics
        self.clock = clock
        self.gate = gate if gate is not None else RequestGate()
        """Requests in flight: the build takes turns with them (at least ``gate.share`` of the loop for the build)."""
        self.gate.urgency = self.urgency
        self.on_publish = on_publish
        """Called with each new snapshot just before it is published (e.g. to warm the policies' per-snapshot
        caches), so that work happens here, in the background, and not in the first request that reads it."""
        self.trend = TemperatureTrend(self.settings.trend_window_s, self.settings.min_trend_s)
        self.cooling = CoolingEstimator()
        """Learns each GPU's cooling quality (thermal resistance) across refreshes; fills the snapshot's
        ``thermal_resistance`` column where the source does not report it."""
        self.snapshot: Snapshot = empty_snapshot(source.name)
        """The current snapshot. Replaced, never mutated, by each successful refresh."""
        self.healthy = False
        self.last_error: str | None = "no telemetry yet"
        self.refreshes = 0
        self._task: asyncio.Task[None] | None = None
        self._refresh_lock = asyncio.Lock()
        self._bad_seen: dict[str, int] = {}
        self.outage_ended_at = -math.inf
        """When the last outage ended (:meth:`after_outage`): the first refresh with a fresh node after refreshes that
        failed or brought telemetry out as a whole (no node, or every node stale), or after the start."""
        self._out = True
        """The last refresh failed or brought telemetry out as a whole (True before the first)."""

    # -- refresh -----------------------------------------------------------------------------------------------

    async def refresh_once(self) -> bool:  # noqa: C901
        """Fetch and publish one snapshot. Never raises (except cancellation); returns whether it succeeded."""
        async with self._refresh_lock:
            started = time.perf_counter()
            paused_gc = self.settings.freeze_gc and gc.isenabled()
            if paused_gc:  # no full collection over the half-built snapshot while requests wait for the GIL
                gc.disable()
            deadline = asyncio.timeout(self.settings.deadline_s)
            try:
                try:
                    async with deadline:
                        try:
                            nodes = await self.source.fetch()
                        finally:
                            self._count_bad_samples()
                        now = self.clock()
                        snap = self._build(nodes, now, await self._arrays(nodes))
                except TimeoutError:
                    if not deadline.expired():
                        raise
                    raise RefreshDeadlineError(
                        f"the refresh from {self.source.name} did not finish within {self.settings.deadline_s:g} s "
                        f"(took {time.perf_counter() - started:.1f} s; cancelled)"
                    ) from None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep the last good snapshot, whatever went wrong
                self.healthy = False
                self._out = True
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "telemetry refresh from %s failed, keeping the snapshot of %s: %s",
                    self.source.name,
                    _fmt_time(self.snapshot.taken_at),
                    self.last_error,
                )
                if self.metrics:
                    self.metrics.refresh.labels(self.source.name, "error").inc()
                self._update_age()
                return False
            finally:
                if self.settings.freeze_gc:  # before collection resumes: none ever scans the new snapshot's objects
                    gc.freeze()
                if paused_gc:
                    gc.enable()
            if self.on_publish is not None:
                try:
                    self.on_publish(snap)
                except Exception:  # a warm-up is an optimisation: never lose a good snapshot over it
                    log.exception("warming the new snapshot failed; publishing it cold")
            # Keep the old snapshot's nodes alive past the swap and free them in slices (see _retire).
            retired = list(self.snapshot.nodes)
            self.snapshot = snap
            self.healthy = True
            self.last_error = None
            out = self._out_as_whole(now)
            if self._out and not out:
                self.outage_ended_at = now
            self._out = out
            self.refreshes += 1
            if self.ledger is not None:
                self.ledger.reconcile(snap)
            if self.metrics:
                m = self.metrics
                m.refresh.labels(self.source.name, "ok").inc()
                m.duration.labels(self.source.name).observe(time.perf_counter() - started)
                stale = int(snap.stale_mask(now, self.settings.max_age_s).sum())
                m.nodes.labels(self.source.name, "stale").set(stale)
                m.nodes.labels(self.source.name, "fresh").set(len(snap.nodes) - stale)
                m.stranded.set(self.stranded_bytes(snap))
                self._update_age()
            await self._retire(retired)
            return True

    def _count_bad_samples(self) -> None:
        """Carry the source's counts of dropped or corrected samples (``bad_samples``) into the metrics."""
        counts = getattr(self.source, "bad_samples", None)
        if self.metrics is None or not counts:
            return
        for reason, total in counts.items():
            new = total - self._bad_seen.get(reason, 0)
            if new > 0:
                self.metrics.bad_samples.labels(self.source.name, reason).inc(new)
                self._bad_seen[reason] = total

    async def _retire(self, nodes: list[GpuNode]) -> None:
        """Drop the previous snapshot's nodes a slice at a time: freeing its ~50,000 objects at once would stall the
        event loop for ~10 ms. (A request still reading the old snapshot keeps it alive; then this frees nothing.)"""
        step = 4 * self.settings.build_slice_nodes
        while nodes:
            del nodes[-step:]
            await self.gate.pause()

    async def _arrays(self, nodes: Sequence[GpuNode]) -> FleetArrays:
        """Build the snapshot's arrays on the event loop, ``build_slice_nodes`` nodes per slice, checking the gate
        between slices: requests are served between the build's turns (:class:`RequestGate`),
        instead of competing for the GIL with a builder thread."""
        builder = ArraysBuilder(nodes)
        step = self.settings.build_slice_nodes
        for lo in range(0, len(nodes), step):
            builder.fill(lo, lo + step)
            await self.gate.pause()
        return builder.finish()

    def _build(self, nodes: Sequence[GpuNode], now: float, arrays: FleetArrays) -> Snapshot:
        snap = Snapshot(nodes=tuple(nodes), taken_at=now, source=self.source.name, source_healthy=True, prebuilt=arrays)
        # The snapshot is not published yet: filling its trend and cooling columns is still part of building it.
        self.trend.fill(snap.arrays, now)
        self.cooling.fill(snap.arrays)  # needs the trend: only settled temperatures are learned from
        return snap

    def stranded_bytes(self, snap: Snapshot) -> int:
        a = snap.arrays
        if a.n_nodes == 0:
            return 0
        small = a.gpu_present & (a.free_mem > 0) & (a.free_mem < self.settings.stranded_below_bytes)
        return int(a.free_mem[small].sum())

    # -- background task ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Take the first snapshot now (so readiness is known), then refresh in the background."""
        await self.refresh_once()
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="kelvin-snapshot-refresh")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.next_wait_s())
            await self.refresh_once()

    def recovering(self, now: float | None = None) -> bool:
        """Whether the telemetry is out as a whole (the last refresh failed, or the snapshot has no node, or every
        node of it is older than ``max_age_s``: a restarted Prometheus answers with its old samples until it has
        scraped again), or is coming back from that: some node is still stale, within ``max_age_s`` of the first
        refresh that ended the outage (:meth:`after_outage`: Prometheus scrapes the exporters again one by one; an
        exporter gone for good does not keep the cache refreshing every second). Refreshes then come every
        ``retry_interval_s``, so pods refused during an outage are placed within seconds of their nodes reporting
        again rather than a whole ``refresh_interval_s`` later."""
        now = self.clock() if now is None else now
        if self._out_as_whole(now):
            return True
        return self.after_outage(now) and bool(self.snapshot.stale_mask(now, self.settings.max_age_s).any())

    def after_outage(self, now: float, within_s: float | None = None) -> bool:
        """Whether ``now`` is within ``within_s`` (default ``max_age_s``) of the end of the last outage
        (:attr:`outage_ended_at`): the window in which nodes not scraped again yet are still coming back, not
        gone."""
        return now - self.outage_ended_at < (self.settings.max_age_s if within_s is None else within_s)

    def _out_as_whole(self, now: float) -> bool:
        if not self.healthy or not self.snapshot.nodes:
            return True
        return bool(self.snapshot.stale_mask(now, self.settings.max_age_s).all())

    def next_wait_s(self) -> float:
        """Seconds until the next refresh: ``retry_interval_s`` while :meth:`recovering`, else
        ``refresh_interval_s``."""
        return self.settings.retry_s if self.recovering() else self.settings.refresh_interval_s

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def refresher_stopped(self) -> bool:
        """The background task was started and has ended (it should run until :meth:`stop`)."""
        return self._task is not None and self._task.done()

    def urgency(self) -> float:
        """0 while the snapshot is younger than half of ``max_age_s``, rising to 1 when it reaches ``max_age_s`` (or
        there is none yet): the gate then gives the refresh a larger share of the event loop."""
        age = self.snapshot.age_seconds(self.clock())
        if not math.isfinite(age):
            return 1.0
        half = self.settings.max_age_s / 2.0
        return min(1.0, max(0.0, (age - half) / half))

    # -- health ------------------------------------------------------------------------------------------------

    def _update_age(self) -> None:
        if self.metrics:
            age = self.snapshot.age_seconds(self.clock())
            self.metrics.age.labels(self.source.name).set(age if math.isfinite(age) else float("nan"))

    def update_metrics(self) -> None:
        """Refresh the gauges that depend on the current time (called before each scrape)."""
        self._update_age()
        if self.metrics and self.snapshot.nodes:
            now = self.clock()
            stale = int(self.snapshot.stale_mask(now, self.settings.max_age_s).sum())
            self.metrics.nodes.labels(self.source.name, "stale").set(stale)
            self.metrics.nodes.labels(self.source.name, "fresh").set(len(self.snapshot.nodes) - stale)

    def readiness(self) -> Readiness:
        """Ready when the last refresh succeeded and the snapshot is younger than ``max_age_s``."""
        age = self.snapshot.age_seconds(self.clock())
        if not math.isfinite(age):
            return Readiness(False, f"no telemetry snapshot yet ({self.last_error or 'waiting for the source'})")
        if not self.healthy:
            return Readiness(
                False,
                f"telemetry source {self.source.name} is failing: {self.last_error}; serving a snapshot {age:.0f}s old",
            )
        if age > self.settings.max_age_s:
            return Readiness(False, f"telemetry snapshot is {age:.0f}s old (limit {self.settings.max_age_s:g}s)")
        return Readiness(True, f"snapshot of {len(self.snapshot.nodes)} nodes, {age:.1f}s old")


def _fmt_time(t: float) -> str:
    return "never" if not math.isfinite(t) else time.strftime("%H:%M:%S", time.gmtime(t))
