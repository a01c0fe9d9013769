"""Building the fleet arrays in slices, per-snapshot memos, and the thermal trend guard."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from scheduler_plugin.model import GpuNode, GpuRequest, Snapshot, build_arrays
from scheduler_plugin.model.snapshot import ArraysBuilder, FleetArrays, IndexKey
from scheduler_plugin.policies.base import CycleContext
from scheduler_plugin.policies.thermal import ThermalArgs, ThermalScore
from scheduler_plugin.simulator.simulated_fleet import SimulatedFleetSource
from tests.fleet_helpers import NOW, dgx, gpu, node, request, shared, whole


def _same(a: FleetArrays, b: FleetArrays) -> None:
    for f in dataclasses.fields(a):
        if not f.compare:  # the snapshot index (``derived``): data computed from the columns, not a column
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, f.name
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f.name
        else:
            assert x == y, f.name


def _mixed_nodes() -> list[GpuNode]:
    src = SimulatedFleetSource.uniform(20, 8, seed=3)
    return [
        *src.snapshot_nodes(),
        dgx("big", assignments=[whole("w", 0), shared("s", 3, milli=250, mem_gib=10)]),
        node("small", [gpu(0, model="T4", mem_gib=16, switch="sw0"), gpu(1, model="T4", mem_gib=16, nvlink=[0])]),
        node("empty", []),
    ]


@pytest.mark.parametrize("step", [1, 3, 7, 64])
def test_sliced_build_equals_one_shot_build(step: int) -> None:
    nodes = _mixed_nodes()
    b = ArraysBuilder(nodes)
    for lo in range(0, len(nodes), step):
        b.fill(lo, lo + step)
    _same(b.finish(), build_arrays(nodes))


def test_builder_rejects_gaps_and_early_finish() -> None:
    b = ArraysBuilder(_mixed_nodes())
    with pytest.raises(ValueError, match="in order"):
        b.fill(5, 10)
    b.fill(0, 5)
    with pytest.raises(ValueError, match="not filled"):
        b.finish()


def test_snapshot_takes_prebuilt_arrays_of_its_own_nodes_only() -> None:
    nodes = tuple(_mixed_nodes())
    arrays = build_arrays(nodes)
    assert Snapshot(nodes, taken_at=NOW, prebuilt=arrays).arrays is arrays
    with pytest.raises(ValueError, match="do not match"):
        Snapshot(nodes[:-1], taken_at=NOW, prebuilt=arrays)


def test_snapshot_index_recomputes_only_when_a_column_is_replaced() -> None:
    f = build_arrays([dgx("a"), dgx("b")])
    calls: list[int] = []

    def total(fl: FleetArrays) -> float:
        calls.append(1)
        return float(fl.temp.sum())

    key = IndexKey[float]("test.total", ("temp", "slowdown"))
    first = f.derive(key, total)
    assert f.derive(key, total) == first and len(calls) == 1
    overlay = f.with_assumed({"a": [whole("x", 1)]})  # the overlay shares telemetry (and the index)
    assert overlay.derive(key, total) == first and len(calls) == 1
    g = dataclasses.replace(f, temp=f.temp + 1.0)
    assert g.derive(key, total) == first + f.temp.size and len(calls) == 2


def test_thermal_score_follows_a_new_snapshot() -> None:
    score = ThermalScore(ThermalArgs())
    req: GpuRequest = request(1)
    cool = build_arrays([node("a", [gpu(0, temp=50)])])
    hot = build_arrays([node("a", [gpu(0, temp=85)])])
    idx = np.array([0], dtype=np.int64)
    assert score.score(req, cool, idx, CycleContext(now=NOW))[0] == 1.0
    assert score.score(req, hot, idx, CycleContext(now=NOW))[0] == pytest.approx(2 / 25)


def test_trend_is_judged_only_on_warm_gpus() -> None:
    score = ThermalScore(ThermalArgs())
    idx = np.array([0, 1], dtype=np.int64)
    # 40 °C rising 20 °C/min: a GPU that just got a job, 47 °C below slowdown; 70 °C rising 1 °C/min: warm.
    f = build_arrays([node("fresh", [gpu(0, temp=40, trend=20.0)]), node("warm", [gpu(0, temp=70, trend=1.0)])])
    fresh, warm = score.score(request(1), f, idx, CycleContext(now=NOW)).tolist()
    assert fresh == 1.0
    assert warm == pytest.approx(12 / 25)
    strict = ThermalScore(ThermalArgs(trend_from_headroom_celsius=100))
    assert strict.score(request(1), f, idx, CycleContext(now=NOW))[0] == 0.0
    (line,) = score.explain(request(1), f, 0, CycleContext(now=NOW))
    assert "not judged" in line
