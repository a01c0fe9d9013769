"""Straggler remediation as a gang, over real HTTP against a fake Kubernetes API (kmock): a member of a running gang
on a hot node gets its whole gang checkpointed and evicted (never that one member alone); an elastic gang loses
only the straggler; a protected member keeps the gang whole; a gang move counts as one eviction in the limits."""

from __future__ import annotations

from typing import Any

import kmock as km
import pytest
from kelvin_operator.k8s import OperatorKube
from kelvin_operator.metrics import OperatorMetrics
from kelvin_operator.pods import pod_view
from kelvin_operator.reconcile import NodeResult, Reconciler
from kelvin_operator.settings import OperatorConfig, ThermalEvictionConfig
from kelvin_operator.stragglers import MemberWork, gang_move_pays, gang_moves, gang_of
from kelvin_operator.strategies import Candidate, Reason, thermal
from opkit import T0, gpu, node, node_obj, pod, proc
from opkube import EVENTS, PODS, evictions_succeed

from scheduler_plugin.hotness import observe
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.gpu import GpuNode
from scheduler_plugin.model.times import format_time
from scheduler_plugin.thermal_eviction import judge

CFG = OperatorConfig(
    limits={"max_per_node_per_cycle": 1, "max_per_namespace": 2, "max_total": 10, "window_s": 600},
    protection={"min_pod_age_s": 60},
    # the eviction mechanics of a gang move: every pod on a hot node's warm GPU is a thermal candidate (rule pays,
    # the default, is tested with a throttling GPU in test_a_throttling_member_moves_its_gang_under_the_default_rule)
    thermal_eviction={"rule": "warm"},
)
GANG_KEY = "ml/kelvin:train"


def member(i: int, node_name: str, size: int = 2, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    anns = {ann.GANG: "train", ann.GANG_SIZE: str(size), ann.GANG_INDEX: str(i), ann.CHECKPOINT: "true"}
    anns.update(annotations or {})
    return pod(f"train-{i}", node=node_name, gpu_indices="0", annotations=anns)


def hot(name: str, owner: str, now: float = T0) -> GpuNode:
    """``name`` with its GPU 0 at 90 °C, used by ``owner``."""
    return node(name, gpu(0, 90.0, procs=(proc(owner, 10),)), now=now)


def seed(kmock: km.KubernetesEmulator, pods: list[dict[str, Any]], nodes: tuple[str, ...] = ("n1", "n2")) -> None:
    for n in nodes:
        kmock.objects[km.resource("", "v1", "nodes"), None, n] = node_obj(n)
    for p in pods:
        kmock.objects[PODS, p["metadata"]["namespace"], p["metadata"]["name"]] = p


async def cycle(rec: Reconciler, kube: OperatorKube, gnode: GpuNode, now: float) -> NodeResult:
    """The kopf timer's call: this node's pods and the gang index (every member's pod, from the API)."""
    node_json = await kube.client.get(f"/api/v1/nodes/{gnode.name}")
    every = (await kube.client.get("/api/v1/pods"))["items"]
    here = [p for p in every if p["spec"].get("nodeName") == gnode.name]
    index = {GANG_KEY: [p for p in every if (p["metadata"].get("annotations") or {}).get(ann.GANG) == "train"]}
    return await rec.reconcile_node(node_json, gnode, here, now, index)


def events(kmock: km.KubernetesEmulator) -> list[tuple[str, str]]:
    return [
        (r.data["involvedObject"]["name"], r.data["reason"])
        for r in kmock
        if r.method.value == "POST" and r.resource == EVENTS
    ]


def evicted(kmock: km.KubernetesEmulator) -> list[str]:
    return sorted(str(r.url.path).split("/")[-2] for r in kmock["post", PODS])


def metric(m: OperatorMetrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


async def test_a_straggler_gets_its_whole_gang_checkpointed_then_evicted(
    kmock: km.KubernetesEmulator, kube: OperatorKube
) -> None:
    evictions_succeed(kmock)
    seed(kmock, [member(0, "n1"), member(1, "n2")])
    rec = Reconciler(CFG, kube)
    res = await cycle(rec, kube, hot("n1", "train-0"), T0)
    # every member is asked to checkpoint, the straggler's peer on the cool node n2 too; nothing is evicted yet
    assert sorted((o.pod, o.result) for o in res.outcomes) == [
        ("ml/train-0", "checkpoint_requested"),
        ("ml/train-1", "checkpoint_requested"),
    ]
    for name in ("train-0", "train-1"):
        assert kmock.objects[PODS, "ml", name]["metadata"]["annotations"][ann.CHECKPOINT_REQUESTED] == format_time(T0)
    assert evicted(kmock) == []
    assert [m.gang for m in res.moves] == [GANG_KEY]
    # one member answers: the gang waits for the other
    await kube.annotate_pod("ml", "train-0", {ann.CHECKPOINT_DONE: format_time(T0 + 20)})
    res = await cycle(rec, kube, hot("n1", "train-0", T0 + 30), T0 + 30)
    assert [(o.pod, o.result) for o in res.outcomes] == [("ml/train-1", "checkpoint_pending")]
    assert evicted(kmock) == []
    await kube.annotate_pod("ml", "train-1", {ann.CHECKPOINT_DONE: format_time(T0 + 40)})
    res = await cycle(rec, kube, hot("n1", "train-0", T0 + 60), T0 + 60)
    assert sorted((o.pod, o.result) for o in res.outcomes) == [("ml/train-0", "evicted"), ("ml/train-1", "evicted")]
    assert evicted(kmock) == ["train-0", "train-1"] and not kmock["delete"]
    assert ("train-0", "GangEvicted") in events(kmock)
    assert ("train-0", "KelvinEvicted") in events(kmock) and ("train-1", "KelvinEvicted") in events(kmock)
    assert metric(rec.metrics, "kelvin_operator_gang_moves_total", result="evicted") == 1
    assert metric(rec.metrics, "kelvin_operator_gang_moves_total", result="checkpoint_pending") == 2


async def test_an_elastic_gang_loses_only_the_straggler(kmock: km.KubernetesEmulator, kube: OperatorKube) -> None:
    evictions_succeed(kmock)
    elastic = {ann.GANG_ELASTIC: "true", ann.CHECKPOINT: "false"}
    seed(kmock, [member(0, "n1", annotations=elastic), member(1, "n2", annotations=elastic)])
    rec = Reconciler(CFG, kube)
    res = await cycle(rec, kube, hot("n1", "train-0"), T0)
    assert [(o.pod, o.result) for o in res.outcomes] == [("ml/train-0", "evicted")]
    assert evicted(kmock) == ["train-0"] and res.moves == []


async def test_a_protected_member_keeps_the_gang_whole(kmock: km.KubernetesEmulator, kube: OperatorKube) -> None:
    evictions_succeed(kmock)
    seed(kmock, [member(0, "n1"), member(1, "n2", annotations={ann.EVICTABLE: "false"})])
    rec = Reconciler(CFG, kube)
    res = await cycle(rec, kube, hot("n1", "train-0"), T0)
    # the straggler itself is evictable, but evicting it alone would stop the gang anyway: nothing moves
    assert res.outcomes == [] and evicted(kmock) == []
    assert not any(ann.CHECKPOINT_REQUESTED in (p.get("metadata", {}).get("annotations") or {}) for p in _pods(kmock))
    assert metric(rec.metrics, "kelvin_operator_gang_moves_total", result="protected") == 1


def _pods(kmock: km.KubernetesEmulator) -> list[dict[str, Any]]:
    return [dict(kmock.objects[PODS, "ml", n]) for n in ("train-0", "train-1")]


async def test_a_gang_move_counts_as_one_eviction_and_dry_run_writes_nothing(
    kmock: km.KubernetesEmulator, kube: OperatorKube
) -> None:
    evictions_succeed(kmock)
    no_ckpt = {ann.CHECKPOINT: "false"}
    pods = [member(i, "n1" if i < 2 else "n2", size=4, annotations=no_ckpt) for i in range(4)]
    seed(kmock, pods)
    dry = OperatorConfig.model_validate({**CFG.model_dump(), "dry_run": True})
    rec = Reconciler(dry, kube)
    res = await cycle(rec, kube, hot("n1", "train-0"), T0)
    assert sorted(o.result for o in res.outcomes) == ["dry_run"] * 4 and evicted(kmock) == []
    assert sorted(n for n, r in events(kmock) if r == "KelvinDryRunEviction") == [f"train-{i}" for i in range(4)]
    # four members in one namespace, over the per-namespace limit of two: still one move, every member evicted
    rec = Reconciler(CFG, kube)
    res = await cycle(rec, kube, hot("n1", "train-0"), T0)
    assert sorted((o.pod, o.result) for o in res.outcomes) == [(f"ml/train-{i}", "evicted") for i in range(4)]
    assert rec.budget.used(T0) == 1


def test_jobset_members_are_one_move_and_pods_of_no_gang_stay_single() -> None:
    def js(name: str, node_name: str, index: int) -> dict[str, Any]:
        p = pod(name, node=node_name, gpu_indices="0")
        p["metadata"]["labels"] = {
            "jobset.sigs.k8s.io/jobset-name": "llm",
            "jobset.sigs.k8s.io/global-replicas": "2",
            "jobset.sigs.k8s.io/job-global-index": str(index),
        }
        return p

    a, b, plain = js("llm-0", "n1", 0), js("llm-1", "n2", 1), pod("plain", gpu_indices="0")
    views = {p["metadata"]["name"]: pod_view(p) for p in (a, b, plain)}
    cands = [Candidate(views[n], Reason.THERMAL, 1.0, "hot") for n in ("llm-0", "plain")]
    refs = {k: r for p in (a, plain) if (r := gang_of(p, CFG.gang)) is not None for k in [pod_view(p).key]}
    assert set(refs) == {"ml/llm-0"}  # the plain pod carries no gang marker
    singles, moves = gang_moves(cands, refs, {"ml/jobset:llm@0": [a, b]})
    assert [c.pod.key for c in singles] == ["ml/plain"]
    ((move,),) = [moves]
    assert move.gang == "ml/jobset:llm@0" and [m.key for m in move.members] == ["ml/llm-0", "ml/llm-1"]


async def test_a_throttling_member_moves_its_gang_under_the_default_rule(
    kmock: km.KubernetesEmulator, kube: OperatorKube
) -> None:
    """Rule pays (the default): a member on a thermally throttling GPU (clocks not reported: the assumed ratio) that
    checkpointed a minute ago moves its whole gang; the same node warm but not throttling moves nobody."""
    evictions_succeed(kmock)
    done = {ann.CHECKPOINT_DONE: format_time(T0 - 60)}
    seed(kmock, [member(0, "n1", annotations=done), member(1, "n2", annotations=done)])
    cfg = OperatorConfig(limits=CFG.limits, protection=CFG.protection)
    assert cfg.thermal_eviction.rule == "pays"
    rec = Reconciler(cfg, kube)
    res = await cycle(rec, kube, hot("n1", "train-0"), T0)  # 90 °C, not throttling: the taint is enough
    assert res.moves == [] and res.outcomes == []
    throttling = node("n1", gpu(0, 90.0, throttled=True, procs=(proc("train-0", 10),)), now=T0 + 10)
    res = await cycle(rec, kube, throttling, T0 + 10)
    assert [m.gang for m in res.moves] == [GANG_KEY]
    assert sorted(o.pod for o in res.outcomes) == ["ml/train-0", "ml/train-1"]


# -- the straggler decision priced over the gang (stragglers.gang_move_pays) ---------------------------------------


def test_gang_move_pays_weighs_the_whole_gang_at_its_straggler_s_speed() -> None:
    # clocks at 60 %: each hour of remaining work takes 40 min longer, on every member's GPUs
    one = MemberWork(gpus=8, age_s=7200.0, lost_s=60.0)
    v = gang_move_pays([one, one], 0.6, restart_s=120.0, max_remaining_s=3600.0)
    assert v.move and round(v.stay_gpu_s) == round(3600 * 0.4 / 0.6 * 16) and v.leave_gpu_s == 180.0 * 16
    # every member's lost work counts: one that never checkpointed in two hours makes leaving dearer than staying
    never = MemberWork(gpus=8, age_s=7200.0, lost_s=7200.0)
    assert not gang_move_pays([one, never], 0.6, 120.0, 3600.0).move
    # the remaining work is the gang's (its youngest member's age): a member restarted 200 s ago caps it
    young = MemberWork(gpus=8, age_s=200.0, lost_s=60.0)
    assert not gang_move_pays([one, young], 0.6, 120.0, 3600.0).move
    assert not gang_move_pays([one], 1.0, 0.0, 3600.0).move  # full clocks: staying costs nothing
    assert not gang_move_pays([], 0.5, 0.0, 3600.0).move


def test_gang_move_pays_prices_the_place_the_gang_would_land_on() -> None:
    """Leaving also costs the remaining work at the new place's predicted clock ratio: with no cooler place (the
    gang would throttle as much again) moving never pays; a place at 90 % clocks costs its slowdown."""
    one = MemberWork(gpus=8, age_s=7200.0, lost_s=60.0)
    assert gang_move_pays([one, one], 0.6, 120.0, 3600.0).move  # a cooler place (full clocks) by default
    again = gang_move_pays([one, one], 0.6, 120.0, 3600.0, new_clock_ratio=0.6)
    assert not again.move and again.leave_gpu_s == pytest.approx(180.0 * 16 + 3600 * 0.4 / 0.6 * 16)
    warm = gang_move_pays([one, one], 0.6, 120.0, 3600.0, new_clock_ratio=0.9)
    assert warm.move and warm.leave_gpu_s == pytest.approx(180.0 * 16 + 3600 * 0.1 / 0.9 * 16)


def _throttling_gang(lost_straggler_s: float, lost_others_s: float, members: int = 4) -> tuple[Any, ...]:
    """A gang of ``members`` 1-GPU members, two hours old; train-0 on n1's GPU 0, throttling (clocks unknown: the
    assumed 60 %), its last checkpoint ``lost_straggler_s`` ago, the others' ``lost_others_s`` ago."""
    pods = []
    for i in range(members):
        lost = lost_straggler_s if i == 0 else lost_others_s
        done = {ann.CHECKPOINT_DONE: format_time(T0 - lost)}
        pods.append(
            pod(
                f"train-{i}",
                node=f"n{i + 1}",
                gpu_indices="0",
                annotations={**member(i, "x", members)["metadata"]["annotations"], **done},
                age_s=7200.0,
            )
        )
    nd = node("n1", gpu(0, 90.0, throttled=True, procs=(proc("train-0", 10),)), now=T0)
    return pods, nd


def _decide(pods: list[dict[str, Any]], nd: GpuNode, rule: ThermalEvictionConfig) -> tuple[list[Any], list[Any]]:
    cfg = OperatorConfig(thermal_eviction=rule)
    here = [pod_view(pods[0])]
    refs = {pod_view(p).key: r for p in pods[:1] if (r := gang_of(p, cfg.gang)) is not None}
    deferred = set(refs)
    cands = thermal(nd, observe(nd, cfg.hotness), here, cfg.hotness.cool_celsius, T0, rule, deferred)
    return gang_moves(cands, refs, {GANG_KEY: pods}, T0, rule)


def test_a_gang_moves_when_its_whole_slowdown_pays_though_the_straggler_s_own_rule_says_stay() -> None:
    """Four members; the straggler has not checkpointed for 50 min, the others a minute ago. Its own rule: staying
    costs 40 min (an hour at 60 %), leaving 52 min: stay. Over the gang: 4 x 40 min against 52 + 3 x 3 min: move."""
    pods, nd = _throttling_gang(3000.0, 60.0)
    rule = ThermalEvictionConfig()
    straggler = pod_view(pods[0])
    assert not judge(nd, observe(nd, OperatorConfig().hotness), (0,), 7200.0, 3000.0, rule).move  # per pod: stay
    singles, moves = _decide(pods, nd, rule)
    assert singles == [] and [m.gang for m in moves] == [GANG_KEY]
    assert len(moves[0].members) == 4 and moves[0].straggler.pod.key == straggler.key
    assert "moving the gang pays" in moves[0].detail


def test_a_gang_stays_when_leaving_costs_its_members_more_though_the_straggler_s_own_rule_says_move() -> None:
    """Two members; the straggler checkpointed a minute ago, its partner two hours ago (never). Its own rule: 40 min
    against 3 min: move. Over the gang: 2 x 40 min against 3 min + 2 h: stay, the straggler too (not alone)."""
    pods, nd = _throttling_gang(60.0, 7200.0, members=2)
    rule = ThermalEvictionConfig()
    assert judge(nd, observe(nd, OperatorConfig().hotness), (0,), 7200.0, 60.0, rule).move  # per pod: move
    singles, moves = _decide(pods, nd, rule)
    assert singles == [] and moves == []
    # an elastic gang keeps the per-pod rule: the straggler alone moves
    elastic = [
        pod(
            p["metadata"]["name"],
            node=p["spec"]["nodeName"],
            gpu_indices="0",
            age_s=7200.0,
            annotations={**p["metadata"]["annotations"], ann.GANG_ELASTIC: "true"},
        )
        for p in pods
    ]
    cfg = OperatorConfig()
    here = [pod_view(elastic[0])]
    ref = gang_of(elastic[0], cfg.gang)
    assert ref is not None
    refs = {here[0].key: ref}
    cands = thermal(nd, observe(nd, cfg.hotness), here, cfg.hotness.cool_celsius, T0, rule, deferred=())
    singles, moves = gang_moves(cands, refs, {GANG_KEY: elastic}, T0, rule)
    assert [c.pod.key for c in singles] == ["ml/train-0"] and moves == []
