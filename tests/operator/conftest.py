"""Fixtures of the operator tests: a fake Kubernetes API (kmock, real HTTP) and the operator's client to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import kmock as km
import pytest
from kelvin_operator.k8s import OperatorKube

from scheduler_plugin.kube import KubeClient, KubeConfig

PODS = km.resource("", "v1", "pods")
NODES = km.resource("", "v1", "nodes")
EVENTS = km.resource("", "v1", "events")


@pytest.fixture
async def kube(kmock: km.KubernetesEmulator) -> AsyncIterator[OperatorKube]:
    client = KubeClient(KubeConfig(server=str(kmock.url)), timeout_s=5.0)
    yield OperatorKube(client)
    await client.close()


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
