"""Pods of the scenarios and what the API server shows of them."""

from __future__ import annotations

from typing import Any

from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster
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


def bound(
    cluster: LoopbackCluster, namespace: str, name: str, ks: KelvinScheduler, *, supervise: bool = False
) -> dict[str, Any]:
    """The pod once bound. ``supervise``: restart kube-scheduler if it exited (fault scenarios), else fail."""

    def probe() -> dict[str, Any] | None:
        if supervise:
            ks.supervise()
        else:
            ks.check_alive()
        p = _pod(cluster, namespace, name)
        return p if p["spec"].get("nodeName") else None

    return wait_for(f"pod {namespace}/{name} bound", probe, 60)


def assigned(pod: dict[str, Any]) -> list[int]:
    annotations = pod["metadata"].get("annotations", {})
    assert annotations.get(GPU_ASSIGNED_NODE) == pod["spec"]["nodeName"], annotations
    return [int(i) for i in annotations[GPU_ASSIGNED].split(",")]


def unschedulable(
    cluster: LoopbackCluster, namespace: str, name: str, ks: KelvinScheduler, *, extender_down: bool = False
) -> dict[str, Any]:
    """The pod's PodScheduled condition once it is False with a message; fails at once if the pod gets bound."""

    def probe() -> dict[str, Any] | None:
        if not extender_down:
            ks.check_alive()
        p = _pod(cluster, namespace, name)
        assert not p["spec"].get("nodeName"), f"{name} was bound to {p['spec'].get('nodeName')}"
        for c in p["status"].get("conditions", []):
            if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("message"):
                return dict(c)
        return None

    return wait_for(f"pod {namespace}/{name} unschedulable with a reason", probe, 60)
