"""The framework: filters in order, weighted scores, the ledger overlay, picking and explaining."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace

import numpy as np
import pytest

from scheduler_plugin.model import FleetArrays, GpuAssignment, GpuNode, GpuRequest
from scheduler_plugin.model.claim import claim_of
from scheduler_plugin.policies import Framework, PolicyConfig
from scheduler_plugin.policies.registry import PolicyConfigError
from tests.fleet_helpers import NOW, dgx, fleet, gpu, node, nvlink_pairs, pcie_box, request, whole


def framework(scoring: dict[str, object] | None = None, **extra: object) -> Framework:
    data: dict[str, object] = {
        "scoring": scoring if scoring is not None else {"topology": {}, "thermal": {}, "noise": {}, "burst": {}},
        "picker": "topology",
        **extra,
    }
    return Framework.from_config(PolicyConfig.from_mapping(data))


def all_rows(f: FleetArrays) -> np.ndarray:
    return np.arange(f.n_nodes, dtype=np.int64)


def test_filter_outcome_names_each_rejected_row() -> None:
    fw = framework()
    f = fleet(
        dgx("ok"),
        node("stale", [gpu(0)], observed_at=NOW - 100),
        pcie_box("busy", assignments=[whole("x", *range(8))]),
        node("t4", [gpu(0, model="T4", mem_gib=16)]),
    )
    ctx = fw.context(f, NOW)
    out = fw.filter(request(1, models="A100"), f, all_rows(f), ctx)
    assert out.passed.tolist() == [0]
    assert out.rejected[1].reason == "stale telemetry (older than 30 s: telemetry.maxAgeSeconds)"
    assert out.rejected[2].reason == "0 of 8 usable GPUs are free; the pod needs 1 whole GPU"
    assert not out.rejected[2].unresolvable
    assert out.rejected[3].reason == "needs 1 GPU of model A100; node has 1 T4"
    assert out.rejected[3].unresolvable


def test_stale_allowed() -> None:
    fw = framework(telemetry={"onStale": "allow"})
    f = fleet(node("stale", [gpu(0)], observed_at=None))
    assert fw.filter(request(1), f, all_rows(f), fw.context(f, NOW)).passed.tolist() == [0]


def test_pods_without_gpu_pass_every_filter_and_score_zero_without_cpu_only_ranking() -> None:
    fw = framework(cpuOnly={"fragmentationWeight": 0, "packWeight": 0})
    assert fw.cpu_only == ()
    f = fleet(node("cpu", [], observed_at=None), dgx("g"))
    ctx = fw.context(f, NOW)
    out = fw.filter(request(0), f, all_rows(f), ctx)
    assert out.passed.tolist() == [0, 1]
    assert out.rejected == {}
    ints, _ = fw.prioritize(request(0), f, out.passed, ctx)
    assert ints.tolist() == [0, 0]
    assert fw.pick(request(0), f, 1, ctx) == ()


def cpu_pod(cores: float) -> GpuRequest:
    return replace(request(0), cpu_milli=int(cores * 1000))


def test_pods_without_gpu_are_ranked_by_best_fit_of_cpu_and_gpu() -> None:
    """Pack only: the node the pod leaves with the least free CPU and GPU wins; a node with free GPUs loses to an
    equally busy one whose GPUs are taken (the pod would take CPU its free GPUs need)."""
    fw = framework(cpuOnly={"fragmentationWeight": 0, "packWeight": 1})
    assert [ws.name for ws in fw.cpu_only] == ["pack"]
    busy = [whole(f"x{i}", i) for i in range(8)]
    f = fleet(
        replace(dgx("free-gpus"), cpu_requested_milli=48_000),
        replace(dgx("gpus-taken", assignments=busy), cpu_requested_milli=48_000),
        replace(dgx("idle", assignments=busy), cpu_requested_milli=0),
    )
    ctx = fw.context(f, NOW)
    ints, combined = fw.prioritize(cpu_pod(8), f, all_rows(f), ctx)
    assert int(np.argmax(combined)) == 1, combined
    # left free: 8 cores + 8 GPUs, 8 cores, 56 cores -> 0.531, 0.031, 0.219 of a 128-core, 8-GPU node
    assert ints.tolist() == [0, 10, 6], combined
    why = fw.explain(cpu_pod(8), f, 1, ctx, all_rows(f))
    assert [v.policy for v in why.scores] == ["pack"]
    assert "leaves 8 cores and 0 GPUs free" in why.scores[0].reasons[0], why.scores[0].reasons


def test_the_default_cpu_only_ranking_blends_fragmentation_with_best_fit() -> None:
    fw = Framework.from_config(PolicyConfig())
    assert [(ws.name, ws.weight) for ws in fw.cpu_only] == [("fragmentation", 0.8), ("pack", 0.2)]
    frag = next(ws.plugin for ws in fw.scorers if ws.name == "fragmentation")
    assert fw.cpu_only[0].plugin is frag  # one plugin: one learned workload
    # without fragmentation in scoring, only best fit ranks them
    fw = framework({"thermal": {}})
    assert [ws.name for ws in fw.cpu_only] == ["pack"]


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"packWeight": -1}, "cpuOnly.packWeight: Input should be greater than or equal to 0"),
        ({"cpuScaleCores": 0}, "cpuOnly.cpuScaleCores: Input should be greater than 0"),
        ({"packweight": 1}, "cpuOnly.packweight"),
    ],
)
def test_a_bad_cpu_only_section_is_refused_naming_the_field(section: dict[str, object], problem: str) -> None:
    with pytest.raises(PolicyConfigError) as err:
        PolicyConfig.from_mapping({"cpuOnly": section})
    assert problem in str(err.value), err.value


def test_weighted_mean_and_rounding() -> None:
    # thermal 77 °C -> 4.0 points (weight 3); burst untouched -> 10 points (weight 1): (12 + 10) / 4 = 5.5 -> 6
    fw = framework({"thermal": {"weight": 3}, "burst": {"weight": 1}, "noise": {"weight": 0}})
    f = fleet(node("a", [gpu(0, temp=77)]), node("b", [gpu(0, temp=50)]))
    ints, comb = fw.prioritize(request(1), f, all_rows(f), fw.context(f, NOW))
    assert comb.tolist() == [5.5, 10.0]
    assert ints.tolist() == [6, 10]
    assert [ws.name for ws in fw.scorers] == ["thermal", "burst"]  # weight 0 is off


def test_all_weights_zero_scores_zero() -> None:
    fw = framework({"thermal": {"weight": 0}})
    f = fleet(dgx("a"))
    ints, _ = fw.prioritize(request(1), f, all_rows(f), fw.context(f, NOW))
    assert ints.tolist() == [0]


def test_multi_gpu_prefers_nvlink_and_picks_connected_set() -> None:
    fw = framework({"topology": {"weight": 1}})
    f = fleet(pcie_box("pcie"), nvlink_pairs("pairs"), dgx("dgx"))
    ctx = fw.context(f, NOW)
    ints, _ = fw.prioritize(request(4), f, all_rows(f), ctx)
    assert ints[2] == 10
    assert ints[2] > ints[1] >= ints[0]
    assert fw.pick(request(4), f, 2, ctx) == (0, 1, 2, 3)
    assert fw.pick(request(9), f, 2, ctx) is None


def test_ledger_overlay_and_burst_spread_a_burst() -> None:
    fw = framework({"burst": {"weight": 1}, "thermal": {"weight": 1}}, telemetry={"maxAgeSeconds": 120})
    f = fleet(node("a", [gpu(0), gpu(1)]), node("b", [gpu(0), gpu(1)]))
    ctx = fw.context(f, NOW)
    ints, combined = fw.prioritize(request(1), f, all_rows(f), ctx)
    assert combined[0] == combined[1] and sorted(ints.tolist()) == [9, 10]  # equal nodes: one first, by name order
    fw.assume("a", request(1, pod="p1"), [0], NOW)
    ctx = fw.context(f, NOW + 1)
    ints, _ = fw.prioritize(request(1), f, all_rows(f), ctx)
    assert ints[0] < ints[1]
    fw.assume("a", request(1, pod="p2"), [1], NOW + 1)
    ctx = fw.context(f, NOW + 2)
    out = fw.filter(request(1), f, all_rows(f), ctx)
    assert out.passed.tolist() == [1]
    assert out.rejected[0].reason == "0 of 2 usable GPUs are free; the pod needs 1 whole GPU"
    assert fw.pick(request(1), f, 0, ctx) is None
    # after the TTL (30 s) the assumed pods are gone again
    ctx = fw.context(f, NOW + 40)
    assert fw.filter(request(1), f, all_rows(f), ctx).passed.tolist() == [0, 1]


def test_explain_is_json_and_complete() -> None:
    fw = framework()
    f = fleet(nvlink_pairs("a", assignments=[whole("x", 0)]), dgx("b"), node("hot", [gpu(0, temp=95)]))
    ctx = fw.context(f, NOW)
    ex = fw.explain(request(2), f, 0, ctx, candidates=all_rows(f))
    d = json.loads(json.dumps(ex.to_dict()))
    assert d["fits"] is True
    assert d["node"] == "a"
    assert [s["policy"] for s in d["scores"]] == ["topology", "thermal", "noise", "burst"]
    assert all(0 <= s["normalized"] <= 10 and s["reasons"] for s in d["scores"])
    assert d["gpus"] == [2, 3]
    assert d["candidates"] == 2
    ints, _ = fw.prioritize(request(2), f, np.array([0, 1]), ctx)
    assert d["score"] == int(ints[0])
    assert len(d["gpu_details"]) == 8
    rejected = fw.explain(request(1), f, 2, ctx).to_dict()
    assert rejected["fits"] is False
    assert rejected["filters"][1]["reason"].startswith("gpu 0 is at 95 °C, at or above its slowdown threshold 87 °C")
    assert rejected["filters"][1]["unresolvable"] is True
    assert rejected["score"] is None


@pytest.mark.parametrize("n_nodes", [1, 7, 40])
def test_prioritize_is_per_row_and_order_independent(n_nodes: int) -> None:
    rng = np.random.default_rng(n_nodes)
    nodes: list[GpuNode] = [
        dgx(f"n{i}", temp=float(rng.uniform(40, 85)), util=float(rng.uniform(0, 1))) for i in range(n_nodes)
    ]
    fw = framework()
    f = fleet(*nodes)
    ctx = fw.context(f, NOW)
    rows = all_rows(f)
    ints, comb = fw.prioritize(request(1), f, rows, ctx)
    perm = rng.permutation(rows)
    _, comb_p = fw.prioritize(request(1), f, perm, fw.context(f, NOW))
    assert np.allclose(comb_p, comb[perm])
    assert ints.min() >= 0
    assert ints.max() <= 10


def test_overlay_is_applied_once_in_explain() -> None:
    fw = framework({"thermal": {"weight": 1}})
    f = fleet(node("a", [gpu(0)]))
    fw.assume("a", request(1, share=300, pod="p1"), [0], NOW)
    ctx = fw.context(f, NOW + 1)
    ex = fw.explain(request(1, share=600), f, 0, ctx, candidates=all_rows(f))
    assert ex.fits  # 700 thousandths are left once; subtracting the assumed pod twice would leave 400
    assert ex.gpus == [0]
    assert ex.gpu_details[0].startswith("gpu 0 (A100, 80.0 GiB): 56.0 GiB and 70% free")
    assert fw.filter(request(1, share=700), f, all_rows(f), ctx).passed.tolist() == [0]
    assert fw.filter(request(1, share=701), f, all_rows(f), ctx).passed.tolist() == []


def test_the_picker_judges_by_the_workload_the_scorer_learns() -> None:
    from scheduler_plugin.policies.fragmentation import FragmentationPolicy

    fw = Framework.from_config(PolicyConfig())
    scorer = next(ws.plugin for ws in fw.scorers if ws.name == "fragmentation")
    assert isinstance(scorer, FragmentationPolicy) and isinstance(fw.picker, FragmentationPolicy)
    assert fw.picker.estimator is scorer.estimator
    # picking never learns; what the shared estimator learned (Framework.observe, at filter) is what it picks by
    before = fw.picker.estimator.observed
    for i in range(300):  # outweigh the default mix's 200 pseudo-pods
        scorer.estimator.observe(GpuRequest(count=1, milli=470, cpu_milli=8000, pod_key=f"ns/p{i}"))
    assert fw.picker.estimator.observed == before + 300
    assert 470 in fw.picker.estimator.workload().milli.tolist()
    # estimators that learn differently stay apart
    other = Framework.from_config(PolicyConfig.from_mapping({"pickerArgs": {"halfLifePods": 50}}))
    other_scorer = next(ws.plugin for ws in other.scorers if ws.name == "fragmentation")
    assert other.picker.estimator is not other_scorer.estimator  # type: ignore[attr-defined]


def test_warm_solves_the_packing_plan_off_the_request_path() -> None:
    from scheduler_plugin.policies.fragmentation import FragmentationPolicy

    fw = Framework.from_config(PolicyConfig())
    scorer = next(ws.plugin for ws in fw.scorers if ws.name == "fragmentation")
    assert isinstance(scorer, FragmentationPolicy) and fw.picker.plans is scorer.plans  # type: ignore[attr-defined]
    f = fleet(dgx("n1"), dgx("n2"))
    fw.warm(f)
    solved = scorer.plans.solves
    assert solved == 1  # the default mix has shares: planned once
    req = GpuRequest(count=1, milli=250, cpu_milli=1000, pod_key="ns/x")
    ctx = fw.context(f, NOW)
    fw.prioritize(req, f, np.arange(f.n_nodes), ctx)
    assert scorer.plans.solves == solved  # scoring used the warmed plan
    for i in range(400):  # the mix moves: the next warm re-solves, not a request
        scorer.estimator.observe(GpuRequest(count=1, milli=470, cpu_milli=8000, pod_key=f"ns/p{i}"))
    fw.warm(f)
    assert scorer.plans.solves == solved + 1


def test_scoring_picking_and_explaining_only_read_the_learned_workload() -> None:
    """Issue 15: the fragmentation score learned each pod it scored, so one ``explain`` changed production state."""
    from scheduler_plugin.policies.fragmentation import FragmentationPolicy

    fw = Framework.from_config(PolicyConfig())
    scorer = next(ws.plugin for ws in fw.scorers if ws.name == "fragmentation")
    assert isinstance(scorer, FragmentationPolicy)
    f = fleet(dgx("n1"), dgx("n2"))
    req = GpuRequest(count=1, milli=470, cpu_milli=8000, pod_key="ns/p", pod_uid="u-p")
    ctx = fw.context(f, NOW)
    ex = fw.explain(req, f, 0, ctx, candidates=all_rows(f))
    assert ex.fits and any(s.policy == "fragmentation" and s.reasons for s in ex.scores)
    fw.filter(req, f, all_rows(f), ctx)
    fw.prioritize(req, f, all_rows(f), ctx)
    assert fw.pick(req, f, 0, ctx) is not None
    assert scorer.estimator.observed == 0  # before: 1 after the explain
    fw.observe(req)
    assert scorer.estimator.observed == 1


def test_observe_learns_a_pod_once_in_every_estimator() -> None:
    """Two fragmentation scores and a picker that learns apart: each estimator counts the pod once, retries too."""
    from scheduler_plugin.policies.fragmentation import FragmentationBase

    cfg = {"scoring": {"fragmentation": {}, "fgd": {}}, "pickerArgs": {"halfLifePods": 50}}
    fw = Framework.from_config(PolicyConfig.from_mapping(cfg))
    plugins = [*(ws.plugin for ws in fw.scorers), fw.picker]
    estimators = {id(p.estimator): p.estimator for p in plugins if isinstance(p, FragmentationBase)}
    assert len(estimators) == 3
    for _ in range(5):  # the scheduler retrying the pod: filtered five times
        fw.observe(GpuRequest(count=2, cpu_milli=16000, pod_key="ns/p", pod_uid="u-p"))
    assert [e.observed for e in estimators.values()] == [1, 1, 1]
    assert all(2 in e.workload().count.tolist() for e in estimators.values())


def test_the_ledger_overlay_charges_only_the_new_binds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bind after bind on one snapshot, the overlay charges the new pod's node only, and is the same as a full
    rebuild; a pod gone from the ledger recharges its own node only (here: nothing left on it to charge)."""
    charged: list[int] = []
    real = FleetArrays.charge

    def counting(self: FleetArrays, claims: Iterable[tuple[int, GpuAssignment]], sign: int = 1) -> int:
        listed = list(claims)
        charged.append(len(listed))
        return real(self, listed, sign)

    monkeypatch.setattr(FleetArrays, "charge", counting)
    fw = framework()
    f = fleet(dgx("a"), dgx("b"), node("c", [gpu(0), gpu(1, mem_gib=40)]))
    assert fw.ledger is not None
    binds = [
        ("a", request(1, pod="p1"), [0]),
        ("b", request(2, pod="p2"), [1, 2]),
        ("c", request(1, pod="p3", memory="10Gi"), [1]),
    ]
    for i, (n, req, gpus) in enumerate(binds):
        fw.assume(n, req, gpus, NOW + i)
        view = fw.view(f, fw.context(f, NOW + i))
        full = f.with_assumed(fw.ledger.entries(NOW + i))
        for col in ("free_milli", "free_mem", "assigned_milli", "assigned_mem", "tenants"):
            assert np.array_equal(getattr(view, col), getattr(full, col)), col
    assert charged[: 2 * len(binds) : 2] == [1, 1, 1]  # the view's charges (each followed by the check's full one)
    fw.ledger.forget("default/p2")
    charged.clear()
    view = fw.view(f, fw.context(f, NOW + 5))
    assert charged == [0]  # node b recharged from its (now empty) list; a and c untouched
    full = f.with_assumed(fw.ledger.entries(NOW + 5))
    for col in ("free_milli", "free_mem", "assigned_milli", "assigned_mem", "tenants"):
        assert np.array_equal(getattr(view, col), getattr(full, col)), col


def test_the_ledger_overlay_is_a_full_rebuild_after_any_changes() -> None:
    """Binds (several pods on one GPU, more than it holds: the clamp), re-binds elsewhere, forgets and TTL expiries in
    any order: the cached overlay always holds the arrays a rebuild from the ledger's entries gives, also when it
    fell further behind than the ledger's change log."""
    rng = np.random.default_rng(21)
    fw = framework()
    assert fw.ledger is not None
    names = ["a", "b", "c", "d"]
    f = fleet(*(dgx(n) for n in names), node("e", [gpu(0), gpu(1, mem_gib=40)]))
    t = NOW
    for step in range(250):
        t += float(rng.uniform(0, 4))
        pod = f"p{int(rng.integers(0, 25))}"
        if rng.uniform() < 0.75:
            n = str(rng.choice([*names, "e"]))
            shared = rng.uniform() < 0.5
            req = request(1, pod=pod, memory="30Gi") if shared else request(int(rng.integers(1, 3)), pod=pod)
            gpus = sorted(rng.choice(2 if n == "e" else 8, size=req.count, replace=False).tolist())
            fw.assume(n, req, gpus, t)
        else:
            fw.ledger.forget(f"default/{pod}")
        if step == 200:  # fall behind the change log: the next view rebuilds whole
            for i in range(fw.ledger.CHANGE_LOG):
                fw.ledger.assume("a", claim_of(request(1, pod=f"flood{i % 3}"), [0]), t)
        view = fw.view(f, fw.context(f, t))
        full = f.with_assumed(fw.ledger.entries(t))
        for col in ("free_milli", "free_mem", "assigned_milli", "assigned_mem", "tenants"):
            assert np.array_equal(getattr(view, col), getattr(full, col)), (step, col)
