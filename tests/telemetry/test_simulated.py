"""The simulated fleet and its thermal model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from scheduler_plugin.model import GIB, GpuAssignment, Snapshot
from scheduler_plugin.model.claim import charged_milli
from scheduler_plugin.simulator import thermal_model as tm
from scheduler_plugin.simulator.simulated_fleet import FleetSpec, FleetSpecError, SimulatedFleetSource, nvlink_peers


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# -- thermal model -------------------------------------------------------------------------------------------------


def test_temperature_follows_load_and_cooling() -> None:
    p = tm.ThermalParams()
    idle = tm.settle(0.0, 1.0, p).temp_c
    busy = tm.settle(1.0, 1.0, p).temp_c
    busy_poor = tm.settle(1.0, 0.75, p).temp_c
    assert idle < busy < busy_poor
    assert float(idle) == pytest.approx(p.ambient_c + p.idle_w * p.resistance_c_per_w, abs=0.01)


def test_first_order_lag_moves_63_percent_per_time_constant() -> None:
    p = tm.ThermalParams()
    s0 = tm.settle(np.array([0.0]), 1.0, p)
    target = tm.steady_state_c(1.0, 1.0, p)
    s1 = tm.step(s0, 1.0, 1.0, dt_s=p.tau_s, params=p)
    moved = (s1.temp_c - s0.temp_c) / (target - s0.temp_c)
    assert float(moved[0]) == pytest.approx(1 - np.exp(-1), abs=1e-6)


def test_poor_cooling_throttles_and_levels_off_below_shutdown() -> None:
    p = tm.ThermalParams()
    hot = tm.settle(1.0, 0.75, p).temp_c
    assert p.throttle_onset_c <= float(hot) < p.throttle_floor_c + 2
    bits = int(tm.throttle_bits(hot, 1.0, p))
    assert bits & 0x20  # sw thermal slowdown
    assert float(tm.sm_clock_mhz(hot, 1.0, p)) < p.max_clock_mhz
    cool = tm.settle(0.5, 1.0, p).temp_c
    assert int(tm.throttle_bits(cool, 0.5, p)) == 0
    assert float(tm.sm_clock_mhz(cool, 0.5, p)) == p.max_clock_mhz


def test_step_rejects_negative_dt() -> None:
    p = tm.ThermalParams()
    with pytest.raises(ValueError, match="dt_s"):
        tm.step(tm.settle(0.0, 1.0, p), 0.0, 1.0, dt_s=-1, params=p)


# -- fleet spec ------------------------------------------------------------------------------------------------------


def test_nvlink_topologies() -> None:
    sw = nvlink_peers("nvswitch", 8)
    assert all(len(p) == 7 for p in sw)
    mesh = nvlink_peers("hybrid-cube-mesh", 8)
    assert all(len(p) == 4 for p in mesh)
    assert all(j in mesh[i] for i in range(8) for j in mesh[i]) and all(i in mesh[j] for i in range(8) for j in mesh[i])
    assert mesh[0] == frozenset({1, 2, 3, 4})
    assert nvlink_peers("nvlink-pairs", 4) == [frozenset({1}), frozenset({0}), frozenset({3}), frozenset({2})]
    assert nvlink_peers("pcie", 8) == [frozenset()] * 8


def test_uniform_mix() -> None:
    spec = FleetSpec.uniform(100, 8, "A100-SXM4-80GB", seed=3)
    assert spec.n_nodes == 100
    assert {g.topology for g in spec.groups} == {"nvswitch", "hybrid-cube-mesh", "pcie"}


def test_fleet_file(tmp_path: Path) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_text(
        "seed: 4\ninitialLoad: 0\ngroups:\n"
        "  - {count: 3, gpus: 8, model: H100-SXM-80GB, topology: nvswitch}\n"
        "  - {count: 2, gpus: 4, model: L40S-48GB, topology: pcie, namePrefix: l40s-, poorCoolingFraction: 1}\n"
    )
    src = SimulatedFleetSource(FleetSpec.from_yaml(f))
    nodes = {n.name: n for n in src.snapshot_nodes()}
    assert sorted(nodes) == ["gpu-node-1", "gpu-node-2", "gpu-node-3", "l40s-1", "l40s-2"]
    l40 = nodes["l40s-1"]
    assert len(l40.gpus) == 4 and l40.gpus[0].memory_total_bytes == 48 * GIB
    assert all(not g.nvlink_peers for g in l40.gpus)
    assert nodes["gpu-node-1"].gpus[0].nvlink_peers == frozenset(range(1, 8))
    assert [g.numa_node for g in nodes["gpu-node-1"].gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("groups: []", "groups"),
        ("groups: [{count: 0}]", "groups.0.count"),
        ("groups: [{count: 2, topology: torus}]", "groups.0.topology"),
        ("groups: [{count: 2, gpuz: 8}]", "groups.0.gpuz"),
        ("initialLoad: 2\ngroups: [{count: 1}]", "initialLoad"),
        ("- 1", "top level"),
    ],
)
def test_bad_fleet_file_names_the_field(tmp_path: Path, text: str, field: str) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_text(text)
    with pytest.raises(FleetSpecError, match=field):
        FleetSpec.from_yaml(f)


def test_same_prefix_keeps_counting() -> None:
    spec = FleetSpec.parse({"groups": [{"count": 1, "namePrefix": "n-"}, {"count": 1, "namePrefix": "n-"}]}, source="t")
    assert SimulatedFleetSource(spec).node_names == ["n-1", "n-2"]


# -- the source -------------------------------------------------------------------------------------------------------


def test_deterministic_given_seed() -> None:
    def run(seed: int) -> list[float]:
        clock = FakeClock()
        src = SimulatedFleetSource(FleetSpec.uniform(20, 8, seed=seed), clock=clock)
        src.advance(30)
        return [g.temperature_celsius for n in src.snapshot_nodes() for g in n.gpus]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_initial_load_shows_as_assignments_and_memory() -> None:
    src = SimulatedFleetSource(FleetSpec.uniform(50, 8, seed=0, initial_load=0.5))
    nodes = src.snapshot_nodes()
    busy = [(n, a) for n in nodes for a in n.assignments]
    assert busy
    n, a = busy[0]
    for i in a.gpu_indices:
        assert n.gpu(i).memory_used_bytes > GIB
    shared = [a for _, a in busy if a.memory_bytes is not None]
    assert shared and all(charged_milli(a, n.gpus[0].memory_total_bytes) < 1000 for a in shared)


def test_record_binding_loads_gpus_and_heats_them() -> None:
    clock = FakeClock()
    src = SimulatedFleetSource(FleetSpec.uniform(4, 8, seed=0, initial_load=0.0), clock=clock)
    node = src.node_names[0]
    before = {g.index: g for g in src.snapshot_nodes()[0].gpus}
    src.record_binding(node, GpuAssignment(pod_key="ns/p", gpu_indices=(2, 3)))
    src.advance(600)
    after = next(n for n in src.snapshot_nodes() if n.name == node)
    assert [a.pod_key for a in after.assignments] == ["ns/p"]
    for i in (2, 3):
        assert after.gpu(i).utilization > 0.4
        assert after.gpu(i).memory_used_bytes > before[i].memory_used_bytes
        assert after.gpu(i).temperature_celsius > before[i].temperature_celsius + 10
    assert after.gpu(0).utilization == 0.0
    assert src.release("ns/p")
    assert not src.release("ns/p")
    assert next(n for n in src.snapshot_nodes() if n.name == node).assignments == ()
    with pytest.raises(KeyError, match="no node"):
        src.record_binding("nope", GpuAssignment(pod_key="ns/q", gpu_indices=(0,)))


def test_poor_cooling_nodes_run_hotter() -> None:
    spec = FleetSpec.parse(
        {
            "initialLoad": 0.0,
            "groups": [
                {"count": 1, "namePrefix": "good-"},
                {"count": 1, "namePrefix": "poor-", "poorCoolingFraction": 1.0},
            ],
        },
        source="t",
    )
    src = SimulatedFleetSource(spec)
    for name in ("good-1", "poor-1"):
        src.record_binding(name, GpuAssignment(pod_key=f"ns/{name}", gpu_indices=tuple(range(8))))
    src.advance(1200)
    temps = {n.name: max(g.temperature_celsius for g in n.gpus) for n in src.snapshot_nodes()}
    assert temps["poor-1"] > temps["good-1"] + 5


def test_fetch_advances_with_the_clock_and_builds_a_snapshot() -> None:
    clock = FakeClock()
    src = SimulatedFleetSource(FleetSpec.uniform(10, 8, seed=0), clock=clock)
    clock.t += 5
    nodes = asyncio.run(src.fetch())
    assert len(nodes) == 10 and all(n.observed_at == clock.t for n in nodes)
    snap = Snapshot(tuple(nodes), taken_at=clock.t)
    assert snap.arrays.gpu_present.sum() == 80


@pytest.mark.parametrize(("count", "fraction", "poor"), [(48, 0.15, 7), (10, 0.0, 0), (3, 1.0, 3), (20, 0.06, 1)])
def test_poor_cooling_fraction_is_the_share_of_nodes(count: int, fraction: float, poor: int) -> None:
    for seed in (1, 2, 3):
        spec = FleetSpec.parse(
            {"seed": seed, "groups": [{"count": count, "poorCoolingFraction": fraction}]}, source="t"
        )
        cooling = SimulatedFleetSource(spec)._groups[0].cooling
        assert int((cooling < 0.9).sum()) == poor


def test_throttled_gpus_report_the_lower_power_they_draw() -> None:
    spec = FleetSpec.parse(
        {"initialLoad": 0.0, "groups": [{"count": 1, "gpus": 1, "poorCoolingFraction": 1.0}]}, source="t"
    )
    src = SimulatedFleetSource(spec)
    grp = src._groups[0]
    grp.cooling[:] = 0.4  # far too little airflow: it throttles under any load
    src.record_binding("gpu-node-1", GpuAssignment(pod_key="ns/p", gpu_indices=(0,)))
    src.advance(1200)
    (g,) = src.snapshot_nodes()[0].gpus
    assert g.thermally_throttled and g.power_watts is not None
    assert g.power_watts == pytest.approx(float(tm.power_w(g.utilization, grp.params, g.clock_ratio)), rel=0.02)
    assert g.power_watts < float(tm.power_w(g.utilization, grp.params))
