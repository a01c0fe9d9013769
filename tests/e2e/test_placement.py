"""Placement through the real kube-scheduler running the chart's KubeSchedulerConfiguration, with kelvin's extender
(filter, prioritize, bind) beside it: what the API server shows of each pod afterwards."""

from __future__ import annotations

from typing import Any

from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster
from tests.e2e.fleet import GPU_NODES, GPUS_PER_NODE, NVSWITCH_NODES
from tests.e2e.kelvin_scheduler import SCHEDULER_NAME, KelvinScheduler

GPU_ASSIGNED = "kelvin.dev/gpu-assigned"
GPU_ASSIGNED_NODE = "kelvin.dev/gpu-assigned-node"


def gpu_pod(name: str, gpus: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:e2e",
                    "command": ["sleep", "infinity"],
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
            "terminationGracePeriodSeconds": 5,
        },
    }


def _pod(cluster: LoopbackCluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(cluster.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}"))


def bound(cluster: LoopbackCluster, namespace: str, name: str, ks: KelvinScheduler) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        ks.check_alive()
        p = _pod(cluster, namespace, name)
        return p if p["spec"].get("nodeName") else None

    return wait_for(f"pod {namespace}/{name} bound", probe, 60)


def assigned(pod: dict[str, Any]) -> list[int]:
    annotations = pod["metadata"].get("annotations", {})
    assert annotations.get(GPU_ASSIGNED_NODE) == pod["spec"]["nodeName"], annotations
    return [int(i) for i in annotations[GPU_ASSIGNED].split(",")]


def test_one_gpu_pod_is_bound_by_kelvin_with_its_gpu_recorded(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, namespace: str
) -> None:
    cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", gpu_pod("one-gpu", 1))
    pod = bound(cluster, namespace, "one-gpu", kelvin_scheduler)
    assert pod["spec"]["nodeName"] in GPU_NODES
    (index,) = assigned(pod)
    assert 0 <= index < GPUS_PER_NODE
    scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert scheduled["status"] == "True"


def test_four_gpu_nvlink_required_pod_gets_four_nvlinked_gpus(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, namespace: str
) -> None:
    pod = gpu_pod("four-nvlink", 4, {"kelvin.dev/topology": "nvlink-required"})
    cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    placed = bound(cluster, namespace, "four-nvlink", kelvin_scheduler)
    # the PCIe-only node has no NVLink: only an NVSwitch node can hold the pod
    assert placed["spec"]["nodeName"] in NVSWITCH_NODES
    indices = assigned(placed)
    assert len(set(indices)) == 4 and all(0 <= i < GPUS_PER_NODE for i in indices), indices


def test_nvlink_required_pod_that_fits_nowhere_stays_pending_with_kelvins_reason(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, namespace: str, gpu_nodes: tuple[str, ...]
) -> None:
    """A 4-GPU nvlink-required pod pinned to the PCIe-only node: kube-scheduler's own filters pass that node (it
    has 8 free nvidia.com/gpu); kelvin's refusal is what the pod's condition shows."""
    pod = gpu_pod("nvlink-on-pcie", 4, {"kelvin.dev/topology": "nvlink-required"})
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "e2e-pcie-1"}
    cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    condition = unschedulable(cluster, namespace, "nvlink-on-pcie", kelvin_scheduler)
    assert "nvlink" in condition["message"].lower(), condition


def unschedulable(cluster: LoopbackCluster, namespace: str, name: str, ks: KelvinScheduler) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        ks.check_alive()
        p = _pod(cluster, namespace, name)
        assert not p["spec"].get("nodeName"), f"{name} was bound to {p['spec'].get('nodeName')}"
        for c in p["status"].get("conditions", []):
            if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("message"):
                return dict(c)
        return None

    return wait_for(f"pod {namespace}/{name} unschedulable with a reason", probe, 60)


def test_bad_annotation_leaves_the_pod_pending_with_the_reason(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, namespace: str
) -> None:
    pod = gpu_pod("bad-annotation", 1, {"kelvin.dev/max-temperature": "hot"})
    cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    condition = unschedulable(cluster, namespace, "bad-annotation", kelvin_scheduler)
    assert condition["reason"] == "Unschedulable", condition
    assert "kelvin.dev/max-temperature" in condition["message"], condition
    assert "hot" in condition["message"], condition


def test_gpu_models_annotation_is_honoured(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, namespace: str
) -> None:
    """The fleet is all H100: a pod that allows only A100 waits with the model reason; one that allows H100 binds."""
    cluster.api.create(
        f"/api/v1/namespaces/{namespace}/pods", gpu_pod("a100-only", 1, {"kelvin.dev/gpu-models": "A100"})
    )
    cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", gpu_pod("h100-ok", 1, {"kelvin.dev/gpu-models": "H100"}))
    assert bound(cluster, namespace, "h100-ok", kelvin_scheduler)["spec"]["nodeName"] in GPU_NODES
    condition = unschedulable(cluster, namespace, "a100-only", kelvin_scheduler)
    assert "of model A100" in condition["message"] and "H100" in condition["message"], condition


def test_max_temperature_below_every_gpu_leaves_the_pod_pending(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, namespace: str
) -> None:
    """20 °C, the lowest value accepted, is below every simulated GPU (ambient 28 °C)."""
    cluster.api.create(
        f"/api/v1/namespaces/{namespace}/pods", gpu_pod("too-cool", 1, {"kelvin.dev/max-temperature": "20"})
    )
    condition = unschedulable(cluster, namespace, "too-cool", kelvin_scheduler)
    assert "above the pod's kelvin.dev/max-temperature of 20" in condition["message"], condition
