"""The pod lookup of Allocate: this node's pods from the API, and the ``kelvin.dev/gpu-allocated`` mark."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..kubeapi import KubeClient
from ..model import annotations as ann
from .allocation import Grant, allocated_annotation


class NodePods:
    """Reads the pods bound to one node and marks the ones that got their GPUs. Raises ``KubeError``."""

    def __init__(self, client: KubeClient, node: str) -> None:
        self.client = client
        self.node = node

    async def list(self) -> list[Mapping[str, Any]]:
        body = await self.client.get("/api/v1/pods", {"fieldSelector": f"spec.nodeName={self.node}"})
        items = body.get("items") or []
        return [p for p in items if isinstance(p, Mapping)]

    async def mark(self, grant: Grant) -> None:
        """Record the grant on the pod. The UID and resourceVersion are preconditions: a pod recreated or changed
        since it was read is not marked (HTTP 409), so two Allocate calls cannot both take the same GPUs."""
        meta: dict[str, Any] = {"annotations": {ann.GPU_ALLOCATED: allocated_annotation(grant.allocated)}}
        if grant.uid:
            meta["uid"] = grant.uid
        if grant.resource_version:
            meta["resourceVersion"] = grant.resource_version
        await self.client.patch_merge(f"/api/v1/namespaces/{grant.namespace}/pods/{grant.name}", {"metadata": meta})
