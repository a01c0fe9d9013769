"""The reconciler over real HTTP against a fake Kubernetes API (kmock): taint, evict, PDB, dry run, limits,
checkpoint handshake across an operator restart."""

from __future__ import annotations

import logging
from typing import Any

import kmock as km
import pytest
from kelvin_operator.k8s import OperatorKube
from kelvin_operator.metrics import OperatorMetrics
from kelvin_operator.reconcile import NodeResult, Reconciler
from kelvin_operator.settings import OperatorConfig
from opkit import T0, gpu, node, node_obj, pod, proc
from opkube import EVENTS, NODES, PODS, evictions_blocked, evictions_succeed

from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.gpu import GpuNode
from scheduler_plugin.model.times import format_time

# these tests exercise the evictor's mechanics: every pod on a hot node's warm GPU is a candidate (rule warm)
CFG = OperatorConfig(
    thermal_eviction={"rule": "warm"},
    limits={"max_per_node_per_cycle": 1, "max_per_namespace": 5, "max_total": 10, "window_s": 600},
    protection={"min_pod_age_s": 60},
)


def seed(kmock: km.KubernetesEmulator, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
    for n in nodes:
        kmock.objects[NODES, None, n["metadata"]["name"]] = n
    for p in pods:
        kmock.objects[PODS, p["metadata"]["namespace"], p["metadata"]["name"]] = p


async def cycle(rec: Reconciler, kube: OperatorKube, gnode: GpuNode, now: float) -> NodeResult:
    """What the kopf timer does, with the node and pods read from the API over HTTP."""
    node_json = await kube.client.get(f"/api/v1/nodes/{gnode.name}")
    pods = (await kube.client.get("/api/v1/pods", {"fieldSelector": f"spec.nodeName={gnode.name}"}))["items"]
    return await rec.reconcile_node(node_json, gnode, pods, now)


def writes(kmock: km.KubernetesEmulator) -> list[km.Request]:
    return [r for r in kmock if r.method.value in ("POST", "PATCH", "PUT", "DELETE") and r.resource != EVENTS]


def taints(kmock: km.KubernetesEmulator, name: str) -> list[dict[str, Any]]:
    return list(kmock.objects[NODES, None, name].get("spec", {}).get("taints") or [])


def event_reasons(kmock: km.KubernetesEmulator) -> list[str]:
    return [r.data["reason"] for r in kmock if r.method.value == "POST" and r.resource == EVENTS]


def hot_node(now: float = T0) -> GpuNode:
    return node("n1", gpu(0, 90.0, procs=(proc("a", 10),)), gpu(1, 60.0, procs=(proc("b", 10),)), now=now)


def metric(m: OperatorMetrics, name: str, **labels: str) -> float:
    v = m.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


async def test_taint_then_evict_then_untaint(kmock: km.KubernetesEmulator, kube: OperatorKube) -> None:
    evictions_succeed(kmock)
    seed(
        kmock,
        [node_obj("n1")],
        [pod("a", gpu_indices="0", priority=10), pod("a2", gpu_indices="0"), pod("b", gpu_indices="1")],
    )
    rec = Reconciler(CFG, kube)
    res = await cycle(rec, kube, hot_node(), T0)
    assert res.hot and res.taint_changed
    assert taints(kmock, "n1")[0] | {"timeAdded": None} == {
        "key": "kelvin.dev/thermal",
        "value": "hot",
        "effect": "NoSchedule",
        "timeAdded": None,
    }
    # both a and a2 sit on the hot GPU 0; a2 has the lower priority and goes first; one per node per cycle
    assert [(o.pod, o.result) for o in res.outcomes] == [("ml/a2", "evicted"), ("ml/a", "limited")]
    assert [str(r.url.path) for r in kmock["post", PODS]] == ["/api/v1/namespaces/ml/pods/a2/eviction"]
    assert kmock["post", PODS][0].data["kind"] == "Eviction"
    assert not kmock["delete"]  # never a DELETE
    assert "KelvinNodeHot" in event_reasons(kmock) and "KelvinEvicted" in event_reasons(kmock)
    assert (
        metric(rec.metrics, "kelvin_operator_evictions_total", reason="thermal", result="evicted", dry_run="false") == 1
    )
    assert metric(rec.metrics, "kelvin_operator_taint_transitions_total", transition="added") == 1
    assert metric(rec.metrics, "kelvin_operator_hot_nodes") == 1

    res = await cycle(rec, kube, hot_node(T0 + 30), T0 + 30)
    assert [(o.pod, o.result) for o in res.outcomes] == [("ml/a", "evicted")]  # b is on the cool GPU 1

    # cools down: stays tainted during the hold time, then the taint goes
    cool = node("n1", gpu(0, 50.0), gpu(1, 50.0), now=T0 + 60)
    res = await cycle(rec, kube, cool, T0 + 60)
    assert res.hot and taints(kmock, "n1")
    later = node("n1", gpu(0, 50.0), gpu(1, 50.0), now=T0 + 60 + CFG.hotness.hold_s)
    res = await cycle(rec, kube, later, T0 + 60 + CFG.hotness.hold_s)
    assert not res.hot and res.taint_changed and taints(kmock, "n1") == []
    assert "KelvinNodeCooled" in event_reasons(kmock)
    assert metric(rec.metrics, "kelvin_operator_taint_transitions_total", transition="removed") == 1


async def test_pdb_429_means_try_later(kmock: km.KubernetesEmulator, kube: OperatorKube) -> None:
    evictions_blocked(kmock)
    seed(kmock, [node_obj("n1")], [pod("a", gpu_indices="0")])
    rec = Reconciler(CFG, kube)
    res = await cycle(rec, kube, hot_node(), T0)
    assert [(o.pod, o.result) for o in res.outcomes] == [("ml/a", "pdb_blocked")]
    assert "disruption budget" in res.outcomes[0].message
    assert (PODS, "ml", "a") in kmock.objects and not kmock.objects[PODS, "ml", "a"].deleted
    assert "KelvinEvictionBlocked" in event_reasons(kmock)
    # a blocked eviction takes no budget: the next cycle tries again
    res = await cycle(rec, kube, hot_node(T0 + 30), T0 + 30)
    assert [o.result for o in res.outcomes] == ["pdb_blocked"]
    assert len(kmock["post", PODS]) == 2 and not kmock["delete"]
    assert (
        metric(rec.metrics, "kelvin_operator_evictions_total", reason="thermal", result="pdb_blocked", dry_run="false")
        == 2
    )


async def test_pdb_block_is_reported_once_per_episode(
    kmock: km.KubernetesEmulator, kube: OperatorKube, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the e2e hot-node scenario: a PodDisruptionBudget that keeps refusing posted a new Warning Event and an
    INFO line every cycle (a dozen Events a minute for one pod). One Event and one INFO line per episode; the
    retries every cycle are DEBUG; an episode that starts again after a break is reported again."""
    caplog.set_level(logging.DEBUG, logger="kelvin.operator.evictor")
    evictions_blocked(kmock)
    seed(kmock, [node_obj("n1")], [pod("a", gpu_indices="0")])
    rec = Reconciler(CFG, kube)
    for t in (T0, T0 + 30, T0 + 60):
        res = await cycle(rec, kube, hot_node(t), t)
        assert [o.result for o in res.outcomes] == ["pdb_blocked"]
    assert len(kmock["post", PODS]) == 3  # tried every cycle
    assert event_reasons(kmock).count("KelvinEvictionBlocked") == 1
    blocked = [r for r in caplog.records if "PodDisruptionBudget" in r.getMessage()]
    assert [r.levelno for r in blocked] == [logging.INFO, logging.DEBUG, logging.DEBUG]
    # GPU 0 cools below coolCelsius (the node is still hot, in its hold time): no candidate, the episode ends
    warm = node("n1", gpu(0, 70.0, procs=(proc("a", 10),)), gpu(1, 88.0), now=T0 + 90)
    res = await cycle(rec, kube, warm, T0 + 90)
    assert res.hot and res.outcomes == []
    res = await cycle(rec, kube, hot_node(T0 + 120), T0 + 120)
    assert [o.result for o in res.outcomes] == ["pdb_blocked"]
    assert event_reasons(kmock).count("KelvinEvictionBlocked") == 2


async def test_repeated_dry_run_and_limit_are_reported_once(
    kmock: km.KubernetesEmulator, kube: OperatorKube, caplog: pytest.LogCaptureFixture
) -> None:
    """A dry run would evict the same pod every cycle (nothing moves it): one KelvinDryRunEviction Event per
    episode, not one per cycle; the pod the limit holds back each cycle is one INFO line, then DEBUG."""
    caplog.set_level(logging.DEBUG, logger="kelvin.operator.evictor")
    evictions_succeed(kmock)
    seed(kmock, [node_obj("n1")], [pod("a", gpu_indices="0"), pod("a2", gpu_indices="0", priority=10)])
    rec = Reconciler(CFG.model_copy(update={"dry_run": True}), kube)
    for t in (T0, T0 + 30, T0 + 60):
        res = await cycle(rec, kube, hot_node(t), t)
        assert [(o.pod, o.result) for o in res.outcomes] == [("ml/a", "dry_run"), ("ml/a2", "limited")]
    assert event_reasons(kmock).count("KelvinDryRunEviction") == 1
    would = [r.levelno for r in caplog.records if r.getMessage().startswith("dry run: would evict ml/a ")]
    limited = [r.levelno for r in caplog.records if r.getMessage().startswith("not evicting ml/a2 ")]
    assert would == limited == [logging.INFO, logging.DEBUG, logging.DEBUG]
    assert (
        metric(rec.metrics, "kelvin_operator_evictions_total", reason="thermal", result="dry_run", dry_run="true") == 3
    )


async def test_dry_run_writes_nothing_but_events(kmock: km.KubernetesEmulator, kube: OperatorKube) -> None:
    evictions_succeed(kmock)
    seed(
        kmock,
        [node_obj("n1")],
        [pod("a", gpu_indices="0"), pod("ck", gpu_indices="0", annotations={ann.CHECKPOINT: "true"})],
    )
    rec = Reconciler(CFG.model_copy(update={"dry_run": True}), kube)
    res = await cycle(rec, kube, hot_node(), T0)
    assert res.hot and not res.taint_changed
    assert [o.result for o in res.outcomes] == ["dry_run", "limited"]
    assert writes(kmock) == []  # no taint, no eviction, no annotation: only Events
    assert set(event_reasons(kmock)) == {"KelvinDryRunTaint", "KelvinDryRunEviction"}
    assert taints(kmock, "n1") == []
    assert (
        metric(rec.metrics, "kelvin_operator_evictions_total", reason="thermal", result="dry_run", dry_run="true") == 1
    )


async def test_limits_namespace_and_cluster(kmock: km.KubernetesEmulator, kube: OperatorKube) -> None:
    evictions_succeed(kmock)
    cfg = CFG.model_copy(
        update={
            "limits": CFG.limits.model_copy(
                update={"max_per_node_per_cycle": 10, "max_per_namespace": 2, "max_total": 3}
            )
        }
    )
    pods = [pod(f"a{i}", gpu_indices="0") for i in range(3)] + [
        pod(f"b{i}", ns="other", gpu_indices="0") for i in range(3)
    ]
    seed(kmock, [node_obj("n1")], pods)
    rec = Reconciler(cfg, kube)
    res = await cycle(rec, kube, hot_node(), T0)
    results = [(o.pod.split("/")[0], o.result) for o in res.outcomes]
    assert results.count(("ml", "evicted")) == 2 and results.count(("other", "evicted")) == 1
    assert len(kmock["post", PODS]) == 3
    assert [o.result for o in res.outcomes].count("limited") == 3
    # the window slides: 600 s later there is budget again
    res = await cycle(rec, kube, hot_node(T0 + 601), T0 + 601)
    assert [o.result for o in res.outcomes] == ["evicted"] * 3  # a2, b1, b2


async def test_protected_pods_are_never_evicted(kmock: km.KubernetesEmulator, kube: OperatorKube) -> None:
    evictions_succeed(kmock)
    seed(
        kmock,
        [node_obj("n1")],
        [
            pod("keep", gpu_indices="0", annotations={ann.EVICTABLE: "false"}),
            pod("ds", gpu_indices="0", owner="DaemonSet"),
            pod("bare", gpu_indices="0", owner=None),
            pod("new", gpu_indices="0", age_s=5),
            pod("crit", gpu_indices="0", priority_class="system-cluster-critical"),
        ],
    )
    rec = Reconciler(CFG, kube)
    res = await cycle(rec, kube, hot_node(), T0)
    assert res.outcomes == [] and len(res.protected) == 5
    assert not kmock["post", PODS]


async def test_checkpoint_handshake_survives_restart(kmock: km.KubernetesEmulator, kube: OperatorKube) -> None:
    evictions_succeed(kmock)
    seed(kmock, [node_obj("n1")], [pod("train", gpu_indices="0", annotations={ann.CHECKPOINT: "true"})])
    rec = Reconciler(CFG, kube)
    res = await cycle(rec, kube, hot_node(), T0)
    assert [o.result for o in res.outcomes] == ["checkpoint_requested"]
    stored = kmock.objects[PODS, "ml", "train"]["metadata"]["annotations"]
    assert stored[ann.CHECKPOINT_REQUESTED] == format_time(T0)
    assert not kmock["post", PODS]
    res = await cycle(rec, kube, hot_node(T0 + 30), T0 + 30)
    assert [o.result for o in res.outcomes] == ["checkpoint_pending"]

    # the operator restarts: a new reconciler with no memory; the node keeps its taint, the pod its annotation
    restarted = Reconciler(CFG, kube)
    res = await cycle(restarted, kube, hot_node(T0 + 60), T0 + 60)
    assert res.hot and not res.taint_changed
    assert [o.result for o in res.outcomes] == ["checkpoint_pending"]
    assert kmock.objects[PODS, "ml", "train"]["metadata"]["annotations"][ann.CHECKPOINT_REQUESTED] == format_time(T0)

    # the workload answers (as examples/checkpoint_training_loop.py does)
    await kube.annotate_pod("ml", "train", {ann.CHECKPOINT_DONE: format_time(T0 + 75)})
    res = await cycle(restarted, kube, hot_node(T0 + 90), T0 + 90)
    assert [o.result for o in res.outcomes] == ["evicted"]
    assert kmock.objects[PODS, "ml", "train"].deleted
    hist = restarted.metrics.registry.get_sample_value(
        "kelvin_operator_checkpoint_handshake_duration_seconds_sum", {"outcome": "done"}
    )
    assert hist == 75.0


async def test_checkpoint_timeout(kmock: km.KubernetesEmulator, kube: OperatorKube) -> None:
    evictions_succeed(kmock)
    seed(kmock, [node_obj("n1")], [pod("train", gpu_indices="0", annotations={ann.CHECKPOINT: "true"})])
    cfg = OperatorConfig.model_validate({**CFG.model_dump(), "checkpoint": {"timeout_s": 120.0}})
    rec = Reconciler(cfg, kube)
    await cycle(rec, kube, hot_node(), T0)
    res = await cycle(rec, kube, hot_node(T0 + 119), T0 + 119)
    assert [o.result for o in res.outcomes] == ["checkpoint_pending"]
    res = await cycle(rec, kube, hot_node(T0 + 121), T0 + 121)
    assert [o.result for o in res.outcomes] == ["evicted"]
    assert (
        rec.metrics.registry.get_sample_value(
            "kelvin_operator_checkpoint_handshake_duration_seconds_count", {"outcome": "timeout"}
        )
        == 1
    )


async def test_memory_pool_warn_and_evict(kmock: km.KubernetesEmulator, kube: OperatorKube) -> None:
    evictions_succeed(kmock)
    seed(
        kmock,
        [node_obj("n1", labels={"kelvin.dev/mps": "true"})],
        [pod("greedy", gpu_indices="0", annotations={ann.GPU_MEMORY: "10Gi"})],
    )
    cfg = OperatorConfig.model_validate({**CFG.model_dump(), "pools": {"mode": "evict", "grace_s": 60}})
    rec = Reconciler(cfg, kube)
    cool = node("n1", gpu(0, 50.0, procs=(proc("greedy", 16),)))
    res = await cycle(rec, kube, cool, T0)
    assert [v.kind.value for v in res.violations] == ["failed_open"] and res.outcomes == []
    assert "KelvinGpuMemoryPoolExceeded" in event_reasons(kmock)
    assert metric(rec.metrics, "kelvin_operator_pool_violations_total", mode="evict", kind="failed_open") == 1
    res = await cycle(rec, kube, node("n1", gpu(0, 50.0, procs=(proc("greedy", 16),)), now=T0 + 61), T0 + 61)
    assert [(o.reason, o.result) for o in res.outcomes] == [("memory_pool", "evicted")]
    assert metric(rec.metrics, "kelvin_operator_pool_violations_total", mode="evict", kind="failed_open") == 1


async def test_taint_conflict_does_not_stop_evictions(kmock: km.KubernetesEmulator, kube: OperatorKube) -> None:
    evictions_succeed(kmock)
    (
        kmock["patch", NODES]
        << 409
        << {"kind": "Status", "code": 409, "reason": "Conflict", "message": "the object has been modified"}
    )
    seed(kmock, [node_obj("n1")], [pod("a", gpu_indices="0")])
    rec = Reconciler(CFG, kube)
    res = await cycle(rec, kube, hot_node(), T0)  # the 409 is logged, not raised
    assert res.hot and not res.taint_changed
    assert metric(rec.metrics, "kelvin_operator_taint_transitions_total", transition="added") == 0
    assert [o.result for o in res.outcomes] == ["evicted"]


async def test_a_protected_pod_on_a_hot_node_is_reported_at_info_once_per_episode(
    kmock: km.KubernetesEmulator, kube: OperatorKube, caplog: pytest.LogCaptureFixture
) -> None:
    evictions_succeed(kmock)
    keep = pod("keep", gpu_indices="0", owner=None, annotations={ann.EVICTABLE: "false"})
    seed(kmock, [node_obj("n1")], [keep])
    rec = Reconciler(CFG, kube)

    def kept_lines(level: int) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "kelvin.operator" and r.levelno == level and "ml/keep" in r.getMessage()
        ]

    with caplog.at_level(logging.DEBUG, logger="kelvin.operator"):
        for t in (T0, T0 + 30, T0 + 60):  # three cycles of one episode: one INFO line, then DEBUG
            res = await cycle(rec, kube, hot_node(t), t)
            assert res.outcomes == [] and [p.candidate.pod.key for p in res.protected] == ["ml/keep"]
        info = kept_lines(logging.INFO)
        assert len(info) == 1, info
        assert "keeping ml/keep on node n1" in info[0] and "thermal" in info[0]
        assert 'protected: annotated kelvin.dev/evictable: "false"' in info[0]
        assert len(kept_lines(logging.DEBUG)) == 2
        # the pod stops being a candidate (here: it is gone from the node's pods), then comes back: a new episode
        node_json = await kube.client.get("/api/v1/nodes/n1")
        await rec.reconcile_node(node_json, hot_node(T0 + 90), [], T0 + 90)
        await cycle(rec, kube, hot_node(T0 + 120), T0 + 120)
        assert len(kept_lines(logging.INFO)) == 2
