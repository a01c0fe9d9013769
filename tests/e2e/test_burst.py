"""A burst of 500 one-GPU pods through kelvin-scheduler (the real kube-scheduler with the chart's configuration and
kelvin's extender binding), the extender reading kelvin exporters (fake NVML) through the suite's real Prometheus:
every pod is bound, and no GPU index of a node is assigned to two pods, as the API server shows in the pods'
``kelvin.dev/gpu-assigned`` annotations.

The session's four fake nodes hold 32 GPUs, so the burst gets 100 nodes of its own (800 GPUs, 8 each): a second
fake-node agent, the nodes tainted and labelled so that only the burst's pods go there. Their telemetry is real
exporter code scraped by the real Prometheus, but four ``kelvin exporter --fake`` processes serve the 100 nodes (25
each, one Prometheus target per node with the node's name as its ``node`` label: tests/e2e/telemetry.py's
``add_shared``): one exporter process per node (~90 MB and ~1.5 CPU-seconds to start each) does not fit a 2-core
CI machine. The extender's queries keep only ``node``, ``gpu``, ``uuid`` and ``model`` of those series
(``max by (node, gpu, ...)``; freshness from each node's own scrape timestamps), so it reads them as it reads one
exporter per node. Afterwards the nodes, their targets and exporters go, and the extender is restarted so that its
snapshot holds the suite's nodes only.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster
from tests.e2e.fleet import ALL_NODES, GPU_MODEL, GPUS_PER_NODE
from tests.e2e.kelvin_scheduler import KelvinScheduler
from tests.e2e.nodeagent import fake_nodes
from tests.e2e.pods import GPU_ASSIGNED, GPU_ASSIGNED_NODE, gpu_pod
from tests.e2e.telemetry import Telemetry

BURST_PREFIX = "e2e-burst-"
BURST_NODES = tuple(f"{BURST_PREFIX}{i}" for i in range(1, 101))
BURST_PODS = 500
BURST_LABEL = "kelvin.dev/e2e-burst"
BURST_TAINT = {"key": BURST_LABEL, "value": "true", "effect": "NoSchedule"}
#: Seconds for the whole burst to be bound: 36-55 s measured at load average ~20 (docs/e2e.md).
BURST_TIMEOUT_S = 300.0
#: Burst nodes per exporter process.
NODES_PER_EXPORTER = 25


@pytest.fixture(scope="module")
def burst_nodes(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, telemetry: Telemetry
) -> Iterator[tuple[str, ...]]:
    """100 more fake 8-GPU nodes, tainted and labelled for the burst, scraped by the suite's Prometheus and fresh in
    the extender's snapshot."""
    with fake_nodes(cluster, BURST_NODES, gpus=GPUS_PER_NODE, name="fakenodes-burst"):
        exporters = []
        try:
            for name in BURST_NODES:
                cluster.api.merge_patch(
                    f"/api/v1/nodes/{name}",
                    {"metadata": {"labels": {BURST_LABEL: "true"}}, "spec": {"taints": [BURST_TAINT]}},
                )
            exporters = telemetry.add_shared(BURST_NODES, GPU_MODEL, NODES_PER_EXPORTER)
            assert len(exporters) == len(BURST_NODES) // NODES_PER_EXPORTER
            # one node's GPUs per series set, each with UUIDs of its own, as one exporter per node gives them
            series = telemetry.prometheus.query(f'kelvin_gpu_memory_total_bytes{{node=~"{BURST_PREFIX}.*"}}')
            assert {(s["metric"]["node"], s["metric"]["gpu"]) for s in series} == {
                (n, str(i)) for n in BURST_NODES for i in range(GPUS_PER_NODE)
            }
            assert len({s["metric"]["uuid"] for s in series}) == len(BURST_NODES) * GPUS_PER_NODE == len(series)
            want = len(ALL_NODES) + len(BURST_NODES)

            def fresh() -> bool:
                kelvin_scheduler.check_alive()
                return kelvin_scheduler.telemetry_nodes("fresh") == want

            wait_for(f"extender: {want} nodes fresh from prometheus", fresh, 120, 1.0)
            yield BURST_NODES
        finally:
            for name in BURST_NODES:
                cluster.api.delete(f"/api/v1/nodes/{name}")
                cluster.api.delete(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}")
            if exporters:
                telemetry.remove_shared(exporters)
            kelvin_scheduler.restart_extender()


def _burst_pod(index: int) -> dict[str, Any]:
    pod = gpu_pod(f"burst-{index:03d}", 1)
    pod["spec"]["nodeSelector"] = {BURST_LABEL: "true"}
    pod["spec"]["tolerations"] = [{"key": BURST_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    return pod


def test_500_pod_burst_is_bound_with_no_gpu_assigned_twice(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, burst_nodes: tuple[str, ...], namespace: str
) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: cluster.api.create(path, _burst_pod(i)), range(BURST_PODS)))

        def all_bound() -> list[dict[str, Any]] | None:
            kelvin_scheduler.check_alive()
            pods: list[dict[str, Any]] = cluster.api.get(path)["items"]
            return pods if sum(bool(p["spec"].get("nodeName")) for p in pods) == BURST_PODS else None

        pods = wait_for(f"{BURST_PODS} burst pods bound", all_bound, BURST_TIMEOUT_S, 2.0)
        elapsed = time.monotonic() - started

        holders: dict[tuple[str, int], list[str]] = collections.defaultdict(list)
        for pod in pods:
            node, meta = pod["spec"]["nodeName"], pod["metadata"]
            annotations = meta.get("annotations", {})
            assert node in burst_nodes, f"{meta['name']} bound to {node}"
            assert annotations.get(GPU_ASSIGNED_NODE) == node, (meta["name"], annotations)
            (index,) = (int(i) for i in annotations[GPU_ASSIGNED].split(","))
            assert 0 <= index < GPUS_PER_NODE, (meta["name"], annotations)
            holders[(node, index)].append(meta["name"])
        twice = {f"{node}/{index}": names for (node, index), names in holders.items() if len(names) > 1}
        assert not twice, f"GPUs assigned to more than one pod: {twice}"
        assert len(holders) == BURST_PODS
        print(f"{BURST_PODS} pods bound in {elapsed:.1f} s ({BURST_PODS / elapsed:.1f} pods/s)")
    finally:
        # at once (gracePeriodSeconds 0): the burst nodes are deleted after this test, their pods must be gone first
        # one DeleteCollection of 500 pods: longer than the client's 30 s default on a loaded machine
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        cluster.api.call("DELETE", path, json=body, timeout=180)
        wait_for("burst pods deleted", lambda: not cluster.api.get(path, limit=1)["items"], 120, 0.5)
