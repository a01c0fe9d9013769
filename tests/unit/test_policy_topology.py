"""Topology score and picker: best-connected groups for multi-GPU pods, intact groups kept for them."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from scheduler_plugin.model import GpuNode, GpuRequest
from scheduler_plugin.policies.base import CycleContext
from scheduler_plugin.policies.topology import TopologyArgs, TopologyPicker, TopologyScore, best_set, set_quality
from tests.unit.fleet_helpers import NOW, dgx, fleet, gpu, node, nvlink_pairs, pcie_box, request, shared, whole

SCORE = TopologyScore(TopologyArgs())
PICK = TopologyPicker(TopologyArgs())


def raw(req: GpuRequest, *nodes: GpuNode) -> list[float]:
    f = fleet(*nodes)
    return [round(x, 4) for x in SCORE.score(req, f, np.arange(f.n_nodes), CycleContext(now=NOW)).tolist()]


def pick(req: GpuRequest, n: GpuNode) -> tuple[int, ...] | None:
    return PICK.pick(req, fleet(n), 0, CycleContext(now=NOW))


# pair qualities with the defaults: NVLink 1.0, same switch 0.6, same NUMA 0.3, across sockets 0.0; a set's quality
# is 0.8 * worst pair + 0.2 * mean pair.
@pytest.mark.parametrize(
    ("req", "n", "expect"),
    [
        (request(4), dgx("a"), 1.0),
        (request(4), nvlink_pairs("a"), round(0.8 * 0.3 + 0.2 * (2 * 1.0 + 4 * 0.3) / 6, 4)),
        (request(4), pcie_box("a"), round(0.8 * 0.3 + 0.2 * (2 * 0.6 + 4 * 0.3) / 6, 4)),
        (request(2), nvlink_pairs("a"), 1.0),
        (request(2), pcie_box("a"), 0.6),
        (request(2), pcie_box("a", assignments=[whole("x", 1, 2, 3, 5, 6, 7)]), 0.0),
        (request(2), pcie_box("a", assignments=[whole("x", 1, 3, 5, 6, 7)]), 0.3),
        (request(8), dgx("a"), 1.0),
        (request(4, topology="nvlink-preferred"), dgx("a", 12), 1.0),
        (request(4), nvlink_pairs("a", 12), round(0.8 * 0.3 + 0.2 * (2 * 1.0 + 4 * 0.3) / 6, 4)),
    ],
)
def test_multi_gpu_quality(req: GpuRequest, n: GpuNode, expect: float) -> None:
    assert raw(req, n) == [expect]


def test_multi_gpu_ranking() -> None:
    r = raw(request(4), dgx("a"), nvlink_pairs("b"), pcie_box("c"))
    assert r[0] > r[1] > r[2]


def test_single_gpu_keeps_intact_groups() -> None:
    # A fully free DGX loses its 8-GPU group; a DGX with one GPU left loses almost nothing.
    full, almost = raw(request(1), dgx("a"), dgx("b", assignments=[whole("x", 0, 1, 2, 3, 4, 5, 6)]))
    assert almost == 1.0
    assert full < almost
    # on a node of NVLink pairs, the GPU whose partner is busy is the cheap one
    pairs_broken = raw(request(1), nvlink_pairs("c", assignments=[whole("x", 0)]))[0]
    pairs_intact = raw(request(1), nvlink_pairs("d"))[0]
    assert pairs_broken > pairs_intact


def test_shared_pod_on_shared_gpu_costs_nothing() -> None:
    n = dgx("a", assignments=[shared("x", 5, milli=300, mem_gib=20)])
    assert raw(request(1, memory="20Gi"), n) == [1.0]
    assert pick(request(1, memory="20Gi"), n) == (5,)


@pytest.mark.parametrize(
    ("req", "n", "expect"),
    [
        (request(2), nvlink_pairs("a", assignments=[whole("x", 0)]), (2, 3)),
        (request(1), nvlink_pairs("a", assignments=[whole("x", 0)]), (1,)),
        (request(4, topology="nvlink-required"), dgx("a", assignments=[whole("x", 0, 1)]), (2, 3, 4, 5)),
        (request(2), pcie_box("a"), (0, 1)),
        (request(2), pcie_box("a", assignments=[whole("x", 0, 2)]), (4, 5)),
        (request(3), node("a", [gpu(i, numa=i // 2, switch=f"s{i}") for i in range(4)]), (0, 1, 2)),
        (request(8), dgx("a", assignments=[whole("x", 0)]), None),
        (request(0), dgx("a"), ()),
        (request(1), node("a", [gpu(0, temp=95), gpu(1)]), (1,)),
        (request(2, models="H100"), node("a", [gpu(0, model="H100"), gpu(1), gpu(2, model="H100")]), (0, 2)),
    ],
)
def test_picker(req: GpuRequest, n: GpuNode, expect: tuple[int, ...] | None) -> None:
    assert pick(req, n) == expect


def test_picker_returns_gpu_indices_not_slots() -> None:
    n = node("a", [gpu(7, nvlink=[3]), gpu(3, nvlink=[7]), gpu(5)])
    assert pick(request(2), n) == (7, 3)


def test_best_set_exact_and_greedy_agree_on_clear_cases() -> None:
    lq = np.full((16, 16), 0.3)
    lq[:8, :8] = 1.0
    q, s = best_set(lq, list(range(16)), 8, 0.8)  # C(16, 8) = 12870 > exact limit: greedy
    assert q == 1.0
    assert s == tuple(range(8))
    q4, s4 = best_set(lq, list(range(16)), 4, 0.8)  # exact
    assert q4 == 1.0
    assert set_quality(lq, s4, 0.8) == 1.0


def test_args_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match="link qualities must not increase"):
        TopologyArgs(nvlink=0.5, same_switch=0.9)
    assert TopologyArgs.model_validate({"sameSwitch": 0.5, "worstLinkShare": 1}).same_switch == 0.5


def test_explain_names_the_slowest_link() -> None:
    f = fleet(pcie_box("a"))
    lines = SCORE.explain(request(2), f, 0, CycleContext(now=NOW))
    assert lines[0] == "best 2 usable GPUs are 0,1: slowest link the same PCIe switch (set quality 0.60 of 1)"
    single = SCORE.explain(request(1), f, 0, CycleContext(now=NOW))
    assert single[0].startswith("best slot for one GPU is gpu 0")
