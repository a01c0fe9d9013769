"""kelvin's first node alone at 10: what kube-scheduler, which draws among equal top totals, binds."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from scheduler_plugin.policies import Framework, PolicyConfig
from scheduler_plugin.policies.choice import NodeOrder, order_keys, single_best
from tests.fleet_helpers import NOW, fleet, gpu, node, request


def test_the_best_mean_gets_10_alone_and_the_rest_keep_their_rounding_below_it() -> None:
    ints = np.array([10, 10, 9, 4, 0])
    combined = np.array([9.8, 9.9, 9.4, 4.2, 0.0])
    assert single_best(ints, combined, np.zeros(5, dtype=np.int64)).tolist() == [9, 10, 9, 4, 0]
    assert ints.tolist() == [10, 10, 9, 4, 0]  # not written in place


def test_a_low_best_still_comes_first() -> None:
    assert single_best(np.array([6, 6, 3]), np.array([6.3, 6.2, 3.0]), np.zeros(3, dtype=np.int64)).tolist() == [
        10,
        6,
        3,
    ]


def test_equal_means_go_to_the_lowest_key_then_the_first_row() -> None:
    combined = np.array([7.0, 7.0 + 1e-12, 7.0, 5.0])
    ints = np.array([7, 7, 7, 5])
    assert single_best(ints, combined, np.array([30, 20, 10, 0])).tolist() == [7, 7, 10, 5]
    assert single_best(ints, combined, np.array([5, 5, 9, 0])).tolist() == [10, 7, 7, 5]


def test_non_finite_means_never_come_first_unless_all_are() -> None:
    keys = np.array([0, 1, 2])
    assert single_best(np.array([0, 3, 2]), np.array([np.nan, 3.0, 2.0]), keys).tolist() == [0, 10, 2]
    assert single_best(np.array([0, 0]), np.array([np.nan, np.nan]), keys[:2]).tolist() == [10, 0]
    assert single_best(np.zeros(0, dtype=np.int64), np.zeros(0), keys[:0]).tolist() == []


def test_order_keys_are_crc32_of_the_names_and_cached_per_names_tuple() -> None:
    names = ("gpu-a", "gpu-b")
    assert order_keys(names).tolist() == [zlib.crc32(b"gpu-a"), zlib.crc32(b"gpu-b")]
    order = NodeOrder()
    first = order.keys(names)
    assert order.keys(names) is first
    assert order.keys(("gpu-c",)) is not first


def _framework() -> Framework:
    return Framework.from_config(PolicyConfig.from_mapping({"scoring": {"fragmentation": {"weight": 1}}}))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_among_equal_nodes_the_same_node_comes_first_whatever_order_the_names_arrive_in(seed: int) -> None:
    names = [f"node-{i}" for i in range(12)]
    f = fleet(*(node(n, [gpu(j) for j in range(8)]) for n in names))
    fw = _framework()
    expected = min(names, key=lambda n: zlib.crc32(n.encode()))
    rows = np.random.default_rng(seed).permutation(f.n_nodes)
    ints, combined = fw.prioritize(request(1), f, rows, fw.context(f, NOW))
    assert np.ptp(combined) == 0  # all equal
    (top,) = np.flatnonzero(ints == 10)
    assert f.names[rows[top]] == expected
    assert int(ints.max(initial=0)) == 10 and int(np.sort(ints)[-2]) <= 9


def test_pods_of_one_shape_fill_the_first_node_before_the_next() -> None:
    """The fixed order among equal nodes, then fragmentation: one-GPU pods go to one node until it is full, with the
    node drawn at random among the top scores as kube-scheduler draws it."""
    f = fleet(*(node(f"node-{i}", [gpu(j) for j in range(8)]) for i in range(6)))
    fw = _framework()
    rows = np.arange(f.n_nodes, dtype=np.int64)
    draw = np.random.default_rng(7)
    chosen = []
    for k in range(10):
        ctx = fw.context(f, NOW + k)
        passed = fw.filter(request(1), f, rows, ctx).passed
        ints, _ = fw.prioritize(request(1), f, passed, ctx)
        top = np.flatnonzero(ints == ints.max())
        row = int(passed[top[draw.integers(top.size)]])
        gpus = fw.pick(request(1), f, row, ctx)
        assert gpus is not None
        fw.assume(f.names[row], request(1, pod=f"p{k}"), gpus, NOW + k)
        chosen.append(f.names[row])
    assert len(set(chosen[:8])) == 1 and chosen[8] == chosen[9] != chosen[0], chosen
