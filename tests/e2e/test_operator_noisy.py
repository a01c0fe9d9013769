"""A noisy neighbour on the real control plane: two pods share a GPU, each with a 20 GiB pool
(``kelvin.dev/gpu-memory``); the fake NVML's processes, attributed to the pods through the exporter, show one holding
50 GiB. The operator evicts that one (the Eviction API; its ReplicaSet's replacement waits) and keeps its victim; the
memory-pool enforcement (``pools.mode: warn``) posts a Warning Event on the offender."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

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

NODE = "e2e-op-noisy-1"
POOL = {"kelvin.dev/gpu-memory": "20Gi"}


tel = nodes_with_telemetry((NODE,), "noisy")


def _bound(cluster: LoopbackCluster, ns: str, app: str) -> dict[str, Any]:
    cluster.api.create(f"/apis/apps/v1/namespaces/{ns}/replicasets", replica_set(app, 1, annotations=POOL))
    (pod,) = wait_for(f"the pod of ReplicaSet {app}", lambda: pods_of(cluster, ns, app), 30)
    return bind(cluster, pod, NODE, 0)  # both on GPU 0


def _alive(cluster: LoopbackCluster, ns: str, pod: dict[str, Any]) -> bool:
    now = cluster.api.get_or_none(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
    return now is not None and now["metadata"]["uid"] == pod["metadata"]["uid"]


def test_noisy_neighbour_evicted_victim_kept(
    cluster: LoopbackCluster, tel: GpuState, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    noisy, victim = _bound(cluster, ns, "noisy"), _bound(cluster, ns, "victim")
    tel.run(NODE, 0, victim, "10Gi", pid=5001)
    tel.run(NODE, 0, noisy, "50Gi", pid=5002)
    operator = start_operator(cluster, tel, tmp_path / "op", "op-noisy")
    try:

        def evicted() -> bool:
            operator.check_alive()
            return not _alive(cluster, ns, noisy)

        wait_for("the noisy neighbour evicted", evicted, 60, 0.5)
        # the operator posts its Event after the eviction: wait for it, then exactly one
        wait_for("Event KelvinEvicted", lambda: events(cluster, namespace=ns, name=noisy["metadata"]["name"],
                                                       reason="KelvinEvicted"), 30)  # fmt: skip
        (event,) = events(cluster, namespace=ns, name=noisy["metadata"]["name"], reason="KelvinEvicted")
        assert event["message"].startswith("evicted (noisy_neighbor): uses 50.0 GiB of GPU 0 on "), event
        assert "over its pool of 20.0 GiB, next to 1 co-tenant(s)" in event["message"], event
        (pool,) = events(cluster, namespace=ns, name=noisy["metadata"]["name"], reason="KelvinGpuMemoryPoolExceeded")
        assert pool["type"] == "Warning", pool
        (replacement,) = pods_of(cluster, ns, "noisy")
        assert not replacement["spec"].get("nodeName"), replacement
        time.sleep(6)  # more cycles: the victim stays, within its pool
        assert _alive(cluster, ns, victim)
        assert not events(cluster, namespace=ns, name=victim["metadata"]["name"]), "the victim got Events"
        assert thermal_taint(cluster, NODE) is None  # cool GPUs: no taint
    finally:
        operator.stop()
        tel.reset()
