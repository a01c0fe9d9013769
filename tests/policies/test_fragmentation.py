"""The fragmentation maths (FGD definitions), the learned workload, and the plugins' contracts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scheduler_plugin.model import GIB, GpuInfo, GpuNode, GpuRequest, build_arrays
from scheduler_plugin.policies import fragmentation
from scheduler_plugin.policies.base import CycleContext, CycleState
from scheduler_plugin.policies.fragmentation import (
    WORKLOAD_KEY,
    FgdPolicy,
    FragmentationPolicy,
    PodShape,
    Workload,
    WorkloadEstimator,
    best_per_row,
    fgd_value,
    learn,
    node_fragmentation,
    placements,
    shape_of,
)
from scheduler_plugin.policies.fragmentation.gradient import free_stats
from scheduler_plugin.policies.fragmentation.row_stamps import row_stamps
from scheduler_plugin.policies.fragmentation.score_memo import ScoreMemo, SoftParts
from scheduler_plugin.policies.plugins import PRODUCTION
from scheduler_plugin.policies.registry import PolicyConfigError
from scheduler_plugin.simulator.fleet import apply_placement
from tests.memo_helpers import count_score_computations


def node(name: str, used: list[int], cpu: int = 32_000, model: str = "A100") -> GpuNode:
    """A node whose GPU j already has used[j] thousandths assigned."""
    from scheduler_plugin.model import GpuAssignment

    gpus = tuple(
        GpuInfo(index=j, uuid=f"{name}-{j}", model=model, memory_total_bytes=80 * GIB) for j in range(len(used))
    )
    assigned = tuple(GpuAssignment(f"ns/p{j}", (j,), milli=u) for j, u in enumerate(used) if u)
    return GpuNode(name, gpus, cpu_allocatable_milli=cpu, memory_allocatable_bytes=256 * GIB, assignments=assigned)


def wl(*shapes: tuple[PodShape, float]) -> Workload:
    return Workload.from_counts(dict(shapes), coverage=1.0)


WHOLE = PodShape(4000, 1000, 1, None)
HALF = PodShape(2000, 500, 1, None)
CPU_ONLY = PodShape(8000, 0, 0, None)


def test_workload_keeps_most_frequent_shapes_up_to_coverage() -> None:
    w = Workload.from_counts({WHOLE: 5, HALF: 3, CPU_ONLY: 1, PodShape(1, 100, 1, None): 1}, coverage=0.8)
    assert len(w) == 2
    assert w.prob.tolist() == pytest.approx([5 / 8, 3 / 8])
    assert w.milli.tolist() == [1000, 500]


@pytest.mark.parametrize(
    ("free", "cpu", "expected"),
    [
        # whole shape: the 300 GPU is a fragment; half shape: 300 too small; CPU-only: everything is idle.
        ([1000, 300], 32_000, 0.5 * 300 + 0.25 * 300 + 0.25 * 1300),
        # not enough CPU for either GPU shape: every free share counts.
        ([1000, 300], 1000, 1.0 * 1300),
        # a 600 GPU serves the half shape.
        ([600, 0], 32_000, 0.5 * 600 + 0.25 * 0 + 0.25 * 600),
        # nothing free: no fragmentation.
        ([0, 0], 32_000, 0.0),
    ],
)
def test_node_fragmentation_follows_the_paper(free: list[int], cpu: int, expected: float) -> None:
    w = wl((WHOLE, 2), (HALF, 1), (CPU_ONLY, 1))
    got = node_fragmentation(
        np.array([free], dtype=np.int32), np.array([cpu], dtype=np.int64), np.ones((1, 3), dtype=np.bool_), w
    )
    assert got[0] == pytest.approx(expected)


def test_model_constrained_shape_counts_everything_on_other_models() -> None:
    a100_only = PodShape(1000, 500, 1, frozenset({"A100"}))
    fleet = build_arrays([node("t4", [0, 0], model="T4"), node("a100", [0, 0])])
    w = wl((a100_only, 1))
    pl = placements(GpuRequest(count=1, milli=1000), fleet, np.array([0, 1]), w)
    # On the T4 node all free GPU is a fragment for this workload: taking a GPU lowers it by 1000.
    assert pl.delta.tolist() == pytest.approx([-1000.0, 0.0])


def test_shared_pod_alternatives_are_deduplicated_and_scored() -> None:
    fleet = build_arrays([node("n", [0, 0, 500, 500])])
    w = wl((HALF, 1))
    pl = placements(GpuRequest(count=1, milli=500), fleet, np.array([0]), w)
    # Two distinct alternatives: a fresh GPU (slot 0) or a half-used one (slot 2).
    assert [int(np.flatnonzero(t)[0]) for t in pl.taken] == [0, 2]
    # Filling a half-used GPU creates no fragment; splitting a fresh one leaves 500 still usable: both 0.
    assert pl.delta.tolist() == pytest.approx([0.0, 0.0])
    assert pl.slot_left.tolist() == [500, 0]


def test_best_per_row_takes_the_first_maximum() -> None:
    best, which = best_per_row(np.array([1.0, 3.0, 3.0, 2.0]), np.array([0, 0, 0, 2]), 3)
    assert best.tolist() == [3.0, -np.inf, 2.0]
    assert which.tolist() == [1, -1, 3]


def test_fgd_value_is_the_truncated_sigmoid() -> None:
    assert fgd_value(np.array([0.0, -1000.0, 1000.0, -1e9])).tolist() == [50.0, 73.0, 26.0, 100.0]


def test_kelvin_picks_the_gpu_that_avoids_a_sliver() -> None:
    # GPU 0 is free, GPU 1 has 190 free after an 810 pod... and GPU 2 has 400 free. A 400 pod fits GPU 2 exactly.
    fleet = build_arrays([node("n", [0, 810, 600])])
    w = wl((PodShape(1000, 400, 1, None), 1), (WHOLE, 1))
    req = GpuRequest(count=1, milli=400, cpu_milli=1000)
    for policy in (
        FragmentationPolicy.create(fragmentation.FragmentationArgs()),
        FgdPolicy.create(fragmentation.FragmentationArgs()),
    ):
        ctx = CycleContext(now=0.0, state=CycleState({WORKLOAD_KEY: w}))
        assert policy.pick(req, fleet, 0, ctx) == (2,)


def test_score_prefers_the_node_where_the_pod_fills_a_hole() -> None:
    fleet = build_arrays([node("fresh", [0, 0]), node("holey", [0, 500])])
    ctx = CycleContext(now=0.0, state=CycleState({WORKLOAD_KEY: wl((WHOLE, 1), (HALF, 1))}))
    req = GpuRequest(count=1, milli=500, cpu_milli=1000)
    for name in ("fragmentation", "fgd"):
        plugin = PRODUCTION.build("score", name, {}, "t")
        raw = plugin.score(req, fleet, np.array([0, 1]), ctx)
        assert raw[1] > raw[0], name
        norm = plugin.normalize(raw)
        assert ((norm >= 0) & (norm <= 10)).all()


def test_estimator_learns_counts_each_pod_once_and_forgets() -> None:
    est = WorkloadEstimator(half_life_pods=10, prior={WHOLE: 1.0}, prior_weight=1.0, coverage=1.0)
    assert est.workload().milli.tolist() == [1000]
    for i in range(50):
        req = GpuRequest(count=1, milli=250, cpu_milli=2000, pod_key=f"ns/p{i}")
        est.observe(req)
        est.observe(req)  # a retry of the same pod is not counted again
    assert est.observed == 50
    shapes = dict(est.workload().shapes())
    assert shapes[PodShape(2000, 250, 1, None)] > 0.99


def test_shape_of_memory_pool_uses_the_reference_gpu() -> None:
    req = GpuRequest(count=1, milli=None, memory_bytes=20 * GIB)
    assert shape_of(req, reference_gpu_memory=80 * GIB).milli == 250


def test_learned_workload_is_used_without_a_trace() -> None:
    """Scoring reads the estimator's workload and does not learn the pod it scores (``learn`` does that)."""
    fleet = build_arrays([node("n", [0, 0])])
    plugin = PRODUCTION.build("score", "fragmentation", {"prior_weight": 1}, "t")
    req = GpuRequest(count=1, milli=300, pod_key="a/b")
    learn([plugin, plugin], req)
    assert plugin.estimator.observed == 1  # one estimator, counted once
    ctx = CycleContext(now=0.0)
    plugin.score(req, fleet, np.array([0]), ctx)
    w = ctx.state.read(WORKLOAD_KEY)
    assert isinstance(w, Workload) and w is plugin.estimator.workload() and 300 in w.milli.tolist()
    assert plugin.estimator.observed == 1


def test_bad_args_name_the_field() -> None:
    with pytest.raises(PolicyConfigError, match=r"policies\.fragmentation\.bin_milli"):
        PRODUCTION.build("score", "fragmentation", {"bin_milli": -1}, "policies.fragmentation")


def test_explain_gives_the_change_in_fragmentation() -> None:
    fleet = build_arrays([node("n", [0, 500])])
    plugin = PRODUCTION.build("score", "fragmentation", {}, "t")
    lines = plugin.explain(
        GpuRequest(count=1, milli=500), fleet, 0, CycleContext(now=0.0, state=CycleState({WORKLOAD_KEY: wl((HALF, 1))}))
    )
    assert "fragmentation now" in lines[0]
    assert "GPU 1" in lines[1]


def _reference_fragmentation(
    free: np.ndarray, cpu: np.ndarray, mem: np.ndarray, acc: np.ndarray, w: Workload
) -> np.ndarray:
    """The paper's definition, written node by node and shape by shape."""
    out = np.zeros(len(free))
    for i, fr in enumerate(free):
        total = fr.sum()
        for m in range(len(w)):
            assert w.host_memory is not None
            fits = (
                w.count[m] > 0
                and acc[i, m]
                and cpu[i] >= w.cpu_milli[m]
                and mem[i] >= w.host_memory[m]
                and (fr >= w.milli[m]).sum() >= w.count[m]
            )
            out[i] += w.prob[m] * (fr[fr < w.milli[m]].sum() if fits else total)
    return out


def test_vectorised_fragmentation_equals_the_definition() -> None:
    rng = np.random.default_rng(7)
    shapes = {
        PodShape(int(rng.integers(0, 16)) * 1000, int(ms), int(n), None): float(rng.random())
        for ms, n in [(1000, 1), (1000, 2), (1000, 8), (500, 1), (250, 1), (810, 1), (0, 0), (1000, 4)]
    }
    mem = {s: float(rng.integers(0, 64)) * GIB for s in shapes}
    w = Workload.from_counts(shapes, coverage=1.0, host_memory=mem)
    free = (rng.integers(0, 5, size=(300, 8)) * 250).astype(np.int32)
    free[:, 6:] = np.where(rng.random((300, 2)) < 0.5, 0, free[:, 6:])  # some nodes have fewer GPUs
    cpu = rng.integers(0, 20_000, size=300)
    host = rng.integers(0, 80, size=300) * GIB
    acc = rng.random((300, len(w))) < 0.9
    got = node_fragmentation(free, cpu, acc, w, host)
    assert got == pytest.approx(_reference_fragmentation(free, cpu, host, acc, w))
    no_mem = node_fragmentation(free, cpu, acc, w)
    assert no_mem == pytest.approx(_reference_fragmentation(free, cpu, np.full(300, 2**62), acc, w))


@pytest.mark.parametrize(
    "req",
    [GpuRequest(count=1, milli=300, cpu_milli=2000), GpuRequest(count=2, cpu_milli=4000), GpuRequest(count=1)],
)
def test_incremental_placement_deltas_match_a_full_recount(req: GpuRequest) -> None:
    rng = np.random.default_rng(3)
    nodes = [node(f"n{i}", [int(x) for x in rng.integers(0, 5, size=4) * 250], cpu=64_000) for i in range(40)]
    fleet = build_arrays(nodes)
    w = wl((WHOLE, 3), (HALF, 2), (PodShape(1000, 250, 1, None), 1), (CPU_ONLY, 1), (PodShape(8000, 1000, 2, None), 1))
    rows = np.arange(40)
    pl = placements(req, fleet, rows, w)
    acc = np.ones((40, len(w)), dtype=np.bool_)
    before = node_fragmentation(fleet.free_milli, fleet.cpu_free, acc, w)
    for i in range(len(pl.pos)):
        r = int(pl.pos[i])
        free = fleet.free_milli[r : r + 1].copy()
        free[0, pl.taken[i]] -= req.demand_milli(fleet.mem_total[r])[pl.taken[i]]
        after = node_fragmentation(free, fleet.cpu_free[r : r + 1] - req.cpu_milli, acc[:1], w)
        assert pl.delta[i] == pytest.approx(after[0] - before[r])


# --------------------------------------------------------------------------------------------------------------- #
# The fast paths give exactly what the plain definitions give


def test_first_of_kind_keeps_the_lowest_eligible_slot_of_each_key() -> None:
    from scheduler_plugin.policies.fragmentation.gradient import _first_of_kind

    rng = np.random.default_rng(11)
    for g in (1, 2, 3, 8, 16):
        key = rng.integers(0, 4, size=(300, g)).astype(np.int64)
        elig = rng.random((300, g)) < 0.7
        lower_same = (key[:, :, None] == key[:, None, :]) & elig[:, :, None] & elig[:, None, :]
        dup = (lower_same & np.tri(g, g, -1, dtype=np.bool_)[None, :, :]).any(axis=2)
        assert np.array_equal(_first_of_kind(key, elig), elig & ~dup)


def test_fleet_stats_follow_in_place_writes_and_match_a_recount() -> None:
    from scheduler_plugin.policies.fragmentation.gradient import FleetFreeStats, free_stats

    rng = np.random.default_rng(5)
    nodes = [node(f"n{i}", [int(x) for x in rng.integers(0, 5, size=4) * 250]) for i in range(40)]
    fleet = build_arrays(nodes)
    w = wl((WHOLE, 3), (HALF, 2), (PodShape(1000, 250, 1, None), 1))
    memo = FleetFreeStats()
    rows = np.array([3, 0, 17, 39, 3], dtype=np.int64)
    for _ in range(2):  # the second round is served from the memo
        got, want = memo.rows(fleet, rows, w), free_stats(fleet.free_milli[rows], w)
        assert np.array_equal(got.total, want.total)
        assert np.array_equal(got.gpus_at_least, want.gpus_at_least)
        assert np.array_equal(got.free_at_least, want.free_at_least)
    fleet.free_milli[17, 1] = 0  # the simulator writes capacity in place: the memo must notice
    got, want = memo.rows(fleet, rows, w), free_stats(fleet.free_milli[rows], w)
    assert np.array_equal(got.gpus_at_least, want.gpus_at_least)
    assert np.array_equal(got.free_at_least, want.free_at_least)
    w2 = wl((WHOLE, 1), (PodShape(1000, 100, 1, None), 1))  # other thresholds
    got, want = memo.rows(fleet, rows, w2), free_stats(fleet.free_milli[rows], w2)
    assert got.gpus_at_least.shape == want.gpus_at_least.shape
    assert np.array_equal(got.free_at_least, want.free_at_least)


def test_fleet_memo_recomputes_only_the_rows_written_and_matches_a_recount(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo of every node's F follows the simulator's in-place writes by recomputing the touched node alone,
    and serves exactly what computing the rows afresh gives."""
    from scheduler_plugin.policies.fragmentation import gradient
    from scheduler_plugin.simulator.fleet import apply_placement

    rng = np.random.default_rng(6)
    nodes = [
        node(f"n{i}", [int(x) for x in rng.integers(0, 5, size=8) * 125], cpu=64_000, model=("A100", "V100")[i % 2])
        for i in range(40)
    ]
    fleet = build_arrays(nodes)
    w = wl((WHOLE, 3), (HALF, 2), (PodShape(1000, 250, 1, frozenset({"A100"})), 1), (CPU_ONLY, 1))
    memo = gradient.FleetFreeStats()
    rows = np.arange(0, 40, 3, dtype=np.int64)
    acc = w.node_access(fleet)[rows]
    node_mass = gradient._node_mass(w, fleet)  # what the memo takes: the rows' shape-group probabilities
    assert node_mass is not None
    mass = node_mass[rows]

    def fresh() -> np.ndarray:
        mem = fleet.mem_free_host[rows]
        return node_fragmentation(fleet.free_milli[rows], fleet.cpu_free[rows], acc, w, mem)

    for _ in range(2):  # the first call computes the candidate rows; the second keeps every row's F
        _, got = memo.before(fleet, rows, w, mass, True)
        assert np.array_equal(got, fresh())
    assert memo.holds(w, True)
    counted: list[int] = []
    real = gradient.free_stats

    def counting(free: np.ndarray, w: Workload) -> gradient.FreeStats:
        counted.append(len(free))
        return real(free, w)

    monkeypatch.setattr(gradient, "free_stats", counting)
    apply_placement(fleet, GpuRequest(count=1, milli=250, cpu_milli=3000, host_memory_bytes=GIB), 9, (0,))
    _, got = memo.before(fleet, rows, w, mass, True)
    assert counted == [1]  # node 9 alone, not the fleet
    assert np.array_equal(got, fresh())
    counted.clear()
    fleet.cpu_free[12] -= 50_000  # CPU only: node 12's F moves (its stats are recounted: its content stamp moved)
    _, got = memo.before(fleet, rows, w, mass, True)
    assert counted == [1]
    assert np.array_equal(got, fresh())


def _pinned_workload(rng: np.random.Generator, shapes: int) -> Workload:
    """Many shapes of few shares, a third pinned to a model (as the model-constrained trace variant has)."""
    counts: dict[PodShape, float] = {}
    for i in range(shapes):
        models = (None, frozenset({"A100"}), frozenset({"A100", "V100"}))[i % 3]
        share = (1000, 500, 250)[i % 7 % 3]
        counts[PodShape(500 * (1 + i % 5), share, 1 + (i % 4 == 0) if share == 1000 else 1, models)] = float(
            rng.random() + 0.01
        )
    return wl(*counts.items())


def test_fragmentation_of_a_row_does_not_depend_on_the_rows_computed_with_it() -> None:
    """F of a node is the same computed alone or with every other node (a BLAS product's rounding used to depend on
    the number of rows: the memo's one-row updates and the score's many rows disagreed in the last bits)."""
    rng = np.random.default_rng(5)
    nodes = [
        node(
            f"n{i}",
            [int(x) for x in rng.integers(0, 5, size=8) * 125],
            cpu=int(rng.integers(1, 9)) * 1000,
            model=("A100", "V100", "T4")[i % 3],
        )
        for i in range(300)
    ]
    fleet = build_arrays(nodes)
    w = _pinned_workload(rng, 60)
    acc = w.node_access(fleet)
    together = node_fragmentation(fleet.free_milli, fleet.cpu_free, acc, w, fleet.mem_free_host)
    alone = [
        node_fragmentation(
            fleet.free_milli[r : r + 1], fleet.cpu_free[r : r + 1], acc[r : r + 1], w, fleet.mem_free_host[r : r + 1]
        )[0]
        for r in range(len(nodes))
    ]
    assert together.tolist() == alone


@pytest.mark.parametrize(
    "req",
    [
        GpuRequest(count=1, milli=250, cpu_milli=1000, host_memory_bytes=GIB),
        GpuRequest(count=2, cpu_milli=2000),
        GpuRequest(count=0, cpu_milli=3000),
    ],
)
def test_placements_from_the_after_memo_match_placements_computed_afresh(req: GpuRequest) -> None:
    """Once F is memoised for a workload, F after each placement is kept per request shape and node and recomputed
    only for the nodes written since; the placements equal those of a fleet without any memo, after every write."""
    from scheduler_plugin.policies.fragmentation.gradient import _FragMemo, fleet_free_stats
    from scheduler_plugin.simulator.fleet import apply_placement

    rng = np.random.default_rng(8)
    nodes = [
        node(f"n{i}", [int(x) for x in rng.integers(0, 5, size=8) * 125], cpu=64_000, model=("A100", "V100")[i % 2])
        for i in range(60)
    ]
    fleet = build_arrays(nodes)
    w = _pinned_workload(rng, 30)
    rows = np.arange(60, dtype=np.int64)
    computed: list[int] = []
    real = _FragMemo.after

    def counting(self: _FragMemo, key: Any, r: Any, cols: Any, placed: Any, compute: Any) -> np.ndarray:
        def counted(sel: np.ndarray) -> np.ndarray:
            computed.append(len(sel))
            return np.asarray(compute(sel))

        return real(self, key, r, cols, placed, counted)

    mp = pytest.MonkeyPatch()
    mp.setattr(_FragMemo, "after", counting)
    try:
        for _ in range(3):
            got = placements(req, fleet, rows, w, memory_aware=True)
        assert fleet_free_stats(fleet).holds(w, True)
        assert len(computed) == 1  # the second call computed every row's, the third took them all from the memo
        for step in range(4):
            row = int(got.pos[step * 7 % len(got.pos)])
            apply_placement(fleet, GpuRequest(count=1, milli=125, cpu_milli=500, host_memory_bytes=GIB), row, (step,))
            computed.clear()
            got = placements(req, fleet, rows, w, memory_aware=True)
            assert sum(computed) <= 8  # node ``row`` alone (one placement per distinct GPU on it at most)
            want = placements(req, _unmemoised(fleet), rows, w, memory_aware=True)
            for f in ("pos", "taken", "gpu_left", "slot_left", "cpu_left"):
                assert np.array_equal(getattr(got, f), getattr(want, f)), f
            assert got.delta.tolist() == want.delta.tolist()
    finally:
        mp.undo()


def _unmemoised(fleet: Any) -> Any:
    """A copy of ``fleet`` with a snapshot index of its own (no memo carried over)."""
    from scheduler_plugin.model.snapshot import SnapshotIndex

    out = fleet.copy()
    out.derived = SnapshotIndex(out.names)
    return out


def test_changed_rows_finds_every_row_any_column_moved_in() -> None:
    from scheduler_plugin.policies.fragmentation.row_stamps import changed_rows

    a = np.zeros((6, 4), dtype=np.int32)
    b, c = a.copy(), np.arange(6)
    b[1, 3] = b[1, 0] = b[4, 2] = 7
    d = c.copy()
    d[4] = d[5] = -1
    assert changed_rows((a, a), (c, c)).tolist() == []
    assert changed_rows((a, b)).tolist() == [1, 4]
    assert changed_rows((a, b), (c, d)).tolist() == [1, 4, 5]


@pytest.mark.parametrize("cls", [FragmentationPolicy, FgdPolicy])
def test_pick_after_score_reuses_the_scored_placements(
    cls: type[FragmentationPolicy] | type[FgdPolicy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In one cycle the picker takes the chosen row's placements from the score: the same GPUs as picking afresh,
    without computing the placements again."""
    from scheduler_plugin.policies.fragmentation import plugin as frag_plugin

    rng = np.random.default_rng(3)
    nodes = [node(f"n{i}", [int(x) for x in rng.integers(0, 5, size=8) * 125], cpu=64_000) for i in range(30)]
    fleet = build_arrays(nodes)
    w = wl((WHOLE, 3), (HALF, 2), (PodShape(1000, 250, 1, None), 1))
    rows = np.arange(30, dtype=np.int64)
    calls: list[int] = []
    real = fragmentation.placements

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    for req in (GpuRequest(count=1, milli=250, cpu_milli=1000), GpuRequest(count=2, cpu_milli=4000)):
        policy = cls.create(fragmentation.FragmentationArgs())
        want = []
        for row in range(30):
            ctx = CycleContext(now=0.0)
            ctx.state.write(WORKLOAD_KEY, w)
            want.append(policy.pick(req, fleet, row, ctx))
        ctx = CycleContext(now=0.0)
        ctx.state.write(WORKLOAD_KEY, w)
        policy.score(req, fleet, rows, ctx)
        calls.clear()
        monkeypatch.setattr(frag_plugin, "placements", counted)
        assert [policy.pick(req, fleet, row, ctx) for row in range(30)] == want
        assert calls == []
        other = GpuRequest(count=1, milli=500, cpu_milli=1000)  # another request: computed afresh
        policy.pick(other, fleet, 0, ctx)
        assert calls == [1]
        monkeypatch.undo()


def test_the_cycles_pick_reuses_the_scores_cpu_surplus_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stranding term's fleet-wide surplus factor is computed once per cycle (score, then pick) and again in the
    next cycle; the picks are those of a cycle that computes it afresh."""
    rng = np.random.default_rng(4)
    nodes = [node(f"n{i}", [int(x) for x in rng.integers(0, 5, size=8) * 125], cpu=64_000) for i in range(20)]
    fleet = build_arrays(nodes)
    w = wl((WHOLE, 3), (HALF, 2), (PodShape(1000, 250, 1, None), 1))
    rows = np.arange(20, dtype=np.int64)
    req = GpuRequest(count=1, milli=250, cpu_milli=1000)
    policy = FragmentationPolicy.create(fragmentation.FragmentationArgs())
    want = []
    for row in range(20):
        ctx = CycleContext(now=0.0)
        ctx.state.write(WORKLOAD_KEY, w)
        want.append(policy.pick(req, fleet, row, ctx))
    calls: list[int] = []
    real = fragmentation.cpu_surplus_factor

    def counted(*a: Any) -> float:
        calls.append(1)
        return real(*a)

    monkeypatch.setattr("scheduler_plugin.policies.fragmentation.plugin.cpu_surplus_factor", counted)
    for _ in range(2):
        ctx = CycleContext(now=0.0)
        ctx.state.write(WORKLOAD_KEY, w)
        policy.score(req, fleet, rows, ctx)
        assert [policy.pick(req, fleet, row, ctx) for row in range(20)] == want
    assert calls == [1, 1]


def test_placements_with_and_without_a_cycle_context_agree() -> None:
    """The cycle's caches (eligibility, demand, the fleet's stats) change nothing in the placements."""
    from scheduler_plugin.policies.eligibility import LIMITS_KEY, GpuLimits

    rng = np.random.default_rng(8)
    nodes = [
        node(f"n{i}", [int(x) for x in rng.integers(0, 5, size=8) * 125], cpu=64_000, model=("A100", "V100")[i % 2])
        for i in range(60)
    ]
    fleet = build_arrays(nodes)
    w = wl((WHOLE, 3), (HALF, 2), (PodShape(1000, 250, 1, frozenset({"A100"})), 1), (CPU_ONLY, 1))
    rows = np.arange(60, dtype=np.int64)
    for req in (
        GpuRequest(count=1, milli=250, cpu_milli=1000),
        GpuRequest(count=1, milli=None, memory_bytes=20 * GIB, cpu_milli=1000),
        GpuRequest(count=2, cpu_milli=4000),
        GpuRequest(count=1, cpu_milli=1000, models=frozenset({"V100"})),
    ):
        for _ in range(2):
            ctx = CycleContext(now=0.0)
            ctx.state.write(LIMITS_KEY, GpuLimits())
            a = placements(req, fleet, rows, w, ctx, memory_aware=True)
            b = placements(req, fleet, rows, w, None, memory_aware=True)
            assert np.array_equal(a.pos, b.pos)
            assert np.array_equal(a.taken, b.taken)
            assert np.array_equal(a.delta, b.delta)
            assert np.array_equal(a.slot_left, b.slot_left)


@pytest.mark.parametrize("count", [1, 2, 3])
def test_whole_gpu_pods_take_the_first_eligible_gpus(count: int) -> None:
    from scheduler_plugin.policies.fragmentation import eligible_gpus

    rng = np.random.default_rng(21)
    nodes = [node(f"n{i}", [int(x) for x in rng.choice([0, 0, 250, 1000], size=6)]) for i in range(80)]
    fleet = build_arrays(nodes)
    req = GpuRequest(count=count, cpu_milli=1000)
    rows = np.arange(80, dtype=np.int64)
    pl = placements(req, fleet, rows, wl((WHOLE, 1), (HALF, 1)))
    elig, _ = eligible_gpus(req, fleet, rows)
    take = elig & (np.cumsum(elig, axis=1) <= count)
    fits = np.flatnonzero(take.sum(axis=1) == count)
    assert np.array_equal(pl.pos, fits)
    assert np.array_equal(pl.taken, take[fits])
    assert np.array_equal(pl.gpu_left, fleet.free_milli[fits].sum(axis=1) - count * 1000)


@pytest.mark.parametrize(
    "extreme",
    [
        {"host_memory_bytes": 2**64},
        {"cpu_milli": 2**64},
        {"cpu_milli": 2**63 - 1, "host_memory_bytes": 2**63 - 1},
        {"cpu_milli": -(2**64), "host_memory_bytes": -1},
        {"count": 10**30},
    ],
)
def test_no_request_can_store_a_value_that_breaks_the_learned_workload(extreme: dict[str, int]) -> None:
    """The estimator's state is shared by every later request: whatever it is fed (even requests no parser would
    produce), the workload it learns stays in int64 and scoring a normal pod still works."""
    fleet = build_arrays([node("a", [0, 500]), node("b", [1000, 0])])
    plugin = PRODUCTION.build("score", "fragmentation", {"prior_weight": 1}, "t")
    for i in range(30):
        bad = GpuRequest(**{"count": 1, "milli": 1000, **extreme}, pod_key=f"ns/bad-{i}")  # type: ignore[arg-type]
        plugin.estimator.observe(bad)  # what Framework.observe feeds it at filter, before any score
    w = plugin.estimator.workload()
    assert w.cpu_milli.dtype == np.int64 and w.host_memory is not None and w.host_memory.dtype == np.int64
    assert (w.cpu_milli >= 0).all() and (w.host_memory >= 0).all() and (w.count <= 1024).all()
    normal = GpuRequest(count=1, milli=500, cpu_milli=1000, pod_key="ns/normal")
    raw = plugin.score(normal, fleet, np.array([0, 1]), CycleContext(now=0.0))
    assert np.isfinite(raw).all()


def test_a_clamped_request_still_fits_nowhere() -> None:
    """Clamping keeps what the shape means: more CPU than any node has."""
    est = WorkloadEstimator(prior={WHOLE: 1.0}, prior_weight=1.0, coverage=1.0)
    est.observe(GpuRequest(count=1, cpu_milli=2**70, pod_key="ns/huge"))
    big = [s for s, _ in est.workload().shapes() if s.cpu_milli > 10**12]
    assert big and all(s.cpu_milli > 64 * 10**9 for s in big)


# --- the per-node score memo (score_memo.py, row_stamps.py) ---------------------------------------------------

MEMO_REQUESTS = [
    GpuRequest(count=1, milli=250, cpu_milli=1000, host_memory_bytes=GIB, pod_key="ns/a"),
    GpuRequest(count=2, cpu_milli=2000, pod_key="ns/b"),
    GpuRequest(count=0, cpu_milli=3000, pod_key="ns/c"),
]


def _memo_fleet(seed: int) -> Any:
    rng = np.random.default_rng(seed)
    nodes = [
        node(f"n{i}", [int(x) for x in rng.integers(0, 5, size=8) * 125], cpu=64_000, model=("A100", "V100")[i % 2])
        for i in range(48)
    ]
    return build_arrays(nodes)


def _memo_ctx(w: Any) -> CycleContext:
    return CycleContext(now=0.0, state=CycleState({WORKLOAD_KEY: w}))


@pytest.mark.parametrize("cls", [FragmentationPolicy, FgdPolicy])
def test_kept_scores_and_picks_equal_a_plugin_without_memo_and_only_written_nodes_are_rescored(cls: Any) -> None:
    fleet = _memo_fleet(3)
    w = _pinned_workload(np.random.default_rng(4), 24)
    rows = np.arange(fleet.n_nodes, dtype=np.int64)
    memoised = cls.create(fragmentation.FragmentationArgs())
    mp = pytest.MonkeyPatch()
    computed = count_score_computations(mp)
    try:
        for req in MEMO_REQUESTS:  # twice: the first call computes afresh, the second keeps every node's score
            memoised.score(req, fleet, rows, _memo_ctx(w))
            memoised.score(req, fleet, rows, _memo_ctx(w))
        unscored: dict[int, set[int]] = {i: set() for i in range(len(MEMO_REQUESTS))}  # written since last scored
        for step in range(6):
            req = MEMO_REQUESTS[step % len(MEMO_REQUESTS)]
            written = (step * 11) % fleet.n_nodes
            apply_placement(fleet, GpuRequest(count=1, milli=125, cpu_milli=500, host_memory_bytes=GIB), written, (1,))
            for nodes in unscored.values():
                nodes.add(written)
            computed.clear()
            got = memoised.score(req, fleet, rows, _memo_ctx(w))
            # the nodes written since this shape was last scored alone (the others' content is unchanged)
            assert computed == [len(unscored[step % len(MEMO_REQUESTS)])]
            unscored[step % len(MEMO_REQUESTS)].clear()
            fresh = cls.create(fragmentation.FragmentationArgs())  # no memo: everything computed now
            want = fresh.score(req, fleet, rows, _memo_ctx(w))
            assert got.tolist() == want.tolist()
            for row in (written, int(np.argmax(want)), (written + 1) % fleet.n_nodes):
                picked = memoised.pick(req, fleet, row, _memo_ctx(w))
                assert memoised.pick(req, fleet, row, _memo_ctx(w)) == picked  # the same GPUs again
                assert picked == cls.create(fragmentation.FragmentationArgs()).pick(req, fleet, row, _memo_ctx(w))
    finally:
        mp.undo()


def test_a_new_workload_or_cycle_wide_value_recomputes_every_node() -> None:
    fleet = _memo_fleet(5)
    rows = np.arange(10, dtype=np.int64)
    memo = ScoreMemo()
    calls: list[int] = []

    def compute(sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        calls.append(len(sel))
        return np.asarray(sel, dtype=np.float64) + len(calls), np.ones(len(sel), dtype=np.bool_)

    w1, w2 = _pinned_workload(np.random.default_rng(1), 6), _pinned_workload(np.random.default_rng(2), 6)
    memo.scores("k", fleet, rows, w1, (1.0,), compute)
    memo.scores("k", fleet, rows, w1, (1.0,), compute)
    kept = memo.scores("k", fleet, rows, w1, (1.0,), compute)
    assert calls == [10, 10]  # once afresh, once kept, then every score from the memo
    assert kept.tolist() == (np.arange(10) + 2.0).tolist()
    memo.scores("k", fleet, rows, w1, (0.5,), compute)  # the surplus factor moved: every node again
    assert calls == [10, 10, 10]
    memo.scores("k", fleet, rows, w2, (0.5,), compute)  # another workload: afresh
    assert calls == [10, 10, 10, 10]


def test_a_soft_value_that_moves_recomputes_exactly_the_kept_scores_that_read_it_on_every_row() -> None:
    fleet = _memo_fleet(5)
    w = _pinned_workload(np.random.default_rng(1), 6)
    memo = ScoreMemo()
    computed: list[list[int]] = []
    soft = [0.5]

    asked: list[np.ndarray] = []

    def compute(sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        computed.append(sel.tolist())
        rows = asked[-1][sel]
        return rows * soft[0], rows % 3 == 0  # rows 0, 3, 6, ... read the soft value

    def scores(rows: np.ndarray) -> list[float]:
        asked.append(rows)
        return memo.scores("k", fleet, rows, w, (), compute, None, (soft[0],)).tolist()

    order = np.arange(12, dtype=np.int64)
    scores(order)
    scores(order)  # kept from now on
    computed.clear()
    soft[0] = 0.25  # every row 0, 3, 6, 9 read it: those alone are computed again
    assert scores(order) == [x * (0.25 if x % 3 == 0 else 0.5) for x in range(12)]
    assert computed == [[0, 3, 6, 9]]
    computed.clear()
    first = np.arange(6, dtype=np.int64)  # a call on some rows only, with the value moved again ...
    soft[0] = 2.0
    assert scores(first) == [x * (2.0 if x % 3 == 0 else 0.5) for x in range(6)]
    assert computed == [[0, 3]]
    computed.clear()
    # ... leaves rows 6 and 9 stale though they were not asked for
    assert scores(order) == [x * (2.0 if x % 3 == 0 else 0.5) for x in range(12)]
    assert computed == [[6, 9]]
    computed.clear()
    assert scores(order) == [x * (2.0 if x % 3 == 0 else 0.5) for x in range(12)]
    assert computed == []


def test_kelvin_scores_with_a_moving_stranding_weight_equal_a_plugin_without_memo() -> None:
    """On a CPU-short fleet the stranding term's surplus factor moves with every CPU-only pod placed; the memo keeps
    the scores that did not read it, values the placements of those that did again (computing only the written
    node), and every score equals a fresh plugin's."""
    rng = np.random.default_rng(8)
    nodes = [
        node(f"n{i}", [int(x) for x in rng.integers(0, 5, size=8) * 125], cpu=int(rng.integers(20, 120)) * 1000)
        for i in range(48)
    ]
    fleet = build_arrays(nodes)
    w = wl((WHOLE, 3.0), (HALF, 2.0), (PodShape(16000, 250, 1, None), 1.0), (CPU_ONLY, 1.0))
    rows = np.arange(fleet.n_nodes, dtype=np.int64)
    args = fragmentation.FragmentationArgs(stranding_full_surplus=10.0)
    memoised = FragmentationPolicy.create(args)
    req = GpuRequest(count=1, milli=500, cpu_milli=12000, pod_key="ns/a")  # CPU-heavy: strands GPU on some nodes
    factors: set[float] = set()
    recomputed: list[int] = []
    mp = pytest.MonkeyPatch()
    computed = count_score_computations(mp)
    revalued: list[int] = []
    revalue = memoised.memo.revalue
    assert revalue is not None

    def counting(parts: tuple[np.ndarray, ...], soft: tuple[object, ...]) -> np.ndarray:
        revalued.append(len(parts[0]))
        return revalue(parts, soft)

    memoised.memo.revalue = counting
    try:
        memoised.score(req, fleet, rows, _memo_ctx(w))
        memoised.score(req, fleet, rows, _memo_ctx(w))
        for step in range(6):
            written = (step * 7) % fleet.n_nodes
            apply_placement(fleet, GpuRequest(count=0, cpu_milli=4000), written, ())
            computed.clear()
            ctx = _memo_ctx(w)
            got = memoised.score(req, fleet, rows, ctx)
            factors.add(memoised._surplus(fleet, w, ctx))
            recomputed.append(sum(computed))
            want = FragmentationPolicy.create(args).score(req, fleet, rows, _memo_ctx(w))
            assert got.tolist() == want.tolist()
    finally:
        mp.undo()
    assert len(factors) == 6 and all(0 < f < 1 for f in factors)  # the weight moved at every step
    # the written node alone computed; the placements of the scores that read the weight valued again each step
    assert recomputed == [1] * 6, recomputed
    assert len(revalued) == 6 and all(n > 0 for n in revalued), revalued


def test_a_moved_soft_value_revalues_the_kept_placements_of_the_rows_that_read_it() -> None:
    """With ``revalue`` the memo keeps the soft placements a computation hands back and values them again when the
    soft value moves (a row's score: its placements' highest); a row written since is computed, its old placements
    dropped."""
    fleet = _memo_fleet(5)
    w = _pinned_workload(np.random.default_rng(1), 6)
    memo = ScoreMemo(revalue=lambda parts, soft: parts[0] * float(soft[0]))  # type: ignore[arg-type]
    computed: list[list[int]] = []
    rows = np.arange(10, dtype=np.int64)

    def compute(sel: np.ndarray) -> tuple[np.ndarray, np.ndarray, SoftParts]:
        computed.append(sel.tolist())
        at = rows[sel]
        reads = at % 2 == 0  # even rows read the soft value: two placements each, worth the row and its half
        pos = np.repeat(np.nonzero(reads)[0], 2)
        parts = np.tile([1.0, 0.5], int(reads.sum())) * at[pos]
        return np.where(reads, at * soft[0], at * 0.1), reads, SoftParts(pos, (parts,))

    def want() -> list[float]:
        return [r * soft[0] if r % 2 == 0 else r * 0.1 for r in range(10)]

    soft = [2.0]
    memo.scores("k", fleet, rows, w, (), compute, None, (soft[0],))
    memo.scores("k", fleet, rows, w, (), compute, None, (soft[0],))  # kept from now on
    computed.clear()
    soft[0] = 3.0
    assert memo.scores("k", fleet, rows, w, (), compute, None, (soft[0],)).tolist() == want()
    assert computed == []  # valued again, not computed
    fleet.free_milli[4, 0] -= 1  # row 4 written: computed, its placements replace the old ones
    assert memo.scores("k", fleet, rows, w, (), compute, None, (soft[0],)).tolist() == want()
    assert computed == [[4]]
    soft[0] = 0.5
    assert memo.scores("k", fleet, rows, w, (), compute, None, (soft[0],)).tolist() == want()
    assert computed == [[4]]


def test_row_stamps_move_for_written_rows_only_and_stay_the_same_array_while_nothing_changes() -> None:
    fleet = _memo_fleet(6)
    first = row_stamps(fleet)
    assert row_stamps(fleet) is first
    apply_placement(fleet, GpuRequest(count=1, milli=125, cpu_milli=500), 7, (2,))
    fleet.mem_free_host[9] -= GIB
    fleet.free_mem[30, 1] -= GIB
    now = row_stamps(fleet)
    assert np.flatnonzero(now != first).tolist() == [7, 9, 30]


@pytest.mark.parametrize("rows", [1, 2, 4, 5, 40])
def test_free_stats_count_and_sum_the_gpus_reaching_each_threshold(rows: int) -> None:
    """Few rows (an arrival's written node) are compared with the thresholds directly, more are bucketed: both give
    the plain count and sum, in the same dtypes."""
    w = Workload.from_counts(
        {PodShape(4000, 110, 1, None): 1.0, PodShape(4000, 500, 1, None): 1.0, PodShape(8000, 1000, 2, None): 1.0},
        coverage=1.0,
    )
    rng = np.random.default_rng(rows)
    free = rng.choice([0, 110, 300, 500, 999, 1000], size=(rows, 8)).astype(np.int32)
    st = free_stats(free, w)
    assert st.total.dtype == st.gpus_at_least.dtype == np.int64 and st.free_at_least.dtype == np.float64
    for r in range(rows):
        gpus = free[r].tolist()
        assert st.total[r] == sum(gpus)
        assert st.gpus_at_least[r].tolist() == [sum(g >= t for g in gpus) for t in w.thresholds.tolist()]
        assert st.free_at_least[r].tolist() == [float(sum(g for g in gpus if g >= t)) for t in w.thresholds.tolist()]


@pytest.mark.parametrize("seed", range(4))
def test_a_pick_the_score_memo_kept_is_the_pick_computed_for_the_row_alone(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bind's pick (a new cycle, the picker bound to a scorer of the same class and arguments) reads the GPUs the
    score memo kept with the row's score while that score would be served: over a run of binds, pods of several
    shapes (shared ones, CPU-hungry ones that move the stranding weight), each pick is what a plugin without a memo
    computes for the row, and most come from the memo."""
    from scheduler_plugin.policies.fragmentation.score_memo import ScoreMemo, _Entry

    rng = np.random.default_rng(seed)
    fleet = build_arrays(  # CPU runs short as pods arrive: the stranding weight moves
        [node(f"n{i}", [int(x) for x in rng.integers(0, 5, size=8) * 125], cpu=40_000) for i in range(40)]
    )
    w = wl((WHOLE, 3), (HALF, 2), (PodShape(1000, 250, 1, None), 1), (PodShape(24_000, 1000, 2, None), 1))
    shapes = [
        GpuRequest(count=1, cpu_milli=4000),
        GpuRequest(count=2, cpu_milli=24_000),
        GpuRequest(count=1, milli=250, cpu_milli=1000),
        GpuRequest(count=1, milli=500, cpu_milli=2000),
    ]
    args = fragmentation.FragmentationArgs()
    scorer, picker = FragmentationPolicy.create(args), FragmentationPolicy.create(args)
    picker.bind([scorer])
    kept = {"hits": 0, "revalued": 0}
    real, real_revalued = ScoreMemo.picked, _Entry.revalued

    def counted(self: ScoreMemo, *a: Any, **k: Any) -> Any:
        got = real(self, *a, **k)
        kept["hits"] += got is not None
        return got

    def revalued(self: _Entry, *a: Any) -> None:
        kept["revalued"] += 1
        real_revalued(self, *a)

    monkeypatch.setattr(ScoreMemo, "picked", counted)
    monkeypatch.setattr(_Entry, "revalued", revalued)
    every = np.arange(fleet.n_nodes, dtype=np.int64)
    for step in range(80):
        req = shapes[int(rng.integers(0, len(shapes)))]
        for _ in range(2 if step == 0 else 1):  # the memo engages on a workload's second call
            scores = scorer.score(req, fleet, every, _memo_ctx(w))
        row = int(np.argmax(scores)) if rng.random() < 0.7 else int(rng.integers(0, fleet.n_nodes))
        got = picker.pick(req, fleet, row, _memo_ctx(w))
        want = FragmentationPolicy.create(args).pick(req, fleet, row, _memo_ctx(w))
        assert got == want, step
        if got:
            apply_placement(fleet, req, row, got)
    assert kept["hits"] > 30 and kept["revalued"] > 5, kept


def test_the_memo_keeps_a_pick_while_it_would_serve_the_rows_score() -> None:
    """:meth:`ScoreMemo.picked` gives the GPU slots a computation handed back with a row's score exactly while
    :meth:`ScoreMemo.scores` would serve that score unchanged: not for a row written since, nor for a row whose score
    read a soft value that moved (valued again: another placement may win), nor for another workload; a row whose
    score read no soft value keeps its pick when the soft value moves."""
    fleet = _memo_fleet(6)
    w = _pinned_workload(np.random.default_rng(2), 6)
    memo = ScoreMemo(revalue=lambda parts, soft: parts[0] * float(soft[0]))  # type: ignore[arg-type]
    rows = np.arange(10, dtype=np.int64)
    slots = np.eye(10, fleet.max_gpus, dtype=np.bool_)  # row r's pick: its slot r % G

    def compute(sel: np.ndarray) -> tuple[np.ndarray, np.ndarray, SoftParts, np.ndarray]:
        at = rows[sel]
        reads = at % 2 == 0
        pos = np.nonzero(reads)[0]
        return np.where(reads, at * soft[0], at * 0.1), reads, SoftParts(pos, (at[pos].astype(float),)), slots[at]

    def picked(row: int, workload: Workload | None = None) -> list[int] | None:
        got = memo.picked("k", fleet, row, workload or w, (), lambda: row_stamps(fleet), (soft[0],))
        return None if got is None else got.nonzero()[0].tolist()

    soft = [2.0]
    memo.scores("k", fleet, rows, w, (), compute, None, (soft[0],))
    assert picked(3) is None  # the memo engages on the workload's second call
    memo.scores("k", fleet, rows, w, (), compute, None, (soft[0],))
    assert [picked(r) for r in range(4)] == [[0], [1], [2], [3]]
    assert picked(3, _pinned_workload(np.random.default_rng(3), 6)) is None
    fleet.free_milli[3, 0] -= 1  # row 3 written: no pick until it is scored again
    assert picked(3) is None
    memo.scores("k", fleet, rows, w, (), compute, None, (soft[0],))
    assert picked(3) == [3]
    soft[0] = 3.0  # moved: rows 0 and 2 read it
    assert picked(2) is None and picked(1) == [1]
    memo.scores("k", fleet, rows, w, (), compute, None, (soft[0],))  # valued again, not computed
    assert picked(2) is None and picked(1) == [1] and picked(3) == [3]
