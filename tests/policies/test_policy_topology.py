"""Topology score and picker: best-connected groups for multi-GPU pods, intact groups kept for them."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from scheduler_plugin.model import GpuNode, GpuRequest
from scheduler_plugin.policies.base import CycleContext
from scheduler_plugin.policies.topology import TopologyArgs, TopologyPicker, TopologyScore, best_set, set_quality
from tests.fleet_helpers import NOW, dgx, fleet, gpu, node, nvlink_pairs, pcie_box, request, shared, whole

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
    # on a node of NVLink pairs, the GPU whose partner is busy keeps only its same-NUMA link (premium 0.3 over the
    # node's weakest, cross-socket link); a GPU of an intact pair leaves its NVLink partner alone (premium 1.0)
    pairs_broken = raw(request(1), nvlink_pairs("c", assignments=[whole("x", 0)]))[0]
    pairs_intact = raw(request(1), nvlink_pairs("d"))[0]
    assert pairs_broken == 1 - 0.5 * 0.3
    assert pairs_intact < pairs_broken
    # the same across nodes: a lone GPU elsewhere beats breaking a PCIe-switch pair
    lone, pair = raw(request(1), pcie_box("e", assignments=[whole("x", 0, 2, 4, 6)]), pcie_box("f"))
    assert lone > pair


def test_single_gpu_ignores_gpu_count_on_uniform_nodes() -> None:
    # Uniformly connected nodes lose no connectivity quality, whatever their size and however full: keeping large
    # nodes whole by count is the fragmentation policy's job (it knows the workload's shapes).
    trace_like = [node(f"t{n}", [gpu(i) for i in range(n)]) for n in (1, 2, 4, 8)]  # no NVLink or switch data
    assert raw(request(1), *trace_like) == [1.0, 1.0, 1.0, 1.0]
    assert raw(request(1, share=500), *trace_like) == [1.0, 1.0, 1.0, 1.0]
    full, almost = raw(request(1), dgx("a"), dgx("b", assignments=[whole("x", 0, 1, 2, 3, 4, 5, 6)]))
    assert full == almost == 1.0
    # ... but a uniform node is preferred to breaking a well-connected group on a mixed one
    two, eight, pairs = raw(request(1), trace_like[1], trace_like[3], nvlink_pairs("p"))
    assert two == eight > pairs


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


def test_pattern_cache_survives_copies_and_notices_rewiring() -> None:
    score = TopologyScore(TopologyArgs())
    f = fleet(dgx("a"), pcie_box("b"), dgx("c"))
    first = score.tables.for_fleet(f)
    assert first.pid.tolist()[0] == first.pid.tolist()[2] != first.pid.tolist()[1]
    assert score.tables.for_fleet(f.copy()) is first  # same wiring: no recomputation
    assert f.derived.computed["topology.fleet"] == 1
    # Telemetry columns are never written in place (the snapshot index's contract): a new wiring is a new column.
    rewired = f.copy()
    nvlink = rewired.nvlink.copy()
    nvlink[0] = False
    rewired.nvlink = nvlink
    again = score.tables.for_fleet(rewired)
    assert again is not first
    assert again.pid[0] == again.pid[1]  # node a now looks like the PCIe box
    assert score.tables.for_fleet(f) is first  # the original keeps its own entry


def test_framework_shares_one_fleet_topology() -> None:
    from scheduler_plugin.policies import Framework, PolicyConfig

    fw = Framework.from_config(PolicyConfig.from_mapping({"scoring": {"topology": {}}, "picker": "topology"}))
    topo = fw.scorers[0].plugin
    f = fleet(dgx("a"))
    fw.warm(f)  # fit filter, score and picker: one computation, in the snapshot's index
    assert f.derived.computed["topology.fleet"] == 1
    ft = topo.tables.for_fleet(f)  # type: ignore[attr-defined]
    assert fw.fit.tables.for_fleet(f) is ft
    assert fw.picker.tables.for_fleet(f) is ft  # type: ignore[attr-defined]
    assert f.derived.computed["topology.fleet"] == 1


def test_wide_nodes_single_gpu_score() -> None:
    # 12 GPUs: the same preferences hold
    full, almost = raw(request(1), dgx("a", 12), dgx("b", 12, assignments=[whole("x", *range(11))]))
    assert full == almost == 1.0
    broken, intact = raw(request(1), nvlink_pairs("c", 12, assignments=[whole("x", 0)]), nvlink_pairs("d", 12))
    assert broken > intact
    assert pick(request(1), nvlink_pairs("e", 12, assignments=[whole("x", 0)])) == (1,)


@pytest.mark.parametrize(
    "g", [2, 3, 5, pytest.param(8, marks=pytest.mark.slow), pytest.param(9, marks=pytest.mark.slow)]
)
def test_tables_match_enumeration(g: int) -> None:
    from scheduler_plugin.policies.topology import Pattern

    rng = np.random.default_rng(g)
    levels = rng.integers(0, 4, (g, g))
    levels = np.minimum(levels, levels.T)
    np.fill_diagonal(levels, 0)
    weights = np.arange(g + 1) / g
    weights[:2] = 0
    lq = TopologyArgs().qualities()[levels]
    pat = Pattern(g=g, n_present=g, levels=levels.astype(np.int8), pair_quality=lq, nvl=levels == 0, weights=weights)
    pat.build_tables(0.8)
    assert (
        pat.best_quality is not None
        and pat.clique is not None
        and pat.connected_capacity is not None
        and pat.loss is not None
    )
    for m in range(1 << g):
        cols = [j for j in range(g) if m >> j & 1]
        for k in range(1, g + 1):
            q, _ = best_set(lq, cols, k, 0.8)
            assert pat.best_quality[k, m] == pytest.approx(q) if np.isfinite(q) else pat.best_quality[k, m] == -np.inf
            linked = best_set((levels == 0).astype(np.float64), cols, k, 1.0)[0] >= 1.0
            assert bool(pat.clique[k, m]) == linked
        expect_c = sum(weights[k] * max(0.0, best_set(lq, cols, k, 0.8)[0]) for k in range(2, len(cols) + 1))
        assert pat.connected_capacity[m] == pytest.approx(expect_c)
        for j in range(g if g <= 8 else 0):  # the enumeration is slow beyond 8 slots
            assert pat.loss[m, j] == pytest.approx(pat.slot_loss(m, j, 0.8))
            assert 0.0 <= pat.loss[m, j] <= 1.0


def test_nodes_wider_than_the_tables_are_enumerated() -> None:
    # 18 GPUs: beyond the tables, evaluated per distinct (pattern, mask)
    assert raw(request(4), dgx("a", 18)) == [1.0]
    full, almost = raw(request(1), dgx("b", 18), dgx("c", 18, assignments=[whole("x", *range(17))]))
    assert full == almost == 1.0
    broken, intact = raw(request(1), nvlink_pairs("q", 18, assignments=[whole("x", 0)]), nvlink_pairs("r", 18))
    assert broken > intact
    ok = raw(request(2), nvlink_pairs("d", 18, assignments=[whole("x", 0)]))
    assert ok == [1.0]
    got_pair = pick(request(2), nvlink_pairs("e", 18, assignments=[whole("x", 0)]))
    assert got_pair is not None
    assert got_pair[0] ^ 1 == got_pair[1]  # an NVLink pair
    from scheduler_plugin.policies.fit import FitFilter
    from scheduler_plugin.policies.policy_file import FilterPolicy

    f = fleet(dgx("w", 18), nvlink_pairs("p", 18))
    fit = FitFilter(FilterPolicy())
    got = fit.filter(request(3, topology="nvlink-required"), f, np.arange(2), CycleContext(now=NOW))
    assert got.tolist() == [True, False]


def test_an_empty_fleet_has_no_patterns_and_scores_nothing() -> None:
    """No telemetry yet (a fresh install): warming the tables of an empty snapshot used to raise ValueError."""
    from scheduler_plugin.model import build_arrays

    empty = build_arrays([])
    assert SCORE.tables.for_fleet(empty).patterns == []
    assert SCORE.score(request(1), empty, np.arange(0), CycleContext(now=NOW)).shape == (0,)
    assert SCORE.score(request(4), empty, np.arange(0), CycleContext(now=NOW)).shape == (0,)
