"""The thermal scenario (time-stepped, on the simulated fleet) and the workload variants."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from scheduler_plugin.model import GpuRequest
from scheduler_plugin.policies.base import CycleContext
from scheduler_plugin.policies.fragmentation.plugin import FragmentationBase
from scheduler_plugin.policies.fragmentation.workload import PodShape
from scheduler_plugin.policies.policy_file import PolicyConfig, ScorerConfig
from scheduler_plugin.simulator import thermal
from scheduler_plugin.simulator.fleet import apply_placement, build_fleet
from scheduler_plugin.simulator.node_resources import LeastAllocated, NodeResourcesFit
from scheduler_plugin.simulator.policies import SimPolicy, kelvin_policy
from scheduler_plugin.simulator.thermal import (
    THERMAL_POLICIES,
    ThermalScenario,
    arrivals,
    run_thermal,
    well_cooled,
)
from scheduler_plugin.simulator.trace import TraceNode, TracePod, load_trace
from scheduler_plugin.simulator.variants import FAMILIES, thinned, variant, variants

GIB = 2**30


def test_arrivals_are_seeded_and_sized_to_the_target_load() -> None:
    sc = ThermalScenario(nodes=10, hours=2.0, seed=1)
    a = arrivals(sc)
    assert a == arrivals(sc) and a != arrivals(ThermalScenario(nodes=10, hours=2.0, seed=2))
    gpu_s = sum(p.gpus * p.duration_s for p in a)
    offered = gpu_s / (sc.hours * 3600 * sc.nodes * sc.gpus_per_node)
    assert 0.4 < offered < 1.1  # about the 70 % target
    assert all(p.gpus in (1, 2, 4, 8) for p in a)


@pytest.mark.parametrize("policy", THERMAL_POLICIES)
def test_thermal_run_places_pods_and_accounts_heat(policy: str) -> None:
    r = run_thermal(ThermalScenario(nodes=6, hours=0.5, seed=3), policy)
    assert r.placements > 0 and r.gpu_hours_run > 0
    assert r.throttled_gpu_minutes >= 0 and 0 <= r.placements_on_hot_nodes <= r.placements
    assert 25 < r.max_temp_c < 110


def test_throttled_gpus_slow_the_work_and_a_cool_fleet_does_all_of_it() -> None:
    hot = ThermalScenario(nodes=4, hours=1.0, seed=5, poor_cooling_fraction=1.0, ambient_c=40.0, target_load=0.9)
    r = run_thermal(hot, "default")
    assert r.throttled_gpu_minutes > 0
    # a throttled GPU runs below full clocks: the work done is less than the GPU-time held
    assert 0 < r.useful_gpu_hours < r.gpu_hours_run - 0.05
    cool = run_thermal(well_cooled(replace(hot, ambient_c=20.0)), "default")
    assert cool.throttled_gpu_minutes == 0
    assert abs(cool.useful_gpu_hours - cool.gpu_hours_run) < 0.1 * cool.gpu_hours_run  # full clocks: work = time


@pytest.mark.slow
def test_the_operator_evicts_from_hot_nodes_and_pays_for_it() -> None:
    sc = ThermalScenario(nodes=4, hours=1.5, seed=5, poor_cooling_fraction=0.5, ambient_c=36.0, target_load=0.9)
    alone = run_thermal(sc, "kelvin")
    warm = run_thermal(sc, "kelvin+operator-warm")
    assert alone.evictions == 0 and alone.lost_gpu_minutes == 0
    assert warm.evictions > 0
    # each eviction costs at least its restart, on every GPU of the pod
    assert warm.lost_gpu_minutes >= warm.evictions * sc.restart_s / 60.0
    assert warm.cost_gpu_minutes == warm.throttled_gpu_minutes + warm.lost_gpu_minutes
    # the default rule (pays) moves a pod only when its throttling costs more than the move: fewer evictions, and
    # less throttled time plus eviction cost than moving every pod on a warm GPU
    pays = run_thermal(sc, "kelvin+operator")
    assert pays.evictions < warm.evictions
    assert pays.cost_gpu_minutes < warm.cost_gpu_minutes


@pytest.mark.slow
def test_kelvin_holds_a_pod_rather_than_place_it_where_it_would_throttle(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenario tells the policy how long each pod has waited (``GpuRequest.pending_since``), so kelvin's thermal
    policy can hold a pod from a node its learned cooling says would throttle (``holdRunSeconds``); with the hold off
    the same pods go where they fit at once."""
    sc = ThermalScenario(nodes=8, hours=1.5, seed=1, poor_cooling_fraction=0.25)
    held = run_thermal(sc, "kelvin")
    at_once = run_thermal(sc, "kelvin-no-thermal")  # nor does the policy without the thermal score hold
    base = PolicyConfig()
    thermal_args = {**base.scoring["thermal"].args, "holdRunSeconds": 0}
    scoring = {**base.scoring, "thermal": ScorerConfig(weight=base.scoring["thermal"].weight, args=thermal_args)}
    no_hold = kelvin_policy(base.model_copy(update={"scoring": scoring}), "kelvin")
    monkeypatch.setattr(thermal, "thermal_policy", lambda name: no_hold)
    unheld = run_thermal(sc, "kelvin")
    assert held.mean_wait_s > unheld.mean_wait_s + 30 and at_once.mean_wait_s < held.mean_wait_s
    assert held.throttled_gpu_minutes <= unheld.throttled_gpu_minutes


def test_kelvin_learns_the_scenario_mix_from_its_arrivals_as_the_extender_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pod the scenario tries to place is observed by the framework, as the extender's filter observes every
    pod it sees: kelvin's fragmentation score packs against the scenario's 1/2/4/8-GPU mix, not its prior. A pod tried
    again (it waited) or queued again (evicted) counts once."""
    built: list[SimPolicy] = []
    make = thermal.thermal_policy

    def keep(name: str) -> SimPolicy:
        built.append(make(name))
        return built[-1]

    monkeypatch.setattr(thermal, "thermal_policy", keep)
    sc = ThermalScenario(nodes=4, hours=1.0, seed=5, poor_cooling_fraction=0.5, ambient_c=36.0, target_load=0.9)
    r = run_thermal(sc, "kelvin+operator-warm")
    frag = next(ws.plugin for ws in built[0].framework.scorers if ws.name == "fragmentation")
    assert isinstance(frag, FragmentationBase)
    observed = frag.estimator.observed
    assert r.evictions > 0 and r.mean_wait_s > 0  # pods were tried more than once
    assert r.placements <= observed <= len(arrivals(sc))
    learned = frag.estimator.weights()
    assert all(PodShape(sc.cpu_per_gpu * n, 1000, n, None) in learned for n in (1, 2, 4, 8))


def test_least_allocated_spreads_and_node_resources_fit_checks_cpu() -> None:
    fleet = build_fleet([TraceNode("a", 16000, 64 * GIB, 2, "T4"), TraceNode("b", 16000, 64 * GIB, 2, "T4")])
    req = GpuRequest(count=1, cpu_milli=4000, host_memory_bytes=GIB)
    apply_placement(fleet, req, 0, (0,))
    ctx = CycleContext(now=0.0)
    rows = np.arange(2)
    assert np.argmax(LeastAllocated().score(req, fleet, rows, ctx)) == 1
    big = GpuRequest(count=1, cpu_milli=14000)
    assert NodeResourcesFit().filter(big, fleet, rows, ctx).tolist() == [False, True]
    assert "Insufficient cpu" in NodeResourcesFit().explain(big, fleet, 0, ctx).reason


def _gpu_share(pods: tuple[TracePod, ...], cls: Callable[[TracePod], bool]) -> float:
    gpu = [p for p in pods if p.num_gpu > 0]
    return sum(cls(p) for p in gpu) / len(gpu)


@pytest.mark.slow
@pytest.mark.parametrize(("family", "level"), variants())
def test_each_variant_has_the_mix_its_level_claims(traces_dir: Path, family: str, level: float) -> None:
    full = load_trace(traces_dir / "openb_node_list_gpu_node.csv", traces_dir / "openb_pod_list_default.csv")
    v = variant(full, family, level, seed=3)
    assert v.nodes == full.nodes
    assert v.pods == variant(full, family, level, seed=3).pods  # seeded
    assert v.pods != variant(full, family, level, seed=4).pods or (family == "cpu-heavy" and level == 1.0)
    if family == "multi-gpu":
        assert abs(_gpu_share(v.pods, lambda p: p.num_gpu > 1) - level) < 0.02
    elif family == "sharing":
        assert abs(_gpu_share(v.pods, lambda p: p.num_gpu == 1 and p.gpu_milli < 1000) - level) < 0.02
    elif family == "model-constrained":
        assert abs(_gpu_share(v.pods, lambda p: p.gpu_spec is not None) - level) < 0.02
        widest: dict[str, int] = {}
        for n in full.nodes:
            widest[n.model] = max(widest.get(n.model, 0), n.gpus)
        pinned = [p for p in v.pods if p.gpu_spec is not None]
        assert all(widest[m] >= p.num_gpu for p in pinned for m in p.gpu_spec)  # a node of the model fits it
    else:
        cpu = sum(p.cpu_milli for p in v.pods if p.num_gpu == 0)
        base = sum(p.cpu_milli for p in full.pods if p.num_gpu == 0)
        biggest = max(p.cpu_milli for p in full.pods if p.num_gpu == 0)
        assert abs(cpu - level * base) <= biggest
        assert [p for p in v.pods if p.num_gpu] == [p for p in full.pods if p.num_gpu]  # GPU pods untouched
    if family != "model-constrained":  # copies have names of their own (the simulator counts a name once)
        assert len({p.name for p in v.pods}) == len(v.pods)
    if family in ("multi-gpu", "sharing"):
        assert len(v.pods) == len(full.pods)


def test_variant_families_and_levels_are_checked(small_trace: tuple[Path, Path]) -> None:
    trace = load_trace(*small_trace)
    assert set(FAMILIES) == {"multi-gpu", "sharing", "model-constrained", "cpu-heavy"}
    assert [lv for f, lv in variants(["cpu-heavy"])] == [0.5, 1.0, 1.5, 2.0, 2.5]
    with pytest.raises(ValueError, match="unknown variant family 'nope'"):
        variant(trace, "nope")
    with pytest.raises(ValueError, match=r"level 1\.5 is outside 0\.\.1"):
        variant(trace, "sharing", 1.5)
    with pytest.raises(ValueError, match="unknown variant family"):
        variants(["nope"])
    all_sharing = variant(trace, "sharing", 1.0, seed=1)
    assert all(p.num_gpu == 1 and p.gpu_milli < 1000 for p in all_sharing.pods if p.num_gpu)
    assert len(variant(trace, "cpu-heavy", 3.0, seed=1).pods) == len(trace.pods) + 2


def test_thinned_keeps_every_kth_node_per_model_and_every_kth_pod(small_trace: tuple[Path, Path]) -> None:
    trace = load_trace(*small_trace)
    assert thinned(trace, 1) is trace
    half = thinned(trace, 2)
    assert [n.name for n in half.nodes] == ["n0", "n2"]
    assert [p.name for p in half.pods] == ["p0", "p2", "p4", "p6"]
    with pytest.raises(ValueError, match="at least 1"):
        thinned(trace, 0)
