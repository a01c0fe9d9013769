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

The trend is computed against the oldest kept snapshot no older than ``trend_window_s`` (at least ``min_trend_s``
apart), per GPU slot, in Celsius per minute; a source that reports its own trend (non-zero) keeps it. Each GPU's
cooling quality (thermal resistance, °C per watt above idle) is learned across refreshes by a
:class:`~scheduler_plugin.telemetry.cooling.CoolingEstimator` and filled in where the source does not report it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..model import GIB, FleetArrays, GpuNode, Snapshot, empty_snapshot
from ..model.snapshot import ArraysBuilder
from .cooling import CoolingEstimator
from .ledger import AssumedLedger
from .sanity import BAD_SAMPLE_REASONS
from .source import SourceError, TelemetrySource

log = logging.getLogger(__name__)

FloatA = npt.NDArray[np.float64]

#: Free memory on a GPU below this is "stranded": too little for the typical shared-GPU request.
DEFAULT_STRANDED_BELOW_BYTES = 8 * GIB
#: Nodes built between two checks of the request gate (32 nodes of 8 GPUs: about 0.5 ms).
DEFAULT_BUILD_SLICE_NODES = 32
#: Least share of the event loop that a snapshot refresh gets while requests keep it busy (see :class:`RequestGate`):
#: a 20,000-node refresh (about 4 s of CPU on a 2-core box) then completes within about 16 s however heavy the load.
DEFAULT_BACKGROUND_SHARE = 0.25
#: The default refresh deadline is ``max_age_s``, but never more than this.
MAX_DEFAULT_DEADLINE_S = 300.0
#: The share once the snapshot is about to go stale (see :meth:`SnapshotCache.urgency`).
URGENT_BACKGROUND_SHARE = 0.75


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
class _Sample:
    taken_at: float
    names: tuple[str, ...]
    index: dict[str, int]
    temp: FloatA
    gpu_index: npt.NDArray[np.int32]


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reason: str


class RequestGate:
    """Shares the event loop between the hot path (requests) and background work (building a snapshot).

    The extender's routes wrap each verb in :meth:`serving`; the snapshot build calls :meth:`pause` between slices.
    Background work runs in *turns*: :meth:`pause` returns at once while the current turn lasts, and when it is over
    steps aside: it yields to the event loop and, while requests are being served, keeps waiting (polling every
    ``poll_s``) for up to ``max_defer_s``. The next turn then lasts ``share / (1 - share)`` of the time it waited
    (at least ``min_turn_s``, at most ``max_turn_s``), so that background work gets at least ``share`` of the event
    loop however many requests arrive (as long as no single request holds the loop for more than ``max_turn_s * (1 -
    share) / share``): a refresh is slowed down by load, never starved by it (deferred slice by slice without that
    share, a 20,000-node refresh under two clients looping ``/filter`` would never finish, and every node would go
    stale). A request
    waits for at most one turn. Without requests a turn is ``min_turn_s`` and the work runs at full speed. Single
    event loop: no locks.

    ``urgency`` (0 to 1, read at each step-aside) raises the share linearly up to ``max_share``: the snapshot cache
    reports how close its snapshot is to going stale, so that on a starved CPU requests get slower before every node
    is refused as stale.
    """

    def __init__(
        self,
        *,
        share: float = DEFAULT_BACKGROUND_SHARE,
        max_share: float = URGENT_BACKGROUND_SHARE,
        min_turn_s: float = 0.002,
        max_turn_s: float = 0.2,
        poll_s: float = 0.0005,
        max_defer_s: float = 0.02,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not 0.0 < share <= max_share < 1.0:
            raise ValueError(f"need 0 < share <= max_share < 1, got share={share!r}, max_share={max_share!r}")
        if not 0 < min_turn_s <= max_turn_s:
            raise ValueError(f"need 0 < min_turn_s <= max_turn_s, got {min_turn_s!r} and {max_turn_s!r}")
        self.share = share
        """Least share of the event loop's time that background work gets while requests keep it busy."""
        self.max_share = max_share
        self.urgency: Callable[[], float] | None = None
        """How urgent the background work is now, 0 to 1 (None: never urgent)."""
        self.min_turn_s = min_turn_s
        self.max_turn_s = max_turn_s
        """Longest turn, whatever the wait before it (a long request, the process not scheduled): what a request
        may have to wait for background work."""
        self.poll_s = poll_s
        self.max_defer_s = max_defer_s
        self.clock = clock
        self.active = 0
        """Requests being served now."""
        self.awaiting_io = 0
        """Of those, requests waiting on another server (a bind's API call): they use no CPU meanwhile."""
        self._turn_ends = -math.inf

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1

    @contextlib.contextmanager
    def awaiting(self) -> Iterator[None]:
        """Within :meth:`serving`: the request now waits on I/O (e.g. a bind on the API server), so background work
        need not step aside for it (nor make its answer wait for a long turn when it comes back)."""
        self.awaiting_io += 1
        try:
            yield
        finally:
            self.awaiting_io -= 1

    @property
    def busy(self) -> int:
        """Requests being served that are not waiting on I/O."""
        return self.active - self.awaiting_io

    async def pause(self) -> None:
        stepped_aside = self.clock()
        if stepped_aside < self._turn_ends:
            return  # this turn of background work is not over yet
        await asyncio.sleep(0)
        deadline = stepped_aside + self.max_defer_s
        while self.busy > 0 and self.clock() < deadline:
            await asyncio.sleep(self.poll_s)
        resumed = self.clock()
        share = self.share
        if self.urgency is not None:
            share += (self.max_share - share) * min(1.0, max(0.0, self.urgency()))
        earned = (resumed - stepped_aside) * share / (1.0 - share)
        self._turn_ends = resumed + min(self.max_turn_s, max(self.min_turn_s, earned))


class SnapshotCache:
    """Turns a :class:`TelemetrySource` into the current immutable :class:`Snapshot` (:attr:`snapshot`).

    Owns the source's refresh task (:meth:`start` / :meth:`stop`, or one :meth:`refresh_once` at a time in tests and
    the simulator), the kept samples the temperature trend is computed from, the cooling estimator, the request gate
    the build takes turns through and the telemetry metrics. On each successful refresh it reconciles the ledger it is
    given (drops entries the new snapshot shows) and calls ``on_publish`` before replacing :attr:`snapshot` with one
    assignment. Used from one event loop: readers on that loop (or any thread) only read :attr:`snapshot`, which is
    never mutated, so they need no lock."""

    def __init__(  # noqa: PLR0913
        self,
        source: TelemetrySource,
        *,
        refresh_interval_s: float = 5.0,
        max_age_s: float = 30.0,
        ledger: AssumedLedger | None = None,
        metrics: TelemetryMetrics | None = None,
        clock: Callable[[], float] = time.time,
        trend_window_s: float = 300.0,
        min_trend_s: float = 10.0,
        stranded_below_bytes: int = DEFAULT_STRANDED_BELOW_BYTES,
        freeze_gc: bool = False,
        build_slice_nodes: int = DEFAULT_BUILD_SLICE_NODES,
        gate: RequestGate | None = None,
        cooling: CoolingEstimator | None = None,
        on_publish: Callable[[Snapshot], None] | None = None,
        refresh_deadline_s: float | None = None,
        retry_interval_s: float | None = None,
    ) -> None:
        if not refresh_interval_s > 0:
            raise ValueError(f"refresh_interval_s must be > 0, got {refresh_interval_s!r}")
        retry = min(RETRY_INTERVAL_S, refresh_interval_s) if retry_interval_s is None else retry_interval_s
        if not (retry > 0 and math.isfinite(retry)):
            raise ValueError(f"retry_interval_s must be a finite number > 0, got {retry!r}")
        self.retry_interval_s = retry
        """Pause between refreshes while :meth:`recovering` (default ``min(1 s, refresh_interval_s)``)."""
        if refresh_deadline_s is None:  # max_age_s, within reason (max_age_s is validated by the settings)
            deadline = max_age_s if 0 < max_age_s <= MAX_DEFAULT_DEADLINE_S else MAX_DEFAULT_DEADLINE_S
        else:
            deadline = refresh_deadline_s
        if not (deadline > 0 and math.isfinite(deadline)):
            raise ValueError(f"refresh_deadline_s must be a finite number > 0, got {deadline!r}")
        self.refresh_deadline_s = deadline
        """Longest one refresh may take, fetch and build together (default ``max_age_s``, at most
        :data:`MAX_DEFAULT_DEADLINE_S`: by then the snapshot being served is stale anyway); a refresh past it is
        cancelled and counted as failed."""
        self.source = source
        self.refresh_interval_s = refresh_interval_s
        self.max_age_s = max_age_s
        self.ledger = ledger
        self.metrics = metrics
        self.clock = clock
        self.trend_window_s = trend_window_s
        self.min_trend_s = min_trend_s
        self.stranded_below_bytes = stranded_below_bytes
        if build_slice_nodes < 1:
            raise ValueError(f"build_slice_nodes must be >= 1, got {build_slice_nodes!r}")
        self.build_slice_nodes = build_slice_nodes
        """Nodes whose arrays are built between two checks of the gate (see :meth:`_arrays`)."""
        self.gate = gate if gate is not None else RequestGate()
        self.gate.urgency = self.urgency
        """Requests in flight: the build takes turns with them (at least ``gate.share`` of the loop for the build)."""
        self.cooling = cooling if cooling is not None else CoolingEstimator()
        self.on_publish = on_publish
        """Called with each new snapshot just before it is published (e.g. to warm the policies' per-snapshot
        caches), so that work happens here, in the background, and not in the first request that reads it."""
        """Learns each GPU's cooling quality (thermal resistance) across refreshes; fills the snapshot's
        ``thermal_resistance`` column where the source does not report it."""
        self.freeze_gc = freeze_gc
        """After each refresh, move every live object to the collector's permanent generation (``gc.freeze``): a
        snapshot of 5,000 nodes is ~50,000 objects that would otherwise make each full collection take ~50-100 ms
        inside some request. Snapshot objects hold no reference cycles, so dropping a snapshot still frees it.
        Meant for the server process (``kelvin extender``), not for libraries and tests."""
        self.snapshot: Snapshot = empty_snapshot(source.name)
        """The current snapshot. Replaced, never mutated, by each successful refresh."""
        self.healthy = False
        self.last_error: str | None = "no telemetry yet"
        self.refreshes = 0
        self._history: deque[_Sample] = deque(maxlen=256)
        self._task: asyncio.Task[None] | None = None
        self._refresh_lock = asyncio.Lock()
        self._bad_seen: dict[str, int] = {}

    # -- refresh -----------------------------------------------------------------------------------------------

    async def refresh_once(self) -> bool:  # noqa: C901
        """Fetch and publish one snapshot. Never raises (except cancellation); returns whether it succeeded."""
        async with self._refresh_lock:
            started = time.perf_counter()
            paused_gc = self.freeze_gc and gc.isenabled()
            if paused_gc:  # no full collection over the half-built snapshot while requests wait for the GIL
                gc.disable()
            deadline = asyncio.timeout(self.refresh_deadline_s)
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
                        f"the refresh from {self.source.name} did not finish within {self.refresh_deadline_s:g} s "
                        f"(took {time.perf_counter() - started:.1f} s; cancelled)"
                    ) from None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep the last good snapshot, whatever went wrong
                self.healthy = False
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
                if self.freeze_gc:  # before collection resumes: no collection ever scans the new snapshot's objects
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
            self.refreshes += 1
            if self.ledger is not None:
                self.ledger.reconcile(snap)
            if self.metrics:
                m = self.metrics
                m.refresh.labels(self.source.name, "ok").inc()
                m.duration.labels(self.source.name).observe(time.perf_counter() - started)
                stale = int(snap.stale_mask(now, self.max_age_s).sum())
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
        step = 4 * self.build_slice_nodes
        while nodes:
            del nodes[-step:]
            await self.gate.pause()

    async def _arrays(self, nodes: Sequence[GpuNode]) -> FleetArrays:
        """Build the snapshot's arrays on the event loop, ``build_slice_nodes`` nodes per slice, checking the gate
        between slices: requests are served between the build's turns (:class:`RequestGate`),
        instead of competing for the GIL with a builder thread."""
        builder = ArraysBuilder(nodes)
        step = self.build_slice_nodes
        for lo in range(0, len(nodes), step):
            builder.fill(lo, lo + step)
            await self.gate.pause()
        return builder.finish()

    def _build(self, nodes: Sequence[GpuNode], now: float, arrays: FleetArrays) -> Snapshot:
        snap = Snapshot(nodes=tuple(nodes), taken_at=now, source=self.source.name, source_healthy=True, prebuilt=arrays)
        a = snap.arrays
        sample = _Sample(now, a.names, a.index, a.temp.copy(), a.gpu_index.copy())
        trend = self._trend(sample)
        if trend is not None:
            # The snapshot is not published yet: filling its trend column is still part of building it.
            a.trend[...] = np.where(a.trend != 0.0, a.trend, trend)
        self.cooling.fill(a)  # needs the trend: only settled temperatures are learned from
        if a.names:  # an empty snapshot is no base for a trend (a fresh install's first refreshes have no nodes)
            self._history.append(sample)
        while self._history and now - self._history[0].taken_at > self.trend_window_s:
            self._history.popleft()
        return snap

    def _trend(self, cur: _Sample) -> FloatA | None:
        base = next((s for s in self._history if cur.taken_at - s.taken_at <= self.trend_window_s), None)
        if base is None or cur.taken_at - base.taken_at < self.min_trend_s:
            return None
        minutes = (cur.taken_at - base.taken_at) / 60.0
        if not cur.names:
            return None
        if base.names == cur.names:
            prev_temp, prev_idx = base.temp, base.gpu_index
            known = np.ones(len(cur.names), dtype=np.bool_)
        else:
            rows = np.array([base.index.get(n, -1) for n in cur.names], dtype=np.int64)
            known = rows >= 0
            rows = np.where(known, rows, 0)
            prev_temp, prev_idx = base.temp[rows], base.gpu_index[rows]
        g = min(cur.temp.shape[1], prev_temp.shape[1])
        out = np.zeros_like(cur.temp)
        same = known[:, None] & (prev_idx[:, :g] == cur.gpu_index[:, :g]) & (cur.gpu_index[:, :g] >= 0)
        out[:, :g] = np.where(same, (cur.temp[:, :g] - prev_temp[:, :g]) / minutes, 0.0)
        return out

    def stranded_bytes(self, snap: Snapshot) -> int:
        a = snap.arrays
        if a.n_nodes == 0:
            return 0
        small = a.gpu_present & (a.free_mem > 0) & (a.free_mem < self.stranded_below_bytes)
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
        """Whether the telemetry is out as a whole: the last refresh failed, or the snapshot has no node, or every
        node of it is older than ``max_age_s`` (a restarted Prometheus answers with its old samples until it has
        scraped again). Refreshes then come every ``retry_interval_s``, so pods refused during an outage are placed
        within seconds of the telemetry recovering rather than a whole ``refresh_interval_s`` later (issue 20,
        defect 8)."""
        if not self.healthy or not self.snapshot.nodes:
            return True
        now = self.clock() if now is None else now
        return bool(self.snapshot.stale_mask(now, self.max_age_s).all())

    def next_wait_s(self) -> float:
        """Seconds until the next refresh: ``retry_interval_s`` while :meth:`recovering`, else
        ``refresh_interval_s``."""
        return self.retry_interval_s if self.recovering() else self.refresh_interval_s

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
        half = self.max_age_s / 2.0
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
            stale = int(self.snapshot.stale_mask(now, self.max_age_s).sum())
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
        if age > self.max_age_s:
            return Readiness(False, f"telemetry snapshot is {age:.0f}s old (limit {self.max_age_s:g}s)")
        return Readiness(True, f"snapshot of {len(self.snapshot.nodes)} nodes, {age:.1f}s old")


def _fmt_time(t: float) -> str:
    return "never" if not math.isfinite(t) else time.strftime("%H:%M:%S", time.gmtime(t))
