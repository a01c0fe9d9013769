"""The packing plan (arc-flow LP of the workload's shares) and the CPU-stranding term of kelvin's fragmentation."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_plugin.model import GIB, GpuAssignment, GpuInfo, GpuNode, GpuRequest, build_arrays
from scheduler_plugin.policies import fragmentation
from scheduler_plugin.policies.base import CycleContext, CycleState
from scheduler_plugin.policies.fragmentation import (
    WORKLOAD_KEY,
    FgdPolicy,
    FragmentationArgs,
    FragmentationPolicy,
    PodShape,
    Workload,
    placements,
    stranded,
    stranding_change,
)
from scheduler_plugin.policies.packing import (
    LEVELS,
    PlanCache,
    completion_cost,
    free_units,
    share_distribution,
    size_units,
    solve,
)

S470 = PodShape(8000, 470, 1, None)
S320 = PodShape(4000, 320, 1, None)
S650 = PodShape(8000, 650, 1, None)
WHOLE = PodShape(8000, 1000, 1, None)


def node(name: str, used: list[int], cpu: int = 64_000, cpu_used: int = 0) -> GpuNode:
    gpus = tuple(
        GpuInfo(index=j, uuid=f"{name}-{j}", model="A100", memory_total_bytes=80 * GIB) for j in range(len(used))
    )
    assigned = [GpuAssignment(f"ns/{name}-p{j}", (j,), milli=u) for j, u in enumerate(used) if u]
    return GpuNode(
        name,
        gpus,
        cpu_allocatable_milli=cpu,
        cpu_requested_milli=cpu_used,
        memory_allocatable_bytes=512 * GIB,
        assignments=tuple(assigned),
    )


def test_units_round_shares_up_and_free_space_down() -> None:
    assert size_units(np.array([470, 115, 1, 1000])).tolist() == [47, 12, 1, LEVELS]
    assert free_units(np.array([530, 119, 0, 1000])).tolist() == [53, 11, 0, LEVELS]


def test_one_size_packs_two_per_gpu_and_every_such_placement_is_free() -> None:
    plan = solve(np.array([47]), np.array([1.0]))
    assert plan is not None
    assert plan.gpus_per_share_gpu == pytest.approx(1 / 0.94)
    # Opening a GPU and completing a pair are both part of the optimal packing.
    assert plan.penalty(np.array([1000, 530]), np.array([470, 470])).tolist() == [0.0, 0.0]


def test_plan_prices_the_pairing_fgd_gets_wrong() -> None:
    # 0.47s pair with each other, 0.32s complete 0.65s: a 0.32 on a 0.47 GPU leaves 0.21 nothing fills.
    plan = solve(np.array([32, 47, 65]), np.array([0.25, 0.5, 0.25]))
    assert plan is not None
    on_470, on_650, fresh = plan.penalty(np.array([530, 350, 1000]), np.array([320, 320, 320]))
    assert on_650 == 0 and fresh == 0
    assert on_470 > 0


def test_a_free_arc_into_a_gap_only_rare_shares_fill_is_priced() -> None:
    # 0.16s belong in the 0.19 a 0.81 leaves. Stacking one on another 0.16 has a reduced cost of 0 in the LP's
    # (degenerate) duals, yet the 0.32 GPU it makes can only be finished by more of the rare 0.16s or left part empty.
    plan = solve(np.array([16, 81]), np.array([74.0, 1078.0]))
    assert plan is not None
    on_016, on_081, fresh = plan.penalty(np.array([840, 190, 1000]), np.array([160, 160, 160]))
    assert on_081 == 0 and fresh == 0
    assert on_016 > 0


def test_completion_cost_is_the_cheapest_way_to_finish_a_gpu() -> None:
    # Levels 0..4; shares 0 -> 2, 2 -> 4 and 0 -> 3 are free; leaving the rest empty costs 0.7, 0.9, 0.4 at 1, 2, 3.
    finish = completion_cost(
        4,
        np.array([0, 2, 0]),
        np.array([2, 4, 3]),
        np.zeros(3),
        np.array([1, 2, 3]),
        np.array([0.7, 0.9, 0.4]),
    )
    assert finish.tolist() == pytest.approx([0.0, 0.7, 0.0, 0.4, 0.0])


def test_an_unplanned_size_takes_the_prices_of_the_next_larger_one() -> None:
    plan = solve(np.array([32, 47, 65]), np.array([0.25, 0.5, 0.25]))
    assert plan is not None
    assert (
        plan.penalty(np.array([530]), np.array([310])).tolist()
        == plan.penalty(np.array([530]), np.array([320])).tolist()
    )
    # Larger than every planned share: no opinion.
    assert plan.penalty(np.array([1000]), np.array([900])).tolist() == [0.0]


def test_share_distribution_ignores_whole_gpus_and_merges_units() -> None:
    sizes, weights = share_distribution(np.array([470, 475, 1000, 0, 320]), np.array([1.0, 1.0, 5.0, 3.0, 2.0]))
    assert sizes.tolist() == [32, 47, 48]
    assert weights.tolist() == pytest.approx([0.5, 0.25, 0.25])
    assert solve(*share_distribution(np.array([1000]), np.array([1.0]))) is None


def test_plan_cache_resolves_only_when_the_mix_drifts() -> None:
    cache = PlanCache(drift=0.05)
    first = cache.plan(np.array([470, 320]), np.array([0.5, 0.5]))
    assert first is not None and cache.solves == 1
    assert cache.plan(np.array([470, 320]), np.array([0.51, 0.49])) is first
    assert cache.solves == 1
    moved = cache.plan(np.array([470, 320]), np.array([0.8, 0.2]))
    assert moved is not first and cache.solves == 2
    assert cache.plan(np.array([1000]), np.array([1.0])) is None  # no shares: no plan


def workload(*shapes: tuple[PodShape, float]) -> Workload:
    return Workload.from_counts(dict(shapes), coverage=1.0)


def test_kelvin_opens_a_gpu_instead_of_ruining_a_pairing() -> None:
    # Node "pair" holds a lone 0.47 (0.53 free); node "fresh" is empty. FGD puts a 0.32 next to the 0.47 (less
    # fragmented now); the plan keeps that gap for the next 0.47 and opens a fresh GPU.
    fleet = build_arrays([node("pair", [470, 1000]), node("fresh", [0, 1000])])
    w = workload((S470, 2), (S320, 1), (S650, 1), (WHOLE, 4))
    req = GpuRequest(count=1, milli=320, cpu_milli=4000)
    idx = np.array([0, 1])
    kelvin = FragmentationPolicy.create(FragmentationArgs(stranding_weight=0))
    fgd = FgdPolicy.create(FragmentationArgs())
    no_plan = FragmentationPolicy.create(FragmentationArgs(packing_plan=False, stranding_weight=0))
    ctx = CycleContext(now=0.0, state=CycleState({WORKLOAD_KEY: w}))
    assert np.argmax(fgd.score(req, fleet, idx, ctx)) == 0
    assert np.argmax(no_plan.score(req, fleet, idx, ctx)) == 0
    assert np.argmax(kelvin.score(req, fleet, idx, ctx)) == 1
    # ... and inside a node the plan picks the 0.65 GPU's gap, not the 0.47 one.
    mixed = build_arrays([node("mixed", [470, 650])])
    assert kelvin.pick(req, mixed, 0, ctx) == (1,)


def test_stranded_gpu_is_what_the_free_cpu_cannot_feed() -> None:
    # 10 millicores per thousandth: 4,000 free millicores feed 400 thousandths of GPU.
    out = stranded(np.array([1000, 300, 1000, 0]), np.array([4000, 4000, -5, 100_000]), 10.0)
    assert out.tolist() == [600.0, 0.0, 1000.0, 0.0]
    assert stranded(np.array([1000]), np.array([0]), 0.0).tolist() == [0.0]


def test_cpu_hungry_pods_go_where_cpu_is_plentiful() -> None:
    # Two identical 2-GPU nodes, one CPU-poor (16 cores) and one CPU-rich (96 cores). The workload asks 7 cores per
    # GPU. A CPU-only pod of 8 cores leaves the poor node 8 cores: each GPU shape still fits (FGD sees nothing), but
    # only one of its two GPUs can ever be fed.
    fleet = build_arrays([node("poor", [0, 0], cpu=16_000), node("rich", [0, 0], cpu=96_000)])
    w = workload((WHOLE, 3), (PodShape(6000, 1000, 1, None), 3), (PodShape(8000, 0, 0, None), 1))
    ctx = CycleContext(now=0.0, state=CycleState({WORKLOAD_KEY: w}))
    req = GpuRequest(count=0, cpu_milli=8000)
    pl = placements(req, fleet, np.array([0, 1]), w, ctx, memory_aware=True)
    change = stranding_change(req, pl, w)
    assert change[0] > 0 and change[1] == 0
    kelvin = FragmentationPolicy.create(FragmentationArgs())
    fgd_like = FragmentationPolicy.create(FragmentationArgs(stranding_weight=0, packing_plan=False))
    raw = kelvin.score(req, fleet, np.array([0, 1]), ctx)
    assert raw[1] > raw[0]
    flat = fgd_like.score(req, fleet, np.array([0, 1]), ctx)
    assert flat[0] == flat[1]  # FGD's cliff measure sees no difference yet


def test_fgd_baseline_ignores_plan_and_stranding() -> None:
    fleet = build_arrays([node("pair", [470, 1000]), node("fresh", [0, 1000])])
    w = workload((S470, 2), (S320, 1), (S650, 1), (WHOLE, 4))
    ctx = CycleContext(now=0.0, state=CycleState({WORKLOAD_KEY: w}))
    req = GpuRequest(count=1, milli=320, cpu_milli=4000)
    fgd = FgdPolicy.create(FragmentationArgs())
    raw = fgd.score(req, fleet, np.array([0, 1]), ctx)
    pl = placements(req, fleet, np.array([0, 1]), w, ctx)
    best = [max(fragmentation.fgd_value(pl.delta[pl.pos == i])) for i in (0, 1)]
    assert raw.tolist() == best


def test_bad_args_name_the_field() -> None:
    from scheduler_plugin.policies.plugins import PRODUCTION
    from scheduler_plugin.policies.registry import PolicyConfigError

    with pytest.raises(PolicyConfigError, match="strandingWeight"):
        PRODUCTION.build("score", "fragmentation", {"strandingWeight": -1}, "scoring.fragmentation.args")
    with pytest.raises(PolicyConfigError, match="replanDrift"):
        PRODUCTION.build("score", "fragmentation", {"replanDrift": 0}, "scoring.fragmentation.args")


def test_explain_names_the_plan_and_the_stranding() -> None:
    # 12 cores feed ~1,180 of the 1,530 free thousandths at the workload's ~10 millicores per thousandth.
    fleet = build_arrays([node("pair", [470, 0], cpu=12_000)])
    w = workload((S470, 2), (S320, 1), (S650, 1), (WHOLE, 4))
    ctx = CycleContext(now=0.0, state=CycleState({WORKLOAD_KEY: w}))
    lines = FragmentationPolicy.create(FragmentationArgs()).explain(
        GpuRequest(count=1, milli=320, cpu_milli=4000), fleet, 0, ctx
    )
    text = "\n".join(lines)
    assert "packing plan: part of the optimal packing" in text  # the fresh GPU, not the 0.47's gap
    assert "best placement (GPU 1)" in text
    assert "more GPU left without CPU to feed it" in text


def test_a_failed_solve_is_logged_not_retried_and_scores_fall_back_to_fgd(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import scipy.optimize

    class Failed:
        status = 2
        message = "infeasible (injected)"
        eqlin = None
        fun = 0.0

    calls = []

    def failing(*args: object, **kwargs: object) -> Failed:
        calls.append(1)
        return Failed()

    monkeypatch.setattr(scipy.optimize, "linprog", failing)
    # other tests (the operator's, the CLI's) configure logging; make sure this logger reaches caplog
    import logging

    name = "scheduler_plugin.policies.packing"
    monkeypatch.setattr(logging.getLogger(name), "disabled", False)
    monkeypatch.setattr(logging.getLogger(name), "propagate", True)
    cache = PlanCache()
    with caplog.at_level("WARNING", logger=name):
        assert cache.plan(np.array([470, 320]), np.array([0.5, 0.5])) is None
    assert "LP not solved" in caplog.text and "injected" in caplog.text
    assert cache.plan(np.array([470, 320]), np.array([0.5, 0.5])) is None
    assert len(calls) == 1  # the same distribution is not solved again
    # Without a plan, kelvin's score is FGD's measure plus stranding: it still ranks, it does not fail.
    fleet = build_arrays([node("pair", [470, 1000]), node("fresh", [0, 1000])])
    w = workload((S470, 2), (S320, 1), (S650, 1), (WHOLE, 4))
    kelvin = FragmentationPolicy.create(FragmentationArgs(stranding_weight=0))
    no_plan = FragmentationPolicy.create(FragmentationArgs(stranding_weight=0, packing_plan=False))
    ctx = CycleContext(now=0.0, state=CycleState({WORKLOAD_KEY: w}))
    req = GpuRequest(count=1, milli=320, cpu_milli=4000)
    idx = np.array([0, 1])
    assert kelvin.score(req, fleet, idx, ctx).tolist() == no_plan.score(req, fleet, idx, ctx).tolist()


def test_without_a_cpu_surplus_cpu_only_pods_are_not_steered_by_stranding_either() -> None:
    # The fleet's free CPU (8 + 20 cores) only just feeds its 4 free GPUs at the workload's 7 millicores per
    # thousandth: every node strands whatever a CPU-only pod takes, so the stranding term is off for it too (as for
    # GPU pods) and the pod is ranked by FGD's measure alone. Kept on, it spread CPU-only pods over the CPU-rich nodes
    # until every node was just short of CPU (0.8 point more GPUs unallocated at 2.5x the trace's CPU-only demand).
    fleet = build_arrays([node("poor", [0, 0], cpu=8_000), node("rich", [0, 0], cpu=20_000)])
    w = workload((WHOLE, 3), (PodShape(6000, 1000, 1, None), 3), (PodShape(8000, 0, 0, None), 1))
    ctx = CycleContext(now=0.0, state=CycleState({WORKLOAD_KEY: w}))
    req = GpuRequest(count=0, cpu_milli=4000)
    pl = placements(req, fleet, np.array([0, 1]), w, ctx, memory_aware=True)
    assert stranding_change(req, pl, w).tolist()[0] > 0  # the term alone would prefer the rich node
    kelvin = FragmentationPolicy.create(FragmentationArgs())
    fgd_like = FragmentationPolicy.create(FragmentationArgs(stranding_weight=0, packing_plan=False))
    rows = np.array([0, 1])
    assert kelvin.score(req, fleet, rows, ctx).tolist() == fgd_like.score(req, fleet, rows, ctx).tolist()


def test_the_cpu_surplus_counts_the_cpu_only_pods_that_arrive_with_the_gpu_demand() -> None:
    # 64 free cores, 4 free GPUs. The GPU pods ask 6 millicores per thousandth of GPU: 24 cores feed the free GPUs, so
    # against them alone the fleet looks CPU-rich (167 % surplus: the full stranding weight). But for every GPU pod a
    # 12-core CPU-only pod arrives: filling the free GPU brings 4 x (6 + 12) = 72 cores of demand, more than is free.
    # Counting only the GPU pods, the term stayed on at full weight while the CPU-only pods used up the CPU (CPU-only
    # demand 2.5x the trace's, 1/4 scale, seeds 42-44: 11.42 % of GPUs unallocated, fgd 10.70; 10.42 counting them).
    fleet = build_arrays([node("poor", [0, 0], cpu=16_000), node("rich", [0, 0], cpu=48_000)])
    w = workload((PodShape(6000, 1000, 1, None), 1), (PodShape(12_000, 0, 0, None), 1))
    assert w.cpu_per_milli == pytest.approx(6.0)
    assert w.cpu_only_per_milli == pytest.approx(12.0)
    assert fragmentation.cpu_surplus_factor(fleet, w, 0.5) == 0.0
    priced = w.priced(np.array([3.0, 1.0]))  # pricing by scarcity changes what F charges, not the arriving mix
    assert (priced.cpu_per_milli, priced.cpu_only_per_milli) == (w.cpu_per_milli, w.cpu_only_per_milli)
    assert fragmentation.cpu_surplus_factor(fleet, priced, 0.5) == 0.0
    # Half as many CPU-only pods: 4 x (6 + 6) = 48 cores needed, 64 free: a 33 % surplus, two thirds of the weight.
    lighter = workload((PodShape(6000, 1000, 1, None), 2), (PodShape(12_000, 0, 0, None), 1))
    assert fragmentation.cpu_surplus_factor(fleet, lighter, 0.5) == pytest.approx((64 / 48 - 1) / 0.5)
    # Without CPU-only shapes the need is the GPU pods' alone, as before.
    gpu_only = workload((PodShape(6000, 1000, 1, None), 1))
    assert gpu_only.cpu_only_per_milli == 0.0
    assert fragmentation.cpu_surplus_factor(fleet, gpu_only, 0.5) == 1.0


def test_stranding_never_credits_using_up_a_cpu_poor_nodes_gpus() -> None:
    # An empty 8-GPU node short of CPU (24 cores, the workload needs ~4.4 per GPU) and a half-used CPU-rich one. A
    # CPU-light 1-GPU pod on the poor node lowers its stranded GPU; credited (4x dF's scale) that outbid dF, which
    # knows the 8-GPU pods of the workload need that empty node. Only an increase counts now.
    fleet = build_arrays([node("poor", [0] * 8, cpu=24_000), node("rich", [1000] * 4 + [0] * 4, cpu=96_000)])
    w = workload((WHOLE, 3), (PodShape(20_000, 1000, 8, None), 1), (PodShape(6000, 1000, 1, None), 3))
    ctx = CycleContext(now=0.0, state=CycleState({WORKLOAD_KEY: w}))
    req = GpuRequest(count=1, cpu_milli=1000)
    rows = np.array([0, 1])
    pl = placements(req, fleet, rows, w, ctx, memory_aware=True)
    assert stranding_change(req, pl, w)[0] < 0  # the poor node strands less after it
    assert fragmentation.stranding_penalty(req, pl, w).tolist() == [0.0, 0.0]
    kelvin = FragmentationPolicy.create(FragmentationArgs())
    assert np.argmax(kelvin.score(req, fleet, rows, ctx)) == 1  # keeps the empty node whole, as dF says
