"""CoolingEstimator: each GPU's thermal resistance learned from successive readings of a fleet."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from scheduler_plugin.model import FleetArrays, GpuAssignment, GpuNode, build_arrays
from scheduler_plugin.simulator.simulated_fleet import FleetSpec, SimulatedFleetSource
from scheduler_plugin.telemetry.cooling import CoolingEstimator

STEP_S = 30.0


def two_node_fleet() -> SimulatedFleetSource:
    spec = FleetSpec.parse(
        {
            "seed": 3,
            "initialLoad": 0.0,
            "xidRatePerGpuHour": 0.0,
            "groups": [
                {"count": 1, "gpus": 2, "namePrefix": "good-"},
                {"count": 1, "gpus": 2, "namePrefix": "poor-", "poorCoolingFraction": 1.0},
            ],
        },
        source="test",
    )
    return SimulatedFleetSource(spec, clock=lambda: 0.0)


def read(src: SimulatedFleetSource, previous: FleetArrays | None) -> FleetArrays:
    fleet = build_arrays(src.snapshot_nodes(observed_at=0.0))
    if previous is not None:
        fleet.trend = (fleet.temp - previous.temp) * (60.0 / STEP_S)
    return fleet


def run(src: SimulatedFleetSource, est: CoolingEstimator, steps: int, fleet: FleetArrays | None) -> FleetArrays:
    for _ in range(steps):
        src.advance(STEP_S)
        fleet = read(src, fleet)
        est.fill(fleet)
    assert fleet is not None
    return fleet


def true_resistance(src: SimulatedFleetSource, name: str) -> float:
    for grp in src._groups:  # the simulator's ground truth (private on purpose: telemetry never sees it)
        if name in grp.names:
            return grp.params.resistance_c_per_w / float(grp.cooling[grp.names.index(name)])
    raise KeyError(name)


def test_learns_each_gpus_resistance_under_load_and_keeps_it_while_idle() -> None:
    src = two_node_fleet()
    est = CoolingEstimator()
    fleet = run(src, est, 4, None)  # idle: baselines only, nothing learned yet
    assert np.isnan(fleet.thermal_resistance[fleet.gpu_present]).all()
    for name in ("good-1", "poor-1"):
        src.record_binding(name, GpuAssignment(f"ns/{name}", (0,)))
    fleet = run(src, est, 20, fleet)
    r = {name: float(fleet.thermal_resistance[fleet.index[name], 0]) for name in ("good-1", "poor-1")}
    for name, value in r.items():
        assert value == pytest.approx(true_resistance(src, name), rel=0.12)
    assert r["poor-1"] > r["good-1"] * 1.1
    # GPU 1 never carried load: the cautious prior, the worst learned so far
    assert fleet.thermal_resistance[fleet.index["good-1"], 1] == pytest.approx(r["poor-1"])
    for name in ("good-1", "poor-1"):
        src.release(f"ns/{name}")
    idle = run(src, est, 20, fleet)
    assert idle.thermal_resistance[idle.index["poor-1"], 0] == r["poor-1"]  # kept, not decayed


def test_source_reported_resistance_wins() -> None:
    src = two_node_fleet()
    nodes = src.snapshot_nodes(observed_at=0.0)
    reported = [replace(nd, gpus=tuple(replace(g, thermal_resistance_c_per_w=0.05) for g in nd.gpus)) for nd in nodes]
    fleet = build_arrays(reported)
    CoolingEstimator().fill(fleet)
    assert (fleet.thermal_resistance[fleet.gpu_present] == 0.05).all()


def test_rows_follow_node_names_when_the_fleet_changes() -> None:
    src = two_node_fleet()
    est = CoolingEstimator()
    fleet = run(src, est, 2, None)
    src.record_binding("poor-1", GpuAssignment("ns/p", (0, 1)))
    fleet = run(src, est, 20, fleet)
    learned = float(fleet.thermal_resistance[fleet.index["poor-1"], 0])
    nodes = src.snapshot_nodes(observed_at=0.0)
    extra = GpuNode(name="new-1", gpus=nodes[0].gpus, observed_at=0.0)
    shuffled = build_arrays([extra, nodes[1]])  # good-1 gone, a new node first, poor-1 moved to row 1
    shuffled.trend = np.zeros_like(shuffled.temp)
    est.fill(shuffled)
    assert shuffled.thermal_resistance[1, 0] == pytest.approx(learned, rel=0.05)
    assert shuffled.thermal_resistance[0, 0] == pytest.approx(learned, rel=0.05)  # the new node: the prior


def test_without_power_readings_nothing_is_learned() -> None:
    src = two_node_fleet()
    src.record_binding("poor-1", GpuAssignment("ns/p", (0,)))
    est = CoolingEstimator()
    fleet: FleetArrays | None = None
    for _ in range(10):
        src.advance(STEP_S)
        nodes = [
            replace(nd, gpus=tuple(replace(g, power_watts=None) for g in nd.gpus))
            for nd in src.snapshot_nodes(observed_at=0.0)
        ]
        fleet = build_arrays(nodes)
        est.fill(fleet)
    assert fleet is not None and np.isnan(fleet.thermal_resistance).all()


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 1.5}, "alpha"),
        ({"settled_c_per_min": math.nan}, "settled_c_per_min"),
        ({"min_added_watts": 0.0}, "min_added_watts"),
        ({"prior_percentile": 120.0}, "prior_percentile"),
    ],
)
def test_bad_settings_name_the_field(kw: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CoolingEstimator(**kw)
