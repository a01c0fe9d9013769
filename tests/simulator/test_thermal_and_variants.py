"""The thermal scenario (time-stepped, on the simulated fleet) and the workload variants."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from scheduler_plugin.model import GpuRequest
from scheduler_plugin.policies.base import CycleContext
from scheduler_plugin.simulator.fleet import apply_placement, build_fleet
from scheduler_plugin.simulator.kube import LeastAllocated, NodeResourcesFit
from scheduler_plugin.simulator.thermal import THERMAL_POLICIES, ThermalScenario, arrivals, run_thermal
from scheduler_plugin.simulator.trace import TraceNode, load_trace
from scheduler_plugin.simulator.variants import VARIANTS, variant

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


@pytest.mark.slow
def test_variants_change_the_mix_they_claim(traces_dir: Path) -> None:
    full = load_trace(traces_dir / "openb_node_list_gpu_node.csv", traces_dir / "openb_pod_list_default.csv")
    base = Counter((p.num_gpu > 1, p.num_gpu == 1 and p.gpu_milli < 1000, p.num_gpu == 0) for p in full.pods)
    multi = variant(full, "multi-gpu")
    assert sum(p.num_gpu > 1 for p in multi.pods) > 5 * base[(True, False, False)]
    share = variant(full, "sharing")
    assert sum(p.num_gpu == 1 and p.gpu_milli < 1000 for p in share.pods) > 1.4 * base[(False, True, False)]
    spec = variant(full, "model-constrained")
    models = {n.model for n in full.nodes}
    constrained = [p for p in spec.pods if p.gpu_spec]
    assert len(constrained) > 0.3 * len(spec.pods) and all((p.gpu_spec or frozenset()) <= models for p in constrained)
    cpu = variant(full, "cpu-heavy")
    assert sum(p.num_gpu == 0 for p in cpu.pods) == 3 * base[(False, False, True)]
    assert set(VARIANTS) == {"multi-gpu", "sharing", "model-constrained", "cpu-heavy"}
    with pytest.raises(ValueError, match="unknown variant"):
        variant(full, "nope")
