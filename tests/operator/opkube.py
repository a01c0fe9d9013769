"""The fake Kubernetes API's resources and eviction behaviours for the operator tests (kmock)."""

from __future__ import annotations

from typing import Any

import kmock as km

PODS = km.resource("", "v1", "pods")
NODES = km.resource("", "v1", "nodes")
EVENTS = km.resource("", "v1", "events")


def evictions_succeed(kmock: km.KubernetesEmulator) -> None:
    """Answer Eviction POSTs as the API server does without a blocking PDB: delete the pod, 201."""

    def evict(req: km.Request) -> dict[str, Any]:
        key = (PODS, req.namespace, req.name)
        if key not in kmock.objects or kmock.objects[key].deleted:
            raise km.KubernetesObjectNotFoundError()  # an evicted pod is gone: 404, as the API server answers
        kmock.objects[key].delete()
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

    kmock["post", PODS, km.subresource("eviction")] << 201 << evict


def evictions_blocked(kmock: km.KubernetesEmulator) -> None:
    (
        kmock["post", PODS, km.subresource("eviction")]
        << 429
        << {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": "TooManyRequests",
            "code": 429,
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        }
    )
