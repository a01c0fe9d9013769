"""Hot nodes, end to end: GPUs heated through the fake NVML reach the operator through kelvin's exporters and a real
Prometheus; the operator (the installed settings, its own token, peering on) taints the nodes, evicts pods off the
hot GPUs through the Eviction API, where a PodDisruptionBudget blocks one and another is protected, runs the
checkpoint handshake (one answered by the test as a workload would, one left to time out), and lifts the taints
once the GPUs cool. Asserted on what the API server shows: taints, pods, annotations and Events."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

from scheduler_plugin.model.times import format_time, parse_time
from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster
from tests.e2e.opharness import (
    GpuState,
    bind,
    events,
    nodes_with_telemetry,
    pods_of,
    replica_set,
    start_operator,
    thermal_taint,
)

HOT_1, HOT_2 = NODES = ("e2e-op-hot-1", "e2e-op-hot-2")
CHECKPOINT_TIMEOUT_S = 15  # tests/e2e/opharness.py FAST


tel = nodes_with_telemetry(NODES, "thermal")


def _node_events(cluster: LoopbackCluster, node: str, reason: str) -> list[dict[str, Any]]:
    return events(cluster, name=node, reason=reason)


def _one_pod(cluster: LoopbackCluster, namespace: str, app: str, node: str, gpu: int, **annotations: str) -> str:
    """A ReplicaSet of one pod, bound to ``gpu`` of ``node``; returns the pod's UID."""
    rs = replica_set(app, 1, annotations=annotations)
    cluster.api.create(f"/apis/apps/v1/namespaces/{namespace}/replicasets", rs)
    (pod,) = wait_for(f"the pod of ReplicaSet {app}", lambda: pods_of(cluster, namespace, app), 30)
    return str(bind(cluster, pod, node, gpu)["metadata"]["uid"])


def _pod(cluster: LoopbackCluster, namespace: str, app: str, uid: str) -> dict[str, Any] | None:
    """The pod of ``app`` with ``uid``, while it exists."""
    return next((p for p in pods_of(cluster, namespace, app) if p["metadata"]["uid"] == uid), None)


def _event(cluster: LoopbackCluster, namespace: str, reason: str, pod: str) -> dict[str, Any] | None:
    found = events(cluster, namespace=namespace, name=pod, reason=reason)
    return found[-1] if found else None


def test_hot_nodes_tainted_drained_and_cooled(
    cluster: LoopbackCluster, tel: GpuState, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    uids = {
        "plain": _one_pod(cluster, ns, "plain", HOT_1, 0),
        "guarded": _one_pod(cluster, ns, "guarded", HOT_1, 1),
        "kept": _one_pod(cluster, ns, "kept", HOT_1, 2, **{"kelvin.dev/evictable": "false"}),
        "cool": _one_pod(cluster, ns, "cool", HOT_1, 5),
        "answered": _one_pod(cluster, ns, "answered", HOT_2, 0, **{"kelvin.dev/checkpoint": "true"}),
        "silent": _one_pod(cluster, ns, "silent", HOT_2, 1, **{"kelvin.dev/checkpoint": "true"}),
    }
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    cluster.api.create(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", pdb)
    wait_for(
        "the PodDisruptionBudget observed (no disruption allowed)",
        lambda: (
            (cluster.api.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/guarded").get("status") or {}).get(
                "currentHealthy"
            )
            == 1
        ),
        30,
    )
    names = {app: _pod(cluster, ns, app, uid)["metadata"]["name"] for app, uid in uids.items()}  # type: ignore[index]
    operator = start_operator(cluster, tel, tmp_path / "op", "op-thermal")
    try:
        # the GPUs heat up: heat ranks the candidates (the hottest GPU's pod first)
        for node, gpu, celsius in ((HOT_1, 0, 95), (HOT_1, 1, 92), (HOT_1, 2, 90), (HOT_2, 0, 95), (HOT_2, 1, 90)):
            tel.temperature(node, gpu, celsius)

        def tainted() -> bool:
            operator.check_alive()
            return all(thermal_taint(cluster, n) for n in NODES)

        wait_for("both hot nodes tainted", tainted, 60, 0.5)
        for node in NODES:
            # the Event follows the taint (a separate API call): wait for it rather than read it once
            (hot,) = wait_for(
                f"Event KelvinNodeHot on {node}", functools.partial(_node_events, cluster, node, "KelvinNodeHot"), 30
            )
            assert hot["involvedObject"]["kind"] == "Node" and hot["type"] == "Warning", hot
            assert "kelvin.dev/thermal=hot:NoSchedule" in hot["message"], hot

        # an unprotected pod on a hot GPU: evicted through the Eviction API; its ReplicaSet's replacement waits
        wait_for("plain evicted", lambda: _pod(cluster, ns, "plain", uids["plain"]) is None, 60, 0.5)
        evicted = _event(cluster, ns, "KelvinEvicted", names["plain"])
        assert evicted is not None and evicted["message"].startswith("evicted (thermal): on hot GPU(s) 0 of "), evicted
        (replacement,) = pods_of(cluster, ns, "plain")
        assert not replacement["spec"].get("nodeName"), replacement

        # the PodDisruptionBudget refuses the eviction (429): the pod stays, a Warning Event says why
        blocked = wait_for(
            "KelvinEvictionBlocked on guarded",
            lambda: _event(cluster, ns, "KelvinEvictionBlocked", names["guarded"]),
            60,
        )
        assert blocked["type"] == "Warning", blocked
        assert "refused by a PodDisruptionBudget, will retry" in blocked["message"], blocked
        assert "disruption budget" in blocked["message"], blocked

        # checkpoint handshake, answered: the operator asks, the workload answers later than the request
        def requested() -> str | None:
            pod = _pod(cluster, ns, "answered", uids["answered"]) or {}
            return (pod.get("metadata", {}).get("annotations") or {}).get("kelvin.dev/checkpoint-requested")

        stamp = wait_for("a checkpoint requested from answered", requested, 60, 0.5)
        asked = _event(cluster, ns, "CheckpointRequested", names["answered"])
        assert asked is not None and f"within {CHECKPOINT_TIMEOUT_S} s" in asked["message"], asked
        assert _pod(cluster, ns, "answered", uids["answered"]) is not None  # not evicted before the answer
        asked_at = parse_time(stamp)
        assert asked_at is not None, stamp
        time.sleep(2)  # the checkpoint takes a while
        done = format_time(time.time())
        cluster.api.merge_patch(
            f"/api/v1/namespaces/{ns}/pods/{names['answered']}",
            {"metadata": {"annotations": {"kelvin.dev/checkpoint-done": done}}},
        )
        wait_for("answered evicted", lambda: _pod(cluster, ns, "answered", uids["answered"]) is None, 30, 0.5)
        evicted = _event(cluster, ns, "KelvinEvicted", names["answered"])
        assert evicted is not None and "after checkpoint handshake (done, " in evicted["message"], evicted

        # checkpoint handshake, never answered: evicted once the timeout has passed since the request
        def silent_requested() -> str | None:
            pod = _pod(cluster, ns, "silent", uids["silent"]) or {}
            return (pod.get("metadata", {}).get("annotations") or {}).get("kelvin.dev/checkpoint-requested")

        wait_for("a checkpoint requested from silent", silent_requested, 30, 0.5)
        requested_at = time.monotonic()
        wait_for(
            "silent evicted after the timeout",
            lambda: _pod(cluster, ns, "silent", uids["silent"]) is None,
            CHECKPOINT_TIMEOUT_S + 30,
            0.5,
        )
        assert time.monotonic() - requested_at >= CHECKPOINT_TIMEOUT_S - 1
        evicted = _event(cluster, ns, "KelvinEvicted", names["silent"])
        assert evicted is not None and "after checkpoint handshake (timeout, " in evicted["message"], evicted

        # the GPUs cool: after holdSeconds below coolCelsius the taints go, with an Event each
        for node, gpu in ((HOT_1, 0), (HOT_1, 1), (HOT_1, 2), (HOT_2, 0), (HOT_2, 1)):
            tel.temperature(node, gpu, 45)
        wait_for("the taints lifted", lambda: not any(thermal_taint(cluster, n) for n in NODES), 60, 0.5)
        for node in NODES:
            (cooled,) = wait_for(
                f"Event KelvinNodeCooled on {node}",
                functools.partial(_node_events, cluster, node, "KelvinNodeCooled"),
                30,
            )
            assert cooled["message"].startswith("removed the thermal taint"), cooled

        # kept all along: the PDB-guarded pod, the protected pod and the pod on a cool GPU
        for app in ("guarded", "kept", "cool"):
            pod = _pod(cluster, ns, app, uids[app])
            assert pod is not None and not pod["metadata"].get("deletionTimestamp"), (app, pod)
        # refused every cycle (a dozen times here), reported once: one Event for the episode, not one per cycle
        blocks = events(cluster, namespace=ns, name=names["guarded"], reason="KelvinEvictionBlocked")
        assert len(blocks) == 1, [(e["metadata"]["creationTimestamp"], e["message"]) for e in blocks]
        for app in ("kept", "cool"):
            assert _event(cluster, ns, "KelvinEvicted", names[app]) is None, app
            assert _event(cluster, ns, "KelvinEvictionBlocked", names[app]) is None, app
    finally:
        operator.stop()
        tel.reset()
