"""kube-scheduler around the extender in a replay: the nodes it asks about, its resource scores, its choice."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_plugin.model import GpuRequest
from scheduler_plugin.policies.fragmentation import WORKLOAD_KEY
from scheduler_plugin.policies.ranking import tied_best
from scheduler_plugin.simulator.engine import choose_row, prepare, run
from scheduler_plugin.simulator.fleet import apply_placement, build_fleet
from scheduler_plugin.simulator.kube_scheduler import (
    KubeCycle,
    KubeScheduler,
    nodes_to_find,
    resource_scores,
    rounded,
)
from scheduler_plugin.simulator.policies import build_policy, feasible, pick, rank
from scheduler_plugin.simulator.trace import Trace, TraceNode, TracePod

GIB = 2**30


@pytest.mark.parametrize(
    ("n_nodes", "percentage", "expected"),
    [
        (50, 0, 50),  # fewer than 100 nodes: all of them
        (99, 10, 99),
        (1213, 0, 497),  # openb: 50 - 1213/125 = 41 %
        (5000, 0, 500),  # 10 %
        (6000, 0, 300),  # 50 - 48 = 2 %, floored at 5 %
        (20000, 0, 1000),
        (150, 10, 100),  # never fewer than 100
        (1000, 100, 1000),
        (1000, 30, 300),
    ],
)
def test_nodes_to_find_follows_kube_scheduler(n_nodes: int, percentage: int, expected: int) -> None:
    assert nodes_to_find(n_nodes, percentage) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"percentage_of_nodes_to_score": 101}, "percentage_of_nodes_to_score must be 0..100, got 101"),
        ({"percentage_of_nodes_to_score": -1}, "percentage_of_nodes_to_score must be 0..100, got -1"),
        ({"extender_weight": 0}, "extender_weight must be positive, got 0"),
    ],
)
def test_bad_configuration_names_the_field(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KubeScheduler(**kwargs)


def test_describe_says_what_is_modelled() -> None:
    assert KubeScheduler().describe() == (
        "kube-scheduler: the adaptive share of nodes scored, extender weight 5, resource scores off, "
        "kelvin first node alone at 10"
    )
    text = KubeScheduler(100, 2, resource_scores=True, rounded_only=True).describe()
    assert "100 % of nodes" in text and "weight 2" in text and "resource scores on" in text and "rounded" in text


def test_resource_scores_match_least_allocated_plus_balanced_allocation_by_hand() -> None:
    fleet = build_fleet(tuple(TraceNode(f"n{i}", 8000, 8 * GIB, 1, "T4") for i in range(2)))
    cpu_alloc, mem_alloc = fleet.cpu_free.copy(), fleet.mem_free_host.copy()
    # n0: 2 CPUs and 2 GiB used; n1: 2 CPUs used, no memory
    fleet.cpu_free[:] = 6000
    fleet.mem_free_host[0] -= 2 * GIB
    rows = np.arange(2, dtype=np.int64)
    req = GpuRequest(count=1, cpu_milli=2000, host_memory_bytes=2 * GIB)
    # n0 with the pod: 4 of 8 CPUs, 4 of 8 GiB: LeastAllocated (50 + 50) / 2 = 50; balance 100 with and 100 without:
    # 50 + (50 + 0) / 2 = 75.  n1: CPU 4/8, memory 2/8: (50 + 75) / 2 = 62; balance 1 - 0.25/2 = 87 with the pod,
    # 1 - 0.25/2 = 87 without (2/8 against 0): 75
    assert resource_scores(req, fleet, cpu_alloc, mem_alloc, rows).tolist() == [125, 137]
    # a pod that asks no CPU counts kube-scheduler's default 100m: n1 with it: CPU 2100/8000, memory 2/8 GiB
    # LeastAllocated (73 + 75) / 2 = 74; balance int(99.375) = 99 with, 87 without: 50 + (50 + 12) / 2 = 81
    no_cpu = GpuRequest(count=1, host_memory_bytes=2 * GIB)
    assert resource_scores(no_cpu, fleet, cpu_alloc, mem_alloc, rows[1:]).tolist() == [155]


def test_rounded_is_half_up_and_clipped() -> None:
    assert rounded(np.array([-0.2, 0.49, 0.5, 7.5, 9.6, 12.0])).tolist() == [0, 0, 1, 8, 10, 10]


def test_window_takes_the_first_fitting_nodes_from_a_moving_start() -> None:
    fleet = build_fleet(tuple(TraceNode(f"n{i}", 8000, 8 * GIB, 1, "T4") for i in range(300)))
    cycle = KubeCycle(KubeScheduler(percentage_of_nodes_to_score=10), fleet, seed=7)
    assert cycle.to_find == 100
    assert sorted(cycle.order.tolist()) == list(range(300))  # a permutation of the rows
    fits = np.ones(300, dtype=bool)
    fits[cycle.order[:50]] = False  # the first 50 in its order do not fit
    first = cycle.window(fits)
    assert first.tolist() == cycle.order[50:150].tolist()
    assert cycle.start == 150  # past the 150 nodes it looked at
    second = cycle.window(fits)
    assert second.tolist() == cycle.order[150:250].tolist() and cycle.start == 250
    third = cycle.window(fits)  # wraps: 250..299, then 50..99 (0..49 do not fit)
    assert third.tolist() == cycle.order[250:300].tolist() + cycle.order[50:100].tolist()
    assert cycle.start == 100
    few = np.zeros(300, dtype=bool)
    few[cycle.order[[3, 7]]] = True
    assert sorted(cycle.window(few).tolist()) == sorted(cycle.order[[3, 7]].tolist())  # fewer fit: all, every node
    assert cycle.start == 100  # looked at all 300: back where it began


def test_choose_ties_at_random_but_a_lone_ten_always_wins() -> None:
    fleet = build_fleet(tuple(TraceNode(f"n{i}", 8000, 8 * GIB, 1, "T4") for i in range(4)))
    req = GpuRequest(count=1, cpu_milli=1000, host_memory_bytes=GIB)
    rows = np.arange(4, dtype=np.int64)
    combined = np.array([9.7, 9.9, 9.6, 3.0])  # all of the first three round to 10
    ints = np.array([9, 10, 9, 3], dtype=np.int64)  # kelvin's first node alone at 10
    rounded_cycle = KubeCycle(KubeScheduler(rounded_only=True), fleet, seed=1)
    drawn = {rounded_cycle.choose(req, fleet, rows, ints, combined) for _ in range(200)}
    assert drawn == {0, 1, 2}  # a random draw among the three 10s, never the 3
    cycle = KubeCycle(KubeScheduler(), fleet, seed=1)
    assert {cycle.choose(req, fleet, rows, ints, combined) for _ in range(50)} == {1}


def test_resource_scores_can_outvote_a_one_point_lead() -> None:
    fleet = build_fleet(tuple(TraceNode(f"n{i}", 8000, 8 * GIB, 1, "T4") for i in range(2)))
    cycle = KubeCycle(KubeScheduler(extender_weight=1, resource_scores=True), fleet, seed=0)
    fleet.cpu_free[1] = 500  # n1 nearly full: LeastAllocated prefers n0 by far more than 10 points
    fleet.mem_free_host[1] = GIB // 2
    req = GpuRequest(count=1, cpu_milli=100, host_memory_bytes=GIB // 4)
    rows = np.arange(2, dtype=np.int64)
    ints = np.array([9, 10], dtype=np.int64)
    assert cycle.choose(req, fleet, rows, ints, ints.astype(float)) == 0
    no_resources = KubeCycle(KubeScheduler(extender_weight=1), fleet, seed=0)
    assert no_resources.choose(req, fleet, rows, ints, ints.astype(float)) == 1


def _trace(n_nodes: int, n_pods: int) -> Trace:
    nodes = tuple(TraceNode(f"n{i}", 32000, 64 * GIB, 4, "T4") for i in range(n_nodes))
    pods = tuple(TracePod(f"p{i}", 1000 * (1 + i % 3), GIB, 1 + i % 2, 1000 if i % 4 else 500) for i in range(n_pods))
    return Trace(nodes, pods)


def test_a_replay_through_kube_scheduler_respects_capacity_and_is_reproducible() -> None:
    prep = prepare(_trace(150, 200))
    kube = KubeScheduler(percentage_of_nodes_to_score=0, resource_scores=True)
    a = run(prep, build_policy("kelvin"), 3, target=1.0, kube=kube)
    b = run(prep, build_policy("kelvin"), 3, target=1.0, kube=kube)
    same = {k: v for k, v in a.summary().items() if k != "seconds"}
    assert same == {k: v for k, v in b.summary().items() if k != "seconds"}
    f = a.fleet
    assert f is not None
    assert (f.free_milli >= 0).all() and (f.cpu_free >= 0).all() and (f.mem_free_host >= 0).all()
    assert a.arrived_pct[-1] >= 100.0 and not a.failed.all()


def test_with_every_node_and_no_resource_scores_kube_scheduler_binds_a_node_the_replay_ranks_first() -> None:
    """Every node scored, kube-scheduler's resource scores off, kelvin's first node alone at 10: kube-scheduler
    binds one of the nodes the replay ranks best (equal ones may differ: the replay breaks ties by its own random
    order, the extender by a hash of the names), pod after pod over a filling fleet."""
    nodes = tuple(TraceNode(f"n{i}", 16000 + 1000 * i, 64 * GIB, 4, "T4") for i in range(12))
    pods = tuple(TracePod(f"p{i}", 1000 * (1 + i % 3), GIB, 1 + i % 2, 1000 if i % 3 else 500) for i in range(30))
    prep = prepare(Trace(nodes, pods))
    policy = build_policy("kelvin")
    fleet = prep.fleet.copy()
    node_rank = np.random.default_rng([5, 1]).permutation(fleet.n_nodes)
    cycle = KubeCycle(KubeScheduler(percentage_of_nodes_to_score=100), prep.fleet, seed=5)
    all_rows = np.arange(fleet.n_nodes, dtype=np.int64)
    placed = 0
    for req in prep.requests:
        ctx = policy.framework.context(fleet, 0.0)
        ctx.state.write(WORKLOAD_KEY, prep.workload)
        replay_row = choose_row(policy, req, fleet, ctx, node_rank, None)
        kube_row = choose_row(policy, req, fleet, ctx, node_rank, cycle)
        if replay_row < 0:
            assert kube_row < 0
            continue
        cand = feasible(policy, req, fleet, all_rows, ctx)
        assert kube_row in tied_best(cand, rank(policy, req, fleet, cand, ctx)).tolist()
        gpus = pick(policy, req, fleet, kube_row, ctx)
        assert gpus is not None
        apply_placement(fleet, req, kube_row, gpus)
        placed += 1
    assert placed >= 20
