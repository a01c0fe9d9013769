"""The device plugin on a real NVIDIA GPU (pynvml over libnvidia-ml): discovery, health, Allocate over gRPC.
Skipped, with the reason, where NVML cannot start."""

from __future__ import annotations

from pathlib import Path

import grpc
import kmock as km
import pytest
from dpkit import add_pods, pod, running_plugin, stored_annotations

from scheduler_plugin.deviceplugin.devices import discover
from scheduler_plugin.deviceplugin.health import Health
from scheduler_plugin.deviceplugin.v1beta1 import api_pb2 as pb
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.nvml.backend import NvmlApi

pytestmark = pytest.mark.gpu


def test_real_gpus_are_discovered_and_healthy(nvml: NvmlApi) -> None:
    if not nvml.nvmlDeviceGetCount():
        pytest.skip("NVML works but reports no GPU")
    gpus = discover(nvml)
    print("served:", gpus)
    assert all(g.uuid.startswith("GPU-") and len(g.uuid) <= 40 for g in gpus)
    if nvml.nvmlDeviceGetCount() and not gpus:
        pytest.skip("every GPU of this machine is in MIG mode: nothing to serve")
    assert Health(nvml, gpus).check() == frozenset()


async def test_real_allocate_over_grpc(nvml: NvmlApi, kmock: km.KubernetesEmulator, socket_dir: Path) -> None:
    gpus = discover(nvml)
    if not gpus:
        pytest.skip("no GPU outside MIG mode")
    last = gpus[-1]
    add_pods(kmock, pod("train", gpus=1, assigned=str(last.index)))
    add_pods(kmock, pod("pool", shared=1, assigned=str(last.index), annotations={ann.GPU_MEMORY: "4Gi"}))
    async with running_plugin(nvml, socket_dir, str(kmock.url)) as run:
        async with run.kubelet.plugin(ann.GPU_RESOURCE) as plugin:
            first = await plugin.ListAndWatch(pb.Empty()).read()
            assert {d.ID: d.health for d in first.devices} == {g.uuid: "Healthy" for g in gpus}
            resp = await plugin.Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[gpus[0].uuid])]),
                timeout=10,
            )
            assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == last.uuid
            with pytest.raises(grpc.aio.AioRpcError):  # served: nobody else waits
                await plugin.Allocate(
                    pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[gpus[0].uuid])]),
                    timeout=10,
                )
        async with run.kubelet.plugin(ann.SHARED_GPU_RESOURCE) as plugin:
            resp = await plugin.Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=[f"{gpus[0].uuid}::0"])]
                ),
                timeout=10,
            )
            assert dict(resp.container_responses[0].envs) == {
                "NVIDIA_VISIBLE_DEVICES": last.uuid,
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
            }
    assert stored_annotations(kmock, "train")[ann.GPU_ALLOCATED] == str(last.index)
