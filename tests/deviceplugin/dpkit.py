"""The device-plugin tests' kit: a kubelet stand-in over real gRPC on a unix socket, pods, a running plugin."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import kmock as km

from scheduler_plugin.deviceplugin.plugin import KUBELET_SOCKET, DevicePluginRunner, PluginConfig, endpoint_name
from scheduler_plugin.deviceplugin.pods import NodePods
from scheduler_plugin.deviceplugin.v1beta1 import api_pb2 as pb
from scheduler_plugin.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from scheduler_plugin.kubeapi import KubeClient, KubeConfig
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.nvml.backend import NvmlApi
from scheduler_plugin.nvml.events import XidWatcher

PODS = km.resource("", "v1", "pods")
NODE = "gpu-node-1"


class FakeKubelet(pb_grpc.RegistrationServicer):
    """What the kubelet does with device plugins: serves Registration on kubelet.sock, records each request, and
    on restart recreates its socket and deletes the plugins' sockets (as the kubelet's device manager does)."""

    def __init__(self, socket_dir: Path) -> None:
        self.socket_dir = socket_dir
        self.requests: list[Any] = []
        self.reject: str | None = None
        self.rejected = 0
        """Registrations refused (``reject`` set)."""
        self._server: grpc.aio.Server | None = None
        self._registered = asyncio.Condition()

    async def Register(self, request: Any, context: Any) -> Any:
        if self.reject:
            self.rejected += 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, self.reject)
        async with self._registered:
            self.requests.append(request)
            self._registered.notify_all()
        return pb.Empty()

    async def wait_registrations(self, n: int, timeout_s: float = 10.0) -> list[Any]:
        async def wait() -> None:
            async with self._registered:
                await self._registered.wait_for(lambda: len(self.requests) >= n)

        await asyncio.wait_for(wait(), timeout_s)
        return self.requests[:n]

    async def start(self) -> None:
        self._server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket_dir / KUBELET_SOCKET}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        for sock in self.socket_dir.glob("*.sock"):
            sock.unlink()

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    @contextlib.asynccontextmanager
    async def plugin(self, resource: str) -> AsyncIterator[Any]:
        """A DevicePlugin client on the plugin's socket for ``resource`` (what the kubelet dials after Register)."""
        async with grpc.aio.insecure_channel(f"unix://{self.socket_dir / endpoint_name(resource)}") as channel:
            yield pb_grpc.DevicePluginStub(channel)


async def until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait until ``check()`` is true (the plugin acts in its own tasks)."""
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.02)


def pod(  # noqa: PLR0913
    name: str,
    *,
    gpus: int = 0,
    shared: int = 0,
    assigned: str | None = None,
    node: str = NODE,
    assigned_node: str | None = NODE,
    annotations: dict[str, str] | None = None,
    scheduled: str = "2026-12-01T04:00:00Z",
    created: str = "2026-12-01T03:59:00Z",
    ns: str = "ml",
    phase: str = "Pending",
) -> dict[str, Any]:
    anns = dict(annotations or {})
    if assigned is not None:
        anns[ann.GPU_ASSIGNED] = assigned
        if assigned_node is not None:
            anns[ann.GPU_ASSIGNED_NODE] = assigned_node
    limits: dict[str, str] = {}
    if gpus:
        limits[ann.GPU_RESOURCE] = str(gpus)
    if shared:
        limits[ann.SHARED_GPU_RESOURCE] = str(shared)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "annotations": anns,
            "creationTimestamp": created,
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": {
            "phase": phase,
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}],
        },
    }


def add_pods(kmock: km.KubernetesEmulator, *pods: dict[str, Any]) -> None:
    kmock.resources[PODS] = {}  # declared even with no pod: an empty list, not a 404
    for p in pods:
        kmock.objects[PODS, p["metadata"]["namespace"], p["metadata"]["name"]] = p


def stored_annotations(kmock: km.KubernetesEmulator, name: str, ns: str = "ml") -> dict[str, str]:
    return dict(kmock.objects[PODS, ns, name]["metadata"].get("annotations") or {})


@dataclass
class Running:
    runner: DevicePluginRunner
    kubelet: FakeKubelet
    stop: asyncio.Event
    task: asyncio.Task[None]


@contextlib.asynccontextmanager
async def running_plugin(
    nvml: NvmlApi,
    socket_dir: Path,
    server: str,
    *,
    slots: int = 4,
    cdi_kind: str | None = None,
    watch_xids: bool = True,
    resources: tuple[str, ...] = (ann.GPU_RESOURCE, ann.SHARED_GPU_RESOURCE),
) -> AsyncIterator[Running]:
    """A kubelet stand-in and the plugin registered with it (fast polls), stopped on exit."""
    kubelet = FakeKubelet(socket_dir)
    await kubelet.start()
    client = KubeClient(KubeConfig(server=server), timeout_s=5.0)
    config = PluginConfig(
        node=NODE,
        socket_dir=socket_dir,
        resources=resources,
        slots=slots,
        cdi_kind=cdi_kind,
        poll_s=0.05,
        health_s=0.05,
    )
    xids = XidWatcher(nvml, wait_ms=50, retry_s=0.1) if watch_xids else None
    runner = DevicePluginRunner(config, nvml, NodePods(client, NODE), xids=xids)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(runner.run(stop, ready))
    try:
        await asyncio.wait_for(ready.wait(), 10)
        yield Running(runner, kubelet, stop, task)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()
        await client.close()
