"""The paper's protocol: a seeded shuffle of all pods, then seeded copies until the GPU demand reaches the target."""

from __future__ import annotations

import numpy as np

from scheduler_plugin.simulator.protocol import arrival_order
from scheduler_plugin.simulator.trace import TracePod


def pods(n: int, milli: int = 500) -> list[TracePod]:
    return [TracePod(f"p{i}", 1000, 0, 1 if milli else 0, milli) for i in range(n)]


def test_every_pod_arrives_once_in_a_seeded_shuffle_then_copies_until_the_target() -> None:
    ps = pods(100)  # 50 GPUs of demand
    order = arrival_order(ps, capacity_milli=40_000, seed=7, target=1.3)  # target: 52 GPUs
    assert sorted(order[:100].tolist()) == list(range(100))
    assert order[:100].tolist() != list(range(100))
    demand = np.array([ps[i].gpu_demand_milli for i in order])
    assert demand.sum() >= 52_000 and demand[:-1].sum() < 52_000
    assert len(order) == 104


def test_same_seed_same_order_other_seed_other_order() -> None:
    ps = pods(50)
    a = arrival_order(ps, 10_000, seed=1)
    assert np.array_equal(a, arrival_order(ps, 10_000, seed=1))
    assert not np.array_equal(a, arrival_order(ps, 10_000, seed=2))


def test_trace_larger_than_the_target_is_cut_at_the_target() -> None:
    order = arrival_order(pods(100), capacity_milli=10_000, seed=3, target=1.0)
    assert len(order) == 20


def test_cpu_only_trace_cannot_reach_a_gpu_target() -> None:
    assert len(arrival_order(pods(10, milli=0), capacity_milli=10_000, seed=3)) == 10
