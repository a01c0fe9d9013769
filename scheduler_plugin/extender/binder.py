"""Binding a pod to a node once its GPUs are chosen: the only place the extender writes to the Kubernetes API.

:class:`KubeBinder` makes one API call per pod: it creates the ``Binding`` (``pods/<name>/binding``) carrying the chosen
GPU indices as annotations (``kelvin.dev/gpu-assigned``, ``kelvin.dev/gpu-assigned-node`` and the bind time in
nanoseconds, ``kelvin.dev/gpu-assigned-at``) and the pod's UID. The API
server sets ``spec.nodeName`` and merges the Binding's annotations into the pod in one write, checking the UID as a
precondition (``BindingREST.setPodHostAndAnnotations``), so the device plugin, the exporter and kelvin's own records
never see a bound pod without its GPUs, and a failed Binding leaves nothing to undo: one
round trip per pod (a patch, then the Binding, would be two or three, which under a burst of binds queue behind one
another for seconds). At most ``max_in_flight`` calls run at once; the others wait their turn.

Every bind has a deadline, :data:`BIND_TIMEOUT_S` (the extender's ``bind_timeout_s``), below kube-scheduler's
extender ``httpTimeout`` (5 s by default): a slow or failing API server makes the bind fail with a message that says
so, instead of the scheduler timing out on kelvin without a reason.

:class:`LocalBinder` is for the simulated fleet (demo, benchmarks): there is no API server, the placement is only
recorded by the caller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import quote

from ..kubeapi import KubeClient, KubeError
from ..model import annotations as ann
from ..model.times import format_time_ns

log = logging.getLogger(__name__)

#: Seconds a bind may spend on the API server (reading the pod when needed, and the Binding): below kube-scheduler's
#: default extender ``httpTimeout`` of 5 s, so that kelvin answers with the reason before the scheduler gives up.
BIND_TIMEOUT_S = 4.0
#: API calls a :class:`KubeBinder` runs at once. Enough for a loopback API server to keep kube-scheduler's binding
#: cycles flowing; more only makes the HTTP client's connection pool slower (and opens more TLS connections).
BIND_MAX_IN_FLIGHT = 16


class BindError(RuntimeError):
    """A bind that failed; the message is what kube-scheduler shows on the pod. ``status`` is the API server's HTTP
    status (0: no answer, e.g. a connection reset after the request was sent; None: no request reached the API server,
    because kelvin refused before any call or no connection could be made)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Binder(Protocol):
    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: tuple[int, ...]) -> None: ...

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod object, or None when this binder cannot see pods."""
        ...

    async def close(self) -> None: ...


def gpu_annotation(gpus: tuple[int, ...]) -> str:
    return ",".join(str(i) for i in gpus)


def bind_time(now_ns: int | None = None) -> str:
    """``kelvin.dev/gpu-assigned-at``: RFC 3339 UTC with nanoseconds (PodScheduled's time has whole seconds)."""
    return format_time_ns(time.time_ns() if now_ns is None else now_ns)


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"


class KubeBinder:
    def __init__(self, client: KubeClient, *, max_in_flight: int = BIND_MAX_IN_FLIGHT) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight!r}")
        self.client = client
        self._slots = asyncio.Semaphore(max_in_flight)

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            async with self._slots:
                return await self.client.get(_pod_path(namespace, name))
        except KubeError as exc:
            raise BindError(f"cannot read pod {namespace}/{name}: {exc}") from exc

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: tuple[int, ...]) -> None:
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid  # precondition: fails if the pod was recreated under the same name
        if gpus:
            meta["annotations"] = {
                ann.GPU_ASSIGNED: gpu_annotation(gpus),
                ann.GPU_ASSIGNED_NODE: node,
                ann.GPU_ASSIGNED_AT: bind_time(),  # the device plugin's admission order (ns, unlike PodScheduled)
            }
        binding: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            async with self._slots:
                await self.client.post(_pod_path(namespace, name) + "/binding", binding)
        except KubeError as exc:
            what = f" with GPUs {gpu_annotation(gpus)}" if gpus else ""
            status = exc.status if exc.sent else None
            raise BindError(f"cannot bind pod {namespace}/{name} to {node}{what}: {exc}", status) from exc

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
