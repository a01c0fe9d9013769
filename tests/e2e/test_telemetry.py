"""Placement as the telemetry says: fake GPUs changed at run time through their exporters' state files
(tests/e2e/telemetry.py), scraped by the real Prometheus, read by kelvin's extender (``source=prometheus``); what the
API server shows of the pods afterwards."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster
from tests.e2e.fleet import ALL_NODES, GPU_NODES
from tests.e2e.kelvin_scheduler import KelvinScheduler
from tests.e2e.pods import assigned, bound, gpu_pod, unschedulable
from tests.e2e.telemetry import Telemetry

GIB = 2**30


def _pinned(pod: dict[str, Any], node: str) -> dict[str, Any]:
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return pod


def _kelvin_sees(ks: KelvinScheduler, pod: dict[str, Any], node: str, *, fits: bool) -> None:
    """Until kelvin's snapshot judges ``pod`` on ``node`` as ``fits`` (its refresh after Prometheus' scrape)."""
    wait_for(f"kelvin: {pod['metadata']['name']} fits {node} is {fits}", lambda: ks.explain(pod, node)["fits"] is fits,
             60, 0.5)  # fmt: skip


def test_extender_reads_every_fake_node_from_prometheus(
    kelvin_scheduler: KelvinScheduler, fresh_telemetry: Telemetry
) -> None:
    """The extender's own metrics: its snapshot comes from source ``prometheus``, with every fake node fresh."""

    def fresh_nodes() -> float | None:
        text = httpx.get(f"http://127.0.0.1:{kelvin_scheduler.extender_metrics_port}/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "kelvin_telemetry_nodes" and sample.labels == {"source": "prometheus",
                                                                                  "state": "fresh"}:  # fmt: skip
                    return sample.value if sample.value == len(ALL_NODES) else None
        return None

    assert wait_for("extender: every node fresh from prometheus", fresh_nodes, 30, 0.5) == len(ALL_NODES)


def test_hot_node_is_avoided(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, fresh_telemetry: Telemetry, namespace: str
) -> None:
    """Every GPU of one node at 94 °C and thermally throttled (its slowdown is 90 °C): no new GPU pod is bound there,
    a pod pinned to it waits with the thermal reason, and the other nodes take the rest."""
    hot = "e2e-nvs-2"
    fresh_telemetry.set_gpus(hot, {"all": {"temperature": 94, "throttleReasons": ["HW_THERMAL_SLOWDOWN"]}})
    fresh_telemetry.wait_query(f'min(kelvin_gpu_temperature_celsius{{node="{hot}"}}) >= 94')
    _kelvin_sees(kelvin_scheduler, gpu_pod("probe", 1), hot, fits=False)

    pods = cluster.api
    pods.create(f"/api/v1/namespaces/{namespace}/pods", _pinned(gpu_pod("pinned-hot", 1), hot))
    for i in range(6):
        pods.create(f"/api/v1/namespaces/{namespace}/pods", gpu_pod(f"burst-{i}", 1))
    condition = unschedulable(cluster, namespace, "pinned-hot", kelvin_scheduler)
    assert "slowdown" in condition["message"] or "thermal" in condition["message"].lower(), condition
    placed = [bound(cluster, namespace, f"burst-{i}", kelvin_scheduler) for i in range(6)]
    nodes = [p["spec"]["nodeName"] for p in placed]
    assert hot not in nodes and set(nodes) <= set(GPU_NODES), nodes
    # no GPU given twice on a node
    taken = [(p["spec"]["nodeName"], i) for p in placed for i in assigned(p)]
    assert len(taken) == len(set(taken)), taken


def test_max_temperature_annotation_is_honoured_against_the_telemetry(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, fresh_telemetry: Telemetry, namespace: str
) -> None:
    """Every fake GPU idles at 38 °C; one node's GPUs are cooled to 30 °C. A pod with
    ``kelvin.dev/max-temperature: "35"`` is bound there and only there; pinned to a 38 °C node it waits with the
    reason. (Cooled, not heated: a GPU that jumps up is *rising*, and kelvin's trend filter refuses a GPU predicted to
    reach its slowdown within 5 minutes, whatever the pod's annotation.)"""
    cool = "e2e-nvs-3"
    other = "e2e-nvs-1"
    cool_only = {"kelvin.dev/max-temperature": "35"}
    fresh_telemetry.set_gpus(cool, {"all": {"temperature": 30}})
    fresh_telemetry.wait_query(f'max(kelvin_gpu_temperature_celsius{{node="{cool}"}}) <= 30')
    _kelvin_sees(kelvin_scheduler, gpu_pod("probe", 1, cool_only), cool, fits=True)

    api = cluster.api
    api.create(f"/api/v1/namespaces/{namespace}/pods", _pinned(gpu_pod("cool-pinned-warm", 1, cool_only), other))
    for i in range(2):
        api.create(f"/api/v1/namespaces/{namespace}/pods", gpu_pod(f"cool-anywhere-{i}", 1, cool_only))
    condition = unschedulable(cluster, namespace, "cool-pinned-warm", kelvin_scheduler)
    assert "above the pod's kelvin.dev/max-temperature of 35" in condition["message"], condition
    for i in range(2):
        assert bound(cluster, namespace, f"cool-anywhere-{i}", kelvin_scheduler)["spec"]["nodeName"] == cool


def test_gpu_memory_in_use_is_what_a_memory_pool_pod_fits_into(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, fresh_telemetry: Telemetry, namespace: str
) -> None:
    """A node whose GPUs each have ~76 GiB of their 80 in use (processes outside kelvin's pods, as NVML shows them):
    a ``kelvin.dev/gpu-memory: 20Gi`` pod pinned there waits with kelvin's memory reason, a ``2Gi`` one binds there."""
    full = "e2e-nvs-1"
    fresh_telemetry.set_gpus(
        full, {"all": {"memoryUsed": "1Gi", "processes": [{"pid": 31337, "used": "75Gi", "pod": "outside"}]}}
    )
    fresh_telemetry.wait_query(f'min(kelvin_gpu_memory_used_bytes{{node="{full}"}}) >= {76 * GIB}')
    big = _pinned(gpu_pod("pool-20gi", 1, {"kelvin.dev/gpu-memory": "20Gi"}), full)
    _kelvin_sees(kelvin_scheduler, big, full, fits=False)

    api = cluster.api
    api.create(f"/api/v1/namespaces/{namespace}/pods", big)
    api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        _pinned(gpu_pod("pool-2gi", 1, {"kelvin.dev/gpu-memory": "2Gi"}), full),
    )
    condition = unschedulable(cluster, namespace, "pool-20gi", kelvin_scheduler)
    assert "GiB free; the pod needs 20 GiB on one GPU" in condition["message"], condition
    assert bound(cluster, namespace, "pool-2gi", kelvin_scheduler)["spec"]["nodeName"] == full
