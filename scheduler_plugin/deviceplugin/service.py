"""The gRPC ``v1beta1.DevicePlugin`` service for one resource (grpc.aio): thin glue over :mod:`.allocation`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc

from ..kubeapi import KubeError
from ..model.pod import key_of
from .allocation import (
    AllocationError,
    Grant,
    candidates,
    close_binds,
    grant,
    next_indices,
    pick_pod,
    preferred,
)
from .devices import WHOLE_RESOURCE, Gpu, device_ids
from .pods import NodePods
from .v1beta1 import api_pb2 as pb
from .v1beta1 import api_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


class DeviceState:
    """The served GPUs and which of them are Unhealthy; ListAndWatch streams wait on its changes."""

    def __init__(self, gpus: Sequence[Gpu]) -> None:
        self.gpus: tuple[Gpu, ...] = tuple(gpus)
        self.unhealthy: frozenset[int] = frozenset()
        self._version = 0
        self._cond = asyncio.Condition()

    async def set_unhealthy(self, indices: frozenset[int]) -> None:
        if indices == self.unhealthy:
            return
        async with self._cond:
            self.unhealthy = indices
            self._version += 1
            self._cond.notify_all()

    async def changes(self) -> AsyncIterator[frozenset[int]]:
        """The Unhealthy set now, then after every change."""
        seen = -1
        while True:
            async with self._cond:
                while self._version == seen:
                    await self._cond.wait()
                seen, current = self._version, self.unhealthy
            yield current


class DevicePluginService(pb_grpc.DevicePluginServicer):
    def __init__(
        self,
        resource: str,
        *,
        state: DeviceState,
        pods: NodePods,
        slots: int,
        cdi_kind: str | None = None,
        lock: asyncio.Lock | None = None,
    ) -> None:
        self.resource = resource
        self.state = state
        self.pods = pods
        self.slots = slots
        self.cdi_kind = cdi_kind
        self._lock = lock or asyncio.Lock()
        self._devices = device_ids(resource, state.gpus, slots)
        self.overrides = 0
        """Allocate calls where the kubelet's devices were not kelvin's (the container got kelvin's)."""

    @property
    def node(self) -> str:
        return self.pods.node

    def devices(self, unhealthy: frozenset[int]) -> list[Any]:
        out = []
        for device, gpu in self._devices:
            topology = None
            if gpu.numa_node is not None:
                topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=gpu.numa_node)])
            health = UNHEALTHY if gpu.index in unhealthy else HEALTHY
            out.append(pb.Device(ID=device, health=health, topology=topology))
        return out

    # ------------------------------------------------------------------------------------------------------ the API
    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for unhealthy in self.state.changes():
            yield pb.ListAndWatchResponse(devices=self.devices(unhealthy))

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        return pb.PreStartContainerResponse()

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        pods: Sequence[Mapping[str, Any]] = []
        try:
            pods = await self.pods.list()
        except KubeError as exc:
            log.warning("GetPreferredAllocation %s: cannot list the pods of node %s: %s", self.resource, self.node, exc)
        responses = []
        for creq in request.container_requests:
            size = int(creq.allocation_size)
            indices: tuple[int, ...] | None = None
            try:
                pod = pick_pod(pods, node=self.node, resource=self.resource, count=size)
                indices = next_indices(pod, self.resource, size)
            except AllocationError as exc:
                log.info("GetPreferredAllocation %s: %s; preferring the first available", self.resource, exc)
            ids = preferred(
                indices,
                resource=self.resource,
                gpus=self.state.gpus,
                available=list(creq.available_deviceIDs),
                must_include=list(creq.must_include_deviceIDs),
                size=size,
            )
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: Any, context: Any) -> Any:
        responses = []
        async with self._lock:
            for creq in request.container_requests:
                try:
                    g = await self._grant(list(creq.devices_ids))
                except AllocationError as exc:
                    log.warning("Allocate %s refused: %s", self.resource, exc)
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                    raise  # abort raises; this line is never reached
                except KubeError as exc:
                    msg = f"kelvin device plugin on node {self.node}: cannot read or mark this node's pods: {exc}"
                    log.warning("Allocate %s failed: %s", self.resource, msg)
                    await context.abort(grpc.StatusCode.UNAVAILABLE, msg)
                    raise
                log.info(
                    "Allocate %s: pod %s gets GPUs %s (kubelet offered %s)",
                    self.resource,
                    g.key,
                    ",".join(map(str, g.indices)),
                    ",".join(creq.devices_ids),
                )
                responses.append(
                    pb.ContainerAllocateResponse(envs=g.envs, cdi_devices=[pb.CDIDevice(name=n) for n in g.cdi_devices])
                )
        return pb.AllocateResponse(container_responses=responses)

    async def _grant(self, devices: list[str]) -> Grant:
        known = {d for d, _ in self._devices}
        unknown = [d for d in devices if d not in known]
        if unknown:
            raise AllocationError(
                f"kelvin device plugin on node {self.node}: the kubelet asked for unknown {self.resource} "
                f"device {unknown[0]!r}"
            )
        g = await self._pick(devices)
        try:
            await self.pods.mark(g)
        except KubeError as exc:
            if exc.status != 409:
                raise
            g = await self._pick(devices)  # the pod changed since it was read: read again, once
            await self.pods.mark(g)
        return g

    async def _pick(self, devices: list[str]) -> Grant:
        pods = candidates(await self.pods.list(), node=self.node, resource=self.resource, count=len(devices))
        pod = pods[0]
        for other in close_binds(pod, pods[1:]):
            log.warning(
                "Allocate %s: pods %s and %s (both waiting for %d on node %s) were bound less than 2 s apart and %s "
                "was created first: if the kubelet admits them in one batch (sorted by creation time) the GPUs "
                "kelvin assigned them may be swapped; %s gets its GPUs now",
                self.resource,
                key_of(pod),
                key_of(other),
                len(devices),
                self.node,
                key_of(other),
                key_of(pod),
            )
        g = grant(
            pod,
            node=self.node,
            resource=self.resource,
            count=len(devices),
            gpus=self.state.gpus,
            cdi_kind=self.cdi_kind,
        )
        sick = sorted(set(g.indices) & self.state.unhealthy)
        if sick:
            raise AllocationError(f"pod {g.key}: its assigned GPU {sick[0]} on node {self.node} is Unhealthy")
        if self.resource == WHOLE_RESOURCE:
            offered = sorted(devices)
            mine = sorted(gpu.uuid for gpu in self.state.gpus if gpu.index in g.indices)
            if offered != mine:
                self.overrides += 1
                log.warning(
                    "pod %s: the kubelet picked %s, kelvin assigned %s: the container gets kelvin's GPUs; the "
                    "kubelet's checkpoint and podresources API name the kubelet's (override %d of this plugin)",
                    g.key,
                    offered,
                    mine,
                    self.overrides,
                )
        return g
