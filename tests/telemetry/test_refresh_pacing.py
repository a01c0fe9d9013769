"""The refresh takes turns with requests and always gets its share of the event loop; the simulated fleet reports
its trend in simulated time.

The share tests run on a fake clock that only the work itself advances: "requests" that never stop (each costs 10 ms
of fake time and yields while being served, like a verb awaiting its body) and background slices (1 ms each). What
they check is the interleaving, not the speed of the machine."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from scheduler_plugin.model import GpuAssignment, GpuNode
from scheduler_plugin.simulator.simulated_fleet import TREND_MIN_S, SimulatedFleetSource
from scheduler_plugin.telemetry.cache import CacheSettings, SnapshotCache
from scheduler_plugin.telemetry.gate import RequestGate


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class EndlessRequests:
    """``clients`` tasks, each serving one request after another without a gap (the gate never sees idle)."""

    def __init__(self, gate: RequestGate, clock: FakeClock, clients: int = 2, cost_s: float = 0.010) -> None:
        self.gate, self.clock, self.cost_s = gate, clock, cost_s
        self.served = 0
        self._stop = False
        self._tasks = [asyncio.create_task(self._client()) for _ in range(clients)]

    async def _client(self) -> None:
        while not self._stop:
            with self.gate.serving():
                self.clock.t += self.cost_s
                await asyncio.sleep(0)
            self.served += 1

    async def stop(self) -> None:
        self._stop = True
        await asyncio.gather(*self._tasks)


class SlicedSource:
    """A source whose fetch is ``slices`` slices of ``slice_s`` fake seconds, with ``pause`` awaited in between."""

    name = "sliced"

    def __init__(self, nodes: Sequence[GpuNode], clock: FakeClock, slices: int, slice_s: float = 0.001) -> None:
        self.nodes, self.clock, self.slices, self.slice_s = list(nodes), clock, slices, slice_s
        self.pause = RequestGate().pause

    async def fetch(self) -> Sequence[GpuNode]:
        for _ in range(self.slices):
            self.clock.t += self.slice_s
            await self.pause()
        return self.nodes

    async def close(self) -> None:
        return None


async def test_background_work_gets_its_share_of_the_loop_under_endless_requests() -> None:
    clock = FakeClock()
    gate = RequestGate(share=0.25, poll_s=0.0, max_defer_s=0.02, clock=clock)
    load = EndlessRequests(gate, clock)
    await asyncio.sleep(0)
    start, slices = clock(), 400
    for _ in range(slices):
        clock.t += 0.001
        await gate.pause()
    elapsed = clock() - start
    await load.stop()
    work = slices * 0.001
    # The background work got about a quarter of the (fake) time, and requests the rest of it.
    assert work / elapsed == pytest.approx(0.25, abs=0.05)
    assert load.served * load.cost_s >= 0.7 * elapsed


def _loaded_cache(clock: FakeClock, slices: int = 500) -> tuple[SnapshotCache, SlicedSource]:
    gate = RequestGate(share=0.25, max_share=0.75, poll_s=0.0, max_defer_s=0.02, clock=clock)
    nodes = SimulatedFleetSource.uniform(200, 8, seed=3).snapshot_nodes()
    src = SlicedSource(nodes, clock, slices=slices)
    cache = SnapshotCache(src, CacheSettings(build_slice_nodes=4, max_age_s=30.0), gate=gate, clock=clock)
    src.pause = gate.pause
    return cache, src


async def test_refresh_completes_while_requests_never_stop() -> None:
    """Issue 10: with clients looping /filter the refresh, deferred slice by slice, never completed and every node
    went stale. Now it completes within its share of the loop."""
    clock = FakeClock()
    cache, src = _loaded_cache(clock)
    assert await cache.refresh_once()  # unloaded: a fresh snapshot, nothing urgent
    load = EndlessRequests(cache.gate, clock)
    start = clock()
    assert await asyncio.wait_for(cache.refresh_once(), 60)
    elapsed = clock() - start
    await load.stop()
    assert cache.refreshes == 2 and cache.snapshot.arrays.n_nodes == 200
    work = src.slices * src.slice_s
    assert work / elapsed == pytest.approx(0.25, abs=0.05)  # 2 s of fake time, not hours
    assert load.served > 0


async def test_refresh_gets_more_of_the_loop_as_the_snapshot_nears_staleness() -> None:
    clock = FakeClock()
    cache, src = _loaded_cache(clock)
    assert await cache.refresh_once()
    assert cache.urgency() == 0.0
    clock.t += 29.0  # max_age_s is 30: about to go stale
    assert cache.urgency() == pytest.approx(14 / 15, abs=0.05)
    load = EndlessRequests(cache.gate, clock)
    start = clock()
    assert await asyncio.wait_for(cache.refresh_once(), 60)
    elapsed = clock() - start
    await load.stop()
    assert src.slices * src.slice_s / elapsed >= 0.6
    assert load.served > 0  # requests still get a quarter of the loop
    assert cache.urgency() == 0.0


def test_gate_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="share"):
        RequestGate(share=1.0)
    with pytest.raises(ValueError, match="max_share"):
        RequestGate(share=0.5, max_share=0.4)
    with pytest.raises(ValueError, match="min_turn_s"):
        RequestGate(min_turn_s=0)
    with pytest.raises(ValueError, match="max_turn_s"):
        RequestGate(min_turn_s=0.5, max_turn_s=0.1)


async def test_a_turn_is_bounded_however_long_the_wait_before_it() -> None:
    clock = FakeClock()
    gate = RequestGate(share=0.5, max_share=0.5, max_turn_s=0.2, poll_s=0.0, clock=clock)

    async def long_request() -> None:
        with gate.serving():
            clock.t += 10.0  # e.g. an explain over the whole fleet, or the process not scheduled for 10 s

    request = asyncio.create_task(long_request())
    await gate.pause()  # steps aside: the request runs, 10 s pass
    await request
    loop = asyncio.get_running_loop()
    slices, yielded = 0, False

    def mark() -> None:
        nonlocal yielded
        yielded = True

    while not yielded and slices < 20_000:  # 1 ms slices until the turn ends and pause yields to the loop
        clock.t += 0.001
        slices += 1
        loop.call_soon(mark)  # runs only if pause lets the loop turn
        await gate.pause()
    assert 199 <= slices <= 201  # a 0.2 s turn, not the 10 s that half of the wait would give


async def test_pause_waits_while_a_request_is_served() -> None:
    clock = FakeClock()
    gate = RequestGate(max_defer_s=60.0, clock=clock)
    await asyncio.wait_for(gate.pause(), 5)  # idle: returns at once
    clock.t += 1.0  # this turn is over
    with gate.serving():
        task = asyncio.create_task(gate.pause())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not task.done()
    await asyncio.wait_for(task, 5)
    assert gate.active == 0


async def test_pause_is_bounded_under_sustained_load() -> None:
    gate = RequestGate(max_defer_s=0.0)
    with gate.serving():
        await asyncio.wait_for(gate.pause(), 5)


async def test_refresh_builds_the_simulated_fleet_in_slices() -> None:
    src = SimulatedFleetSource.uniform(40, 8, seed=1)
    cache = SnapshotCache(src, CacheSettings(build_slice_nodes=3))
    src.pause = cache.gate.pause
    assert await cache.refresh_once()
    first = cache.snapshot
    assert await cache.refresh_once()
    assert cache.snapshot is not first and cache.snapshot.arrays.n_nodes == 40
    assert [nd.name for nd in cache.snapshot.nodes] == src.node_names


def test_simulated_trend_is_per_simulated_minute() -> None:
    src = SimulatedFleetSource.uniform(2, 2, seed=0, initial_load=0)
    start = src.snapshot_nodes()
    assert all(g.temperature_trend_c_per_min == 0.0 for nd in start for g in nd.gpus)
    before = {g.uuid: g.temperature_celsius for nd in start for g in nd.gpus}
    src.advance(TREND_MIN_S / 2)  # too short a history: no trend yet
    assert all(g.temperature_trend_c_per_min == 0.0 for nd in src.snapshot_nodes() for g in nd.gpus)
    node = src.node_names[0]
    src.record_binding(node, GpuAssignment(pod_key="t/busy", gpu_indices=(0, 1)))
    src.advance(40.0)
    nodes = {nd.name: nd for nd in src.snapshot_nodes()}
    for g in nodes[node].gpus:  # a loaded GPU heats up; the slope is against the first sample, 45 s earlier
        assert g.temperature_trend_c_per_min > 5.0
        assert g.temperature_trend_c_per_min == pytest.approx(
            (g.temperature_celsius - before[g.uuid]) * 60 / 45, abs=1.0
        )
