"""The refresh steps aside for requests; the simulated fleet reports its trend in simulated time."""

from __future__ import annotations

import asyncio

import pytest

from scheduler_plugin.model import GpuAssignment
from scheduler_plugin.telemetry.cache import RequestGate, SnapshotCache
from scheduler_plugin.telemetry.simulated import TREND_MIN_S, SimulatedFleetSource


async def test_pause_waits_while_a_request_is_served() -> None:
    gate = RequestGate(max_defer_s=60.0)
    await asyncio.wait_for(gate.pause(), 5)  # idle: returns at once
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
    cache = SnapshotCache(src, build_slice_nodes=3)
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
