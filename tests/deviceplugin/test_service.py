"""The servicer's Allocate against a pod that changed between read and mark (HTTP 409): read again, once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from dpkit import NODE, pod

from scheduler_plugin.deviceplugin.allocation import Grant
from scheduler_plugin.deviceplugin.devices import Gpu
from scheduler_plugin.deviceplugin.pods import NodePods
from scheduler_plugin.deviceplugin.service import DevicePluginService, DeviceState
from scheduler_plugin.deviceplugin.v1beta1 import api_pb2 as pb
from scheduler_plugin.kubeapi import KubeClient, KubeConfig, KubeError
from scheduler_plugin.model import annotations as ann

GPUS = [Gpu(i, f"GPU-{i:08d}-0000-0000-0000-000000000000") for i in range(2)]


class ConflictingPods(NodePods):
    """The API as seen by the plugin: the first ``conflicts`` marks answer 409 (another writer got there first)."""

    def __init__(self, conflicts: int) -> None:
        super().__init__(KubeClient(KubeConfig(server="http://127.0.0.1:9")), NODE)
        self.conflicts = conflicts
        self.lists = 0
        self.marked: list[Grant] = []

    async def list(self) -> list[Mapping[str, Any]]:
        self.lists += 1
        return [pod("train", gpus=1, assigned="1")]

    async def mark(self, grant: Grant) -> None:
        if self.conflicts:
            self.conflicts -= 1
            raise KubeError(409, "Operation cannot be fulfilled: the object has been modified")
        self.marked.append(grant)


def service(pods: NodePods) -> DevicePluginService:
    return DevicePluginService(ann.GPU_RESOURCE, state=DeviceState(GPUS), pods=pods, slots=1)


class Aborted(Exception):
    pass


class Context:
    async def abort(self, code: Any, details: str) -> None:
        raise Aborted(code, details)


async def test_a_conflicting_mark_reads_the_pods_again() -> None:
    pods = ConflictingPods(conflicts=1)
    resp = await service(pods).Allocate(
        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[GPUS[0].uuid])]), Context()
    )
    assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == GPUS[1].uuid
    assert pods.lists == 2 and [g.indices for g in pods.marked] == [(1,)]


async def test_a_second_conflict_fails_the_allocate() -> None:
    pods = ConflictingPods(conflicts=2)
    with pytest.raises(Aborted) as err:
        await service(pods).Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[GPUS[0].uuid])]), Context()
        )
    assert "HTTP 409" in err.value.args[1] and not pods.marked


async def test_unknown_device_id_is_refused() -> None:
    with pytest.raises(Aborted) as err:
        await service(ConflictingPods(0)).Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-nope"])]), Context()
        )
    assert "unknown nvidia.com/gpu device 'GPU-nope'" in err.value.args[1]
