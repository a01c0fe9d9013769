"""Live scarcity pricing of the workload's shapes (``policies/fragmentation/scarcity.py``) and its use in kelvin's
fragmentation score."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_plugin.model import GIB, GpuInfo, GpuNode, GpuRequest, build_arrays
from scheduler_plugin.policies import fragmentation
from scheduler_plugin.policies.base import CycleContext, CycleState
from scheduler_plugin.policies.fragmentation import WORKLOAD_KEY, FragmentationPolicy, PodShape, Workload
from scheduler_plugin.policies.fragmentation.gradient import FLEET_FREE_TOTALS, FleetFreeTotals, free_stats
from scheduler_plugin.policies.fragmentation.scarcity import (
    FLEET_USABLE,
    FleetUsable,
    fleet_scarcity,
    fleet_usable,
    scarcity_weights,
    usable_capacity,
)


def gpu_node(name: str, cpu: int, mem_gib: int, model: str, gpus: int = 8) -> GpuNode:
    infos = tuple(GpuInfo(index=j, uuid=f"{name}-{j}", model=model, memory_total_bytes=32 * GIB) for j in range(gpus))
    return GpuNode(name, infos, cpu_allocatable_milli=cpu, memory_allocatable_bytes=mem_gib * GIB)


ONE = PodShape(8000, 1000, 1, None)
FOUR_LIGHT = PodShape(32_000, 1000, 4, None)
FOUR_HEAVY = PodShape(60_000, 1000, 4, None)
EIGHT_HUGE = PodShape(120_000, 1000, 8, None)
HALF = PodShape(4000, 500, 1, None)


def fleet_with_one_big_node() -> list[GpuNode]:
    """One 128-core 768 GiB node (the only home of a 120-core 8-GPU shape), one 96-core node, six 64-core ones."""
    return [
        gpu_node("big", 128_000, 768, "G3"),
        gpu_node("mid", 96_000, 368, "V100M32"),
        *(gpu_node(f"small{i}", 64_000, 256, "G2") for i in range(6)),
    ]


def workload() -> Workload:
    counts = {ONE: 60.0, FOUR_LIGHT: 15.0, FOUR_HEAVY: 5.0, EIGHT_HUGE: 2.0, HALF: 18.0}
    return Workload.from_counts(counts, coverage=1.0, host_memory={EIGHT_HUGE: 700 * GIB})


def test_usable_capacity_counts_the_free_gpus_each_shape_fits() -> None:
    fleet = build_arrays(fleet_with_one_big_node())
    w = workload()
    st = free_stats(fleet.free_milli, w)
    usable = usable_capacity(w, st.gpus_at_least, st.free_at_least, fleet.cpu_free, fleet.mem_free_host, None)
    by_shape = dict(zip((s for s, _ in w.shapes()), usable.tolist(), strict=True))
    assert by_shape[ONE] == by_shape[HALF] == by_shape[FOUR_LIGHT] == 64_000  # every node
    assert by_shape[FOUR_HEAVY] == 64_000  # 60 cores: every node has 64 or more
    assert by_shape[EIGHT_HUGE] == 8000  # 120 cores and 700 GiB: the big node only


def test_weights_grow_as_a_shapes_homes_run_out() -> None:
    # 10 free GPUs: a shape that can use all of them weighs 1, one that can use 1 of them 10 -> rounded down to a
    # half power of two (8), one that fits nowhere 1 (no placement changes its F), capped at the cap.
    got = scarcity_weights(np.array([10_000.0, 1000.0, 0.0, 10.0]), 10_000.0, cap=64.0)
    assert got.tolist() == [1.0, 8.0, 1.0, 64.0]
    assert scarcity_weights(np.array([5000.0]), 10_000.0).tolist() == [2.0]
    assert scarcity_weights(np.array([3000.0]), 10_000.0).tolist() == [pytest.approx(2**1.5)]
    with pytest.raises(ValueError, match="cap"):
        scarcity_weights(np.array([1.0]), 1.0, cap=0.5)


def test_live_weights_follow_the_snapshot() -> None:
    """The weight is live: once the big node is half used, the huge shape fits nowhere (weight 1), and a pinned
    shape's weight counts only the nodes of its model."""
    pinned = PodShape(8000, 1000, 1, frozenset({"V100M32"}))
    w = Workload.from_counts(
        {ONE: 60.0, EIGHT_HUGE: 2.0, pinned: 10.0}, coverage=1.0, host_memory={EIGHT_HUGE: 700 * GIB}
    )
    fleet = build_arrays(fleet_with_one_big_node())
    weights = dict(zip((s for s, _ in w.shapes()), fleet_scarcity(w, fleet, True).tolist(), strict=True))
    assert weights[ONE] == 1.0
    assert weights[EIGHT_HUGE] == 8.0  # 64 free GPUs, 8 usable
    assert weights[pinned] == 8.0  # only the V100M32 node's 8
    fleet.free_milli[0, :4] = 0
    after = fleet_scarcity(w, fleet, True)
    assert after[[s for s, _ in w.shapes()].index(EIGHT_HUGE)] == 1.0


def test_priced_workload_keeps_the_mix_the_stranding_and_plan_read() -> None:
    w = workload()
    priced = w.priced(np.full(len(w), 2.0))
    assert priced.prob.tolist() == pytest.approx((2 * w.prob).tolist())
    assert priced.cpu_per_milli == w.cpu_per_milli
    assert priced.shares is not None and w.shares is not None
    assert priced.shares[1].tolist() == w.shares[1].tolist()
    with pytest.raises(ValueError, match="weights"):
        w.priced(np.ones(len(w) + 1))


def scores(args: fragmentation.FragmentationArgs) -> np.ndarray:
    fleet = build_arrays(fleet_with_one_big_node())
    ctx = CycleContext(now=0.0, state=CycleState({WORKLOAD_KEY: workload()}))
    req = GpuRequest(count=4, cpu_milli=60_000, host_memory_bytes=64 * GIB)
    return FragmentationPolicy.create(args).score(req, fleet, np.arange(fleet.n_nodes), ctx)


def test_kelvin_keeps_the_only_home_of_a_scarce_shape() -> None:
    """A 4-GPU 60-core pod, the big node empty against the 96-core one: the big node is the only home of the
    120-core 8-GPU shape. Priced fleet-wide (scarcity off: main's score), the stranding term charges the 96-core node
    for the 4 GPUs its 36 cores left cannot feed at the workload's mean ratio and the pod breaks the big node; priced
    by live scarcity it goes to the 96-core node."""
    live = scores(fragmentation.FragmentationArgs())
    assert live[1] > live[0]
    fleet_wide = scores(fragmentation.FragmentationArgs(scarcity=False))
    assert fleet_wide[0] > fleet_wide[1]


def test_scarcity_args_are_validated() -> None:
    from scheduler_plugin.policies.plugins import PRODUCTION
    from scheduler_plugin.policies.registry import PolicyConfigError

    with pytest.raises(PolicyConfigError, match="scarcity_cap"):
        PRODUCTION.build("score", "fragmentation", {"scarcity_cap": 0.5}, "t")


def test_the_fleet_memo_follows_in_place_writes_and_matches_a_recount() -> None:
    """The simulator writes one node's capacity in place per arrival: the memo recomputes those rows and its totals
    equal a recount of the whole fleet."""
    pinned = PodShape(8000, 1000, 1, frozenset({"G2"}))
    w = Workload.from_counts({ONE: 6.0, FOUR_HEAVY: 2.0, EIGHT_HUGE: 1.0, HALF: 3.0, pinned: 2.0}, coverage=1.0)
    fleet = build_arrays(fleet_with_one_big_node())
    rng = np.random.default_rng(7)
    for _ in range(20):
        row = int(rng.integers(fleet.n_nodes))
        fleet.free_milli[row, int(rng.integers(8))] = int(rng.integers(0, 1001))
        fleet.cpu_free[row] = int(rng.integers(0, 130_000))
        got = FleetUsable().usable(fleet, w, True)  # afresh
        kept = fleet.derive(FLEET_USABLE, lambda _: FleetUsable()).usable(fleet, w, True)
        st = free_stats(fleet.free_milli, w)
        want = usable_capacity(
            w, st.gpus_at_least, st.free_at_least, fleet.cpu_free, fleet.mem_free_host, w.node_access(fleet)
        )
        assert kept.tolist() == want.tolist() == got.tolist()


def test_the_snapshot_and_its_working_copy_share_the_memo_and_each_matches_a_recount() -> None:
    """A copy takes the snapshot index over (the simulator's working copy, a ledger overlay): both fleets' writes
    move the one holder back and forth between their contents, and each answer equals a recount of its fleet."""
    pinned = PodShape(8000, 1000, 1, frozenset({"G2"}))
    w = Workload.from_counts({ONE: 6.0, FOUR_HEAVY: 2.0, EIGHT_HUGE: 1.0, HALF: 3.0, pinned: 2.0}, coverage=1.0)
    snap = build_arrays(fleet_with_one_big_node())
    fleet_usable(snap).usable(snap, w, True)
    work = snap.copy()
    assert fleet_usable(work) is fleet_usable(snap)
    rng = np.random.default_rng(11)
    for step in range(30):
        f = work if step % 3 else snap
        row = int(rng.integers(f.n_nodes))
        f.free_milli[row, int(rng.integers(8))] = int(rng.integers(0, 1001))
        f.cpu_free[row] = int(rng.integers(0, 130_000))
        for g in (f, snap if f is work else work):
            st = free_stats(g.free_milli, w)
            want = usable_capacity(w, st.gpus_at_least, st.free_at_least, g.cpu_free, g.mem_free_host, w.node_access(g))
            assert fleet_usable(g).usable(g, w, True).tolist() == want.tolist()


def test_the_fleet_free_totals_follow_in_place_writes_of_a_fleet_and_its_copy() -> None:
    """The free GPU and CPU totals (the stranding term's surplus factor, the scarcity ratio) kept for a snapshot and
    its working copy equal a recount of whichever fleet is asked, after writes to either (a CPU-only node's CPU is
    not counted)."""
    snap = build_arrays([*fleet_with_one_big_node(), gpu_node("cpu-only", 64_000, 256, "G2", gpus=0)])
    holder = snap.derive(FLEET_FREE_TOTALS, lambda _: FleetFreeTotals())
    holder.totals(snap)
    work = snap.copy()
    rng = np.random.default_rng(5)
    for step in range(40):
        f = work if step % 4 else snap
        row = int(rng.integers(f.n_nodes))
        f.free_milli[row, int(rng.integers(8))] = int(rng.integers(0, 1001)) if f.gpu_present[row].any() else 0
        f.cpu_free[row] = int(rng.integers(-1000, 130_000))
        for g in (f, snap if f is work else work):
            gpu = int(np.where(g.gpu_present, g.free_milli, 0).sum())
            cpu = int(np.maximum(g.cpu_free[g.gpu_present.any(axis=1)], 0).sum())
            assert g.derive(FLEET_FREE_TOTALS, lambda _: FleetFreeTotals()) is holder
            assert holder.totals(g) == (gpu, cpu)


def test_a_learned_workload_is_priced_by_the_published_snapshot() -> None:
    """The extender's workload is learned (a new object once the mix moved; here with every pod,
    ``republishDrift`` 0): the weights come from the snapshot published last (``prepare``, off the request path),
    looked up by shape, and decide like the live ones (``confidenceZ`` 0: the scarcity weights alone; the hedge on
    top of them: ``test_workload_hedge.py``)."""
    args = fragmentation.FragmentationArgs(prior_weight=0, coverage=1.0, republish_drift=0, confidence_z=0)
    policy = FragmentationPolicy.create(args)
    for i, (shape, n) in enumerate([(ONE, 60), (FOUR_LIGHT, 15), (FOUR_HEAVY, 5), (EIGHT_HUGE, 2), (HALF, 18)]):
        for j in range(n):
            policy.observe(
                GpuRequest(
                    count=shape.gpus,
                    milli=shape.milli,
                    cpu_milli=shape.cpu_milli,
                    host_memory_bytes=700 * GIB if shape == EIGHT_HUGE else 0,
                    pod_key=f"ns/p{i}-{j}",
                )
            )
    fleet = build_arrays(fleet_with_one_big_node())
    req = GpuRequest(count=4, cpu_milli=60_000, host_memory_bytes=64 * GIB)
    before = policy.score(req, fleet, np.arange(fleet.n_nodes), CycleContext(now=0.0))
    policy.prepare(fleet)
    w = policy.estimator.workload()
    policy.observe(GpuRequest(count=1, cpu_milli=8000, pod_key="ns/late"))  # a new learned workload
    assert policy.estimator.workload() is not w
    ctx = CycleContext(now=0.0)
    after = policy.score(req, fleet, np.arange(fleet.n_nodes), ctx)
    assert after[1] > after[0]
    assert before[1] > before[0]  # without a published snapshot: computed live
    priced = ctx.state.read(fragmentation.plugin.SCARCITY_KEY)[2]
    huge = [s for s, _ in priced.shapes()].index(EIGHT_HUGE)
    # weight 8 (its homes: one node of eight), its structural part x4 (strandingWeight): 1 + 4 * 7
    assert priced.prob[huge] / policy.estimator.workload().prob[huge] == pytest.approx(29.0)


def test_a_fleet_short_of_cpu_counts_homes_without_their_cpu() -> None:
    """Every node but the big one down to 8 free cores: the fleet's free CPU (176 cores) cannot feed its 64 free
    GPUs at the workload's ratio (no surplus). Counted with their CPU, the 60-core 4-GPU shape's homes are the big
    node's 8 GPUs (weight 8); but CPU then limits every shape, so the policy counts homes without it: that shape weighs
    1, while the 8-GPU shape that needs 700 GiB of host memory keeps its weight (the big node only; its structural
    part x4: 1 + 4 * 7)."""
    fleet = build_arrays(fleet_with_one_big_node())
    fleet.cpu_free[1:] = 8000
    fleet.cpu_free[0] = 120_000
    w = workload()
    shapes = [s for s, _ in w.shapes()]
    with_cpu = fleet_scarcity(w, fleet, True)
    assert with_cpu[shapes.index(FOUR_HEAVY)] == 8.0
    ctx = CycleContext(now=0.0, state=CycleState({WORKLOAD_KEY: w}))
    priced = FragmentationPolicy.create(fragmentation.FragmentationArgs()).scored_workload(fleet, ctx)
    ratio = dict(zip(shapes, (priced.prob / w.prob).tolist(), strict=True))
    assert ratio[FOUR_HEAVY] == 1.0
    assert ratio[EIGHT_HUGE] == pytest.approx(29.0)
    assert ratio[ONE] == 1.0


def test_only_the_scarcity_a_shape_s_own_demands_cause_is_scaled() -> None:
    """``structural``: the 120-core 700 GiB 8-GPU shape weighs 8 (the big node of eight) where every node has its
    8 GPUs free (bare weight 1): scaled to 1 + 4 * 7, within the cap. With the six small nodes' GPUs half taken, any
    8-GPU shape finds only two nodes (bare weight 2): only what the heavy shape's CPU and memory add is scaled; a
    shape every node hosts stays at 1."""
    fleet = build_arrays(fleet_with_one_big_node())
    w = workload()
    shapes = [s for s, _ in w.shapes()]
    huge = shapes.index(EIGHT_HUGE)
    assert fleet_scarcity(w, fleet, True)[huge] == 8.0
    assert fleet_scarcity(w, fleet, True, structural=4.0)[huge] == 29.0
    assert fleet_scarcity(w, fleet, True, structural=4.0, cap=16.0)[huge] == 16.0
    fleet.free_milli[2:, :4] = 0  # the six small nodes: 4 GPUs free each
    plain, scaled = fleet_scarcity(w, fleet, True), fleet_scarcity(w, fleet, True, structural=4.0)
    assert plain[shapes.index(ONE)] == scaled[shapes.index(ONE)] == 1.0
    assert plain[huge] > 1.0
    # the bare 8-GPU shape finds the big and the mid node (16 of 40 free GPUs): the huge one only the big node
    assert scaled[huge] == pytest.approx(2.0 + 4.0 * (plain[huge] - 2.0))


def test_one_gpu_shapes_keep_their_structural_scarcity_unscaled() -> None:
    """A one-GPU shape that needs 120 cores has the big node's 8 GPUs for homes (weight 8, bare 1): not scaled."""
    hungry_one = PodShape(120_000, 1000, 1, None)
    w = Workload.from_counts({ONE: 90.0, hungry_one: 10.0}, coverage=1.0)
    fleet = build_arrays(fleet_with_one_big_node())
    at = [s for s, _ in w.shapes()].index(hungry_one)
    assert fleet_scarcity(w, fleet, True)[at] == fleet_scarcity(w, fleet, True, structural=4.0)[at] == 8.0
