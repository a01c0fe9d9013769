"""The snapshot cache: refresh, trend, staleness, last-good-snapshot on failure, ledger reconcile, metrics."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from scheduler_plugin.model import GIB, GpuAssignment, GpuInfo, GpuNode
from scheduler_plugin.policies.ledger import AssumedLedger
from scheduler_plugin.telemetry.cache import CacheSettings, SnapshotCache, TelemetryMetrics
from scheduler_plugin.telemetry.source import SourceError


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def node(
    name: str,
    temps: Sequence[float],
    used_gib: Sequence[float] = (),
    trend: float = 0.0,
    assignments: tuple[GpuAssignment, ...] = (),
) -> GpuNode:
    gpus = tuple(
        GpuInfo(
            index=i,
            uuid=f"{name}-{i}",
            model="H100",
            memory_total_bytes=80 * GIB,
            memory_used_bytes=int((used_gib[i] if i < len(used_gib) else 0.5) * GIB),
            temperature_celsius=t,
            temperature_trend_c_per_min=trend,
        )
        for i, t in enumerate(temps)
    )
    return GpuNode(name=name, gpus=gpus, assignments=assignments)


class Source:
    name = "fake"

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.nodes: list[GpuNode] = []
        self.fail = False

    async def fetch(self) -> Sequence[GpuNode]:
        if self.fail:
            raise SourceError("boom")
        return [replace(n, observed_at=self.clock()) for n in self.nodes]

    async def close(self) -> None:
        return None


@pytest.fixture
def setup() -> tuple[SnapshotCache, Source, Clock, CollectorRegistry]:
    clock = Clock()
    src = Source(clock)
    reg = CollectorRegistry()
    cache = SnapshotCache(
        src,
        CacheSettings(refresh_interval_s=5, max_age_s=30),
        clock=clock,
        metrics=TelemetryMetrics(reg, "fake"),
        ledger=AssumedLedger(60),
    )
    return cache, src, clock, reg


def _m(reg: CollectorRegistry, name: str, **labels: str) -> float | None:
    return reg.get_sample_value(name, labels)


async def test_refresh_publishes_a_new_immutable_snapshot(setup: tuple) -> None:  # type: ignore[type-arg]
    cache, src, clock, reg = setup
    assert not cache.readiness().ready and cache.snapshot.nodes == ()
    src.nodes = [node("a", [40, 50])]
    assert await cache.refresh_once()
    first = cache.snapshot
    assert [n.name for n in first.nodes] == ["a"] and first.taken_at == clock.t and first.source == "fake"
    clock.t += 5
    src.nodes = [node("a", [40, 50]), node("b", [30])]
    assert await cache.refresh_once()
    assert cache.snapshot is not first and len(first.nodes) == 1  # the old one is untouched
    assert _m(reg, "kelvin_telemetry_refresh_total", source="fake", result="ok") == 2
    assert _m(reg, "kelvin_telemetry_nodes", source="fake", state="fresh") == 2
    assert cache.readiness().ready


async def test_trend_from_history(setup: tuple) -> None:  # type: ignore[type-arg]
    cache, src, clock, _ = setup
    src.nodes = [node("a", [40, 60]), node("b", [50], trend=3.0)]
    await cache.refresh_once()
    assert (cache.snapshot.arrays.trend[0] == 0).all()  # no history yet
    clock.t += 60
    src.nodes = [node("b", [50], trend=3.0), node("a", [50, 57])]  # reordered: rows are aligned by name
    await cache.refresh_once()
    a = cache.snapshot.arrays
    ra, rb = a.index["a"], a.index["b"]
    assert a.trend[ra, 0] == pytest.approx(10.0) and a.trend[ra, 1] == pytest.approx(-3.0)
    assert a.trend[rb, 0] == pytest.approx(3.0)  # the source's own trend wins
    clock.t += 5  # too close to the previous sample? the oldest within the window is used
    src.nodes = [node("a", [51, 57]), node("b", [50])]
    await cache.refresh_once()
    assert cache.snapshot.arrays.trend[cache.snapshot.arrays.index["a"], 0] == pytest.approx(11 / (65 / 60))


async def test_the_first_snapshot_with_nodes_after_empty_ones_refreshes(setup: tuple) -> None:  # type: ignore[type-arg]
    """A fresh install: empty snapshots for a while, then nodes. The empty snapshot stayed the trend's base for the
    whole trend window and every refresh failed (IndexError) until it aged out, 300 s later."""
    cache, src, clock, _ = setup
    for _ in range(3):
        assert await cache.refresh_once() and cache.snapshot.nodes == ()
        clock.t += 10
    src.nodes = [node("a", [40, 50])]
    assert await cache.refresh_once(), cache.last_error
    assert (cache.snapshot.arrays.trend == 0).all()  # no history of these GPUs yet
    clock.t += 60
    src.nodes = [node("a", [46, 50])]
    assert await cache.refresh_once(), cache.last_error
    assert cache.snapshot.arrays.trend[0, 0] == pytest.approx(6.0)  # trend from the first snapshot with the GPU


async def test_a_value_that_does_not_fit_the_snapshot_is_named(setup: tuple) -> None:  # type: ignore[type-arg]
    """A source that lets 10**30 bytes through (the sources' own checks drop it): the refresh fails naming the
    node, the GPU, the field and the value, not a bare OverflowError."""
    cache, src, _, _ = setup
    bad = replace(node("b", [40, 41]).gpus[1], memory_total_bytes=10**30)
    src.nodes = [node("a", [40]), GpuNode(name="b", gpus=(node("b", [40]).gpus[0], bad))]
    assert not await cache.refresh_once()
    assert cache.last_error == (
        "ValueError: node b GPU 1: memory_total_bytes 1000000000000000000000000000000 does not fit the snapshot (int64)"
    )


async def test_failure_keeps_the_last_good_snapshot(setup: tuple) -> None:  # type: ignore[type-arg]
    cache, src, clock, reg = setup
    src.nodes = [node("a", [40])]
    await cache.refresh_once()
    good = cache.snapshot
    src.fail = True
    clock.t += 10
    assert not await cache.refresh_once()
    assert cache.snapshot is good and not cache.healthy and "boom" in (cache.last_error or "")
    r = cache.readiness()
    assert not r.ready and "failing" in r.reason
    assert _m(reg, "kelvin_telemetry_refresh_total", source="fake", result="error") == 1
    assert _m(reg, "kelvin_telemetry_snapshot_age_seconds", source="fake") == 10
    src.fail = False
    assert await cache.refresh_once() and cache.readiness().ready


async def test_staleness_and_age(setup: tuple) -> None:  # type: ignore[type-arg]
    cache, src, clock, reg = setup
    src.nodes = [node("a", [40]), node("b", [40])]
    await cache.refresh_once()
    clock.t += 31
    r = cache.readiness()
    assert not r.ready and "31s old" in r.reason
    cache.update_metrics()
    assert _m(reg, "kelvin_telemetry_nodes", source="fake", state="stale") == 2
    assert _m(reg, "kelvin_telemetry_snapshot_age_seconds", source="fake") == 31


async def test_reconciles_the_ledger(setup: tuple) -> None:  # type: ignore[type-arg]
    cache, src, clock, _ = setup
    assert cache.ledger is not None
    a = GpuAssignment(pod_key="ns/p", gpu_indices=(0,), pod_uid="u1")
    cache.ledger.assume("a", a, clock.t)
    src.nodes = [node("a", [40, 40])]
    await cache.refresh_once()
    assert len(cache.ledger) == 1  # telemetry does not show it yet
    src.nodes = [node("a", [40, 40], assignments=(a,))]
    await cache.refresh_once()
    assert len(cache.ledger) == 0


async def test_stranded_memory(setup: tuple) -> None:  # type: ignore[type-arg]
    cache, src, _, reg = setup
    # 80 GiB GPUs: 76 GiB used leaves 4 GiB (stranded); 40 GiB used leaves 40 GiB (usable); idle is not stranded
    src.nodes = [node("a", [40, 40, 40], used_gib=[76, 40, 0.5])]
    await cache.refresh_once()
    assert _m(reg, "kelvin_fleet_stranded_gpu_memory_bytes") == 4 * GIB


async def test_background_refresh_runs_and_stops() -> None:
    clock = Clock()
    src = Source(clock)
    src.nodes = [node("a", [40])]
    cache = SnapshotCache(src, CacheSettings(refresh_interval_s=0.01), clock=clock)
    await cache.start()
    assert cache.refreshes == 1
    for _ in range(500):  # bounded wait for two more refreshes
        if cache.refreshes >= 3:
            break
        await asyncio.sleep(0.01)
    assert cache.refreshes >= 3 and not cache.refresher_stopped
    await cache.stop()
    n = cache.refreshes
    await asyncio.sleep(0.05)
    assert cache.refreshes == n


async def test_unexpected_errors_are_contained() -> None:
    clock = Clock()

    class Broken(Source):
        async def fetch(self) -> Sequence[GpuNode]:
            raise ValueError("garbage from the source")

    cache = SnapshotCache(Broken(clock), clock=clock)
    assert not await cache.refresh_once()
    assert "garbage" in (cache.last_error or "") and "no telemetry snapshot yet" in cache.readiness().reason


def test_rejects_bad_interval() -> None:
    with pytest.raises(ValueError, match="refresh_interval_s"):
        CacheSettings(refresh_interval_s=0)


def powered(temp: float, watts: float, util: float) -> GpuNode:
    g = GpuInfo(
        index=0,
        uuid="p-0",
        model="H100",
        memory_total_bytes=80 * GIB,
        temperature_celsius=temp,
        power_watts=watts,
        utilization=util,
    )
    return GpuNode(name="p", gpus=(g,))


async def test_learns_cooling_quality_once_the_temperature_settles(setup: tuple) -> None:  # type: ignore[type-arg]
    cache, src, clock, _ = setup
    src.nodes = [powered(35.0, 70.0, 0.0)]  # idle: the baseline
    await cache.refresh_once()
    assert math.isnan(cache.snapshot.arrays.thermal_resistance[0, 0])
    src.nodes = [powered(83.0, 670.0, 0.9)]  # loaded: +48 °C for +600 W
    seen = []
    for _ in range(7):
        clock.t += 60
        await cache.refresh_once()
        seen.append(float(cache.snapshot.arrays.thermal_resistance[0, 0]))
    assert math.isnan(seen[0])  # still rising over the trend window: not learned from
    assert seen[-1] == pytest.approx(48 / 600)


async def test_on_publish_warms_each_snapshot_before_requests_see_it() -> None:
    clock = Clock()
    src = Source(clock)
    src.nodes = [node("a", [40.0, 41.0])]
    seen: list[tuple[int, bool]] = []
    cache: SnapshotCache

    def warm(snap: object) -> None:
        seen.append((id(snap), cache.snapshot is snap))  # not yet published while warming

    cache = SnapshotCache(src, clock=clock, on_publish=warm)
    assert await cache.refresh_once()
    assert seen == [(id(cache.snapshot), False)]


async def test_a_failing_warm_up_still_publishes_the_snapshot() -> None:
    clock = Clock()
    src = Source(clock)
    src.nodes = [node("a", [40.0])]

    def broken(snap: object) -> None:
        raise RuntimeError("warm-up bug")

    cache = SnapshotCache(src, clock=clock, on_publish=broken)
    assert await cache.refresh_once()
    assert [n.name for n in cache.snapshot.nodes] == ["a"]


async def test_refreshes_come_every_retry_interval_while_the_telemetry_is_out() -> None:
    """Issue 20, defect 8: after an outage the next refresh is not a whole refresh interval away. Failing, empty or
    all-stale telemetry is retried every ``retry_interval_s``; fresh telemetry is refreshed every interval."""
    clock = Clock()
    src = Source(clock)
    src.fail = True
    cache = SnapshotCache(src, CacheSettings(refresh_interval_s=5, max_age_s=30), clock=clock)
    assert cache.settings.retry_s == 1.0
    await cache.refresh_once()
    assert cache.recovering() and cache.next_wait_s() == 1.0  # the source fails
    src.fail = False
    await cache.refresh_once()
    assert cache.recovering() and cache.next_wait_s() == 1.0  # it answers, with no node
    src.nodes = [node("a", [40]), node("b", [41])]
    await cache.refresh_once()
    assert not cache.recovering() and cache.next_wait_s() == 5
    clock.t += 31  # every node older than max_age_s: out as a whole
    assert cache.recovering() and cache.next_wait_s() == 1.0


class PartlyFrozenSource(Source):
    """Nodes named in ``frozen`` keep the ``observed_at`` given there (not scraped again yet)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.frozen: dict[str, float] = {}

    async def fetch(self) -> Sequence[GpuNode]:
        nodes = await super().fetch()
        return [replace(n, observed_at=self.frozen.get(n.name, n.observed_at)) for n in nodes]


async def test_retry_interval_lasts_until_every_node_is_fresh_again_after_an_outage() -> None:
    """Issue 20, defect 8: a restarted Prometheus scrapes the exporters again one by one. Once the first node is fresh
    the telemetry is no longer out as a whole, but the others are still stale; refreshes keep coming every
    ``retry_interval_s`` until every node is fresh, for at most ``max_age_s`` after the outage (a node whose exporter
    is gone for good does not keep the cache refreshing every second)."""
    clock = Clock()
    src = PartlyFrozenSource(clock)
    src.nodes = [node("a", [40]), node("b", [41]), node("c", [42])]
    cache = SnapshotCache(src, CacheSettings(refresh_interval_s=5, max_age_s=30), clock=clock)
    await cache.refresh_once()
    assert not cache.recovering() and cache.next_wait_s() == 5
    before = clock.t
    src.fail = True
    clock.t += 40
    await cache.refresh_once()
    assert cache.recovering()
    src.fail = False
    src.frozen = {"b": before, "c": before}  # back: "a" scraped again, "b" and "c" not yet
    clock.t += 1
    await cache.refresh_once()
    assert cache.recovering() and cache.next_wait_s() == 1.0
    del src.frozen["b"]
    clock.t += 1
    await cache.refresh_once()
    assert cache.recovering() and cache.next_wait_s() == 1.0  # "c" still stale
    clock.t += 30  # "c" never comes back: the window (max_age_s after the outage) is over
    await cache.refresh_once()
    assert not cache.recovering() and cache.next_wait_s() == 5
    src.frozen.clear()
    clock.t += 5
    await cache.refresh_once()
    assert not cache.recovering()
    # a stale node outside any outage never shortens the interval
    src.frozen = {"c": clock.t}
    for _ in range(7):  # every refresh interval, until "c" is older than max_age_s
        clock.t += 5
        await cache.refresh_once()
        assert not cache.recovering() and cache.next_wait_s() == 5
    assert cache.snapshot.stale_nodes(clock.t, 30) == ["c"]
    # every node fresh right after an outage: the window ends at once
    src.fail = True
    clock.t += 40
    await cache.refresh_once()
    src.fail = False
    src.frozen.clear()
    await cache.refresh_once()
    assert not cache.recovering() and cache.next_wait_s() == 5


async def test_background_refresh_recovers_within_the_retry_interval() -> None:
    clock = Clock()
    src = Source(clock)
    src.fail = True
    src.nodes = [node("a", [40])]
    cache = SnapshotCache(src, CacheSettings(refresh_interval_s=60, max_age_s=120, retry_interval_s=0.01), clock=clock)
    await cache.start()
    assert not cache.healthy
    src.fail = False
    try:
        for _ in range(200):  # bounded: 2 s, far below the 60 s refresh interval
            if cache.healthy:
                break
            await asyncio.sleep(0.01)
        assert cache.healthy and cache.snapshot.nodes
    finally:
        await cache.stop()


def test_rejects_bad_retry_interval() -> None:
    with pytest.raises(ValueError, match="retry_interval_s"):
        CacheSettings(retry_interval_s=0)
