"""Placement through the real kube-scheduler running the chart's KubeSchedulerConfiguration, with kelvin's extender
(filter, prioritize, bind) beside it: what the API server shows of each pod afterwards."""

from __future__ import annotations

from tests.e2e.cluster import LoopbackCluster
from tests.e2e.fleet import GPU_NODES, GPUS_PER_NODE, NVSWITCH_NODES
from tests.e2e.kelvin_scheduler import KelvinScheduler
from tests.e2e.pods import GPU_ASSIGNED, assigned, bound, gpu_pod, unschedulable


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


def test_a_pod_without_gpus_of_kelvins_profile_is_ranked_and_bound_by_kelvin(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, namespace: str
) -> None:
    """The chart's default (scheduler.extender.cpuOnlyPods): no managedResources, so kube-scheduler sends a pod that
    asks no GPU to the extender too, which ranks it (best fit with fragmentation) and binds it."""
    pod = gpu_pod("cpu-only", 0)
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "500m", "memory": "64Mi"}}
    sent = {v: kelvin_scheduler.metric("kelvin_extender_requests_total", verb=v, code="200") for v in VERBS}
    cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    placed = bound(cluster, namespace, "cpu-only", kelvin_scheduler)
    assert placed["spec"]["nodeName"], placed["spec"]
    now = {v: kelvin_scheduler.metric("kelvin_extender_requests_total", verb=v, code="200") for v in VERBS}
    assert all(now[v] > sent[v] for v in VERBS), (sent, now)  # filtered, ranked and bound through kelvin
    assert GPU_ASSIGNED not in (placed["metadata"].get("annotations") or {})  # no GPU recorded


VERBS = ("filter", "prioritize", "bind")


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
    """20 °C, the lowest value accepted, is below every fake GPU (idle at 38 °C)."""
    cluster.api.create(
        f"/api/v1/namespaces/{namespace}/pods", gpu_pod("too-cool", 1, {"kelvin.dev/max-temperature": "20"})
    )
    condition = unschedulable(cluster, namespace, "too-cool", kelvin_scheduler)
    assert "above the pod's kelvin.dev/max-temperature of 20" in condition["message"], condition
