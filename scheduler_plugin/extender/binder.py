"""Binding a pod to a node once its GPUs are chosen: the only place the extender writes to the Kubernetes API.

:class:`KubeBinder` first records the chosen GPU indices on the pod (annotations ``kelvin.dev/gpu-assigned`` and
``kelvin.dev/gpu-assigned-node``, one merge patch carrying the pod's UID as a precondition) and then creates the
``Binding``. The annotation comes first so that the device plugin, the exporter and kelvin's own records never see a
bound pod without its GPUs; when the Binding fails, the annotations are removed again (best effort).

:class:`LocalBinder` is for the simulated fleet (demo, benchmarks): there is no API server, the placement is only
recorded by the caller.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import quote

from ..kube import KubeClient, KubeError
from ..model import annotations as ann

log = logging.getLogger(__name__)


class BindError(RuntimeError):
    """A bind that did not happen; the message is what kube-scheduler shows on the pod."""


class Binder(Protocol):
    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: tuple[int, ...]) -> None: ...

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod object, or None when this binder cannot see pods."""
        ...

    async def close(self) -> None: ...


def gpu_annotation(gpus: tuple[int, ...]) -> str:
    return ",".join(str(i) for i in gpus)


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"


class KubeBinder:
    def __init__(self, client: KubeClient) -> None:
        self.client = client

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            return await self.client.get(_pod_path(namespace, name))
        except KubeError as exc:
            raise BindError(f"cannot read pod {namespace}/{name}: {exc}") from exc

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: tuple[int, ...]) -> None:
        path = _pod_path(namespace, name)
        meta: dict[str, Any] = {"annotations": {ann.GPU_ASSIGNED: gpu_annotation(gpus), ann.GPU_ASSIGNED_NODE: node}}
        if uid:
            meta["uid"] = uid  # precondition: fails if the pod was recreated under the same name
        try:
            await self.client.patch_merge(path, {"metadata": meta})
        except KubeError as exc:
            raise BindError(f"cannot record GPUs {gpu_annotation(gpus)} on pod {namespace}/{name}: {exc}") from exc
        binding: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, **({"uid": uid} if uid else {})},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await self.client.post(path + "/binding", binding)
        except KubeError as exc:
            try:
                await self.client.patch_merge(
                    path, {"metadata": {"annotations": {ann.GPU_ASSIGNED: None, ann.GPU_ASSIGNED_NODE: None}}}
                )
            except KubeError as undo:
                log.warning(
                    "bind of %s/%s failed and its GPU annotations could not be removed: %s", namespace, name, undo
                )
            raise BindError(f"cannot bind pod {namespace}/{name} to {node}: {exc}") from exc

    async def close(self) -> None:
        await self.client.close()


class LocalBinder:
    """No API server: binding succeeds and the caller records the placement (simulated fleet)."""

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: tuple[int, ...]) -> None:
        return None

    async def close(self) -> None:
        return None


class NoApiBinder:
    """No API server configured for a real telemetry source: every bind fails with the reason (never a silent
    success that would leave the pod unbound)."""

    def __init__(self, why: str) -> None:
        self.why = why

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: tuple[int, ...]) -> None:
        raise BindError(f"kelvin cannot bind {namespace}/{name}: {self.why}")

    async def close(self) -> None:
        return None
