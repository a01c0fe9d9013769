"""The device plugin over real gRPC on unix sockets, against a kubelet stand-in and a fake API server (kmock),
on the fake NVML: registration, kubelet restart, ListAndWatch, Allocate, GetPreferredAllocation, health."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc
import kmock as km
import pytest
from dpkit import NODE, FakeKubelet, add_pods, pod, running_plugin, stored_annotations, until

from scheduler_plugin.deviceplugin.plugin import DevicePluginRunner, PluginConfig, endpoint_name
from scheduler_plugin.deviceplugin.pods import NodePods
from scheduler_plugin.deviceplugin.v1beta1 import api_pb2 as pb
from scheduler_plugin.kubeapi import KubeClient, KubeConfig
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.nvml.fake import FakeNvml

AT = ann.GPU_ASSIGNED_AT
GPU = ann.GPU_RESOURCE
SHARED = ann.SHARED_GPU_RESOURCE


def uuid(fake: FakeNvml, index: int) -> str:
    return fake.gpus[index].uuid


def allocate_request(*devices: str) -> Any:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=list(devices))])


async def next_devices(stream: Any) -> dict[str, str]:
    resp = await asyncio.wait_for(stream.read(), 10)
    return {d.ID: d.health for d in resp.devices}


async def test_registers_both_resources_and_serves_options(
    kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path
) -> None:
    async with running_plugin(fake, socket_dir, str(kmock.url)) as run:
        reqs = await run.kubelet.wait_registrations(2)
        assert {(r.resource_name, r.endpoint, r.version) for r in reqs} == {
            (GPU, "kelvin-gpu.sock", "v1beta1"),
            (SHARED, "kelvin-shared-gpu.sock", "v1beta1"),
        }
        assert all(r.options.get_preferred_allocation_available and not r.options.pre_start_required for r in reqs)
        for resource in (GPU, SHARED):
            assert (socket_dir / endpoint_name(resource)).is_socket()
            async with run.kubelet.plugin(resource) as plugin:
                opts = await plugin.GetDevicePluginOptions(pb.Empty(), timeout=5)
                assert opts.get_preferred_allocation_available and not opts.pre_start_required


async def test_list_and_watch_advertises_whole_gpus_and_slots(
    kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path
) -> None:
    async with running_plugin(fake, socket_dir, str(kmock.url), slots=3) as run:
        async with run.kubelet.plugin(GPU) as plugin:
            stream = plugin.ListAndWatch(pb.Empty())
            first = await asyncio.wait_for(stream.read(), 10)
            assert [d.ID for d in first.devices] == [g.uuid for g in fake.gpus]
            assert all(d.health == "Healthy" for d in first.devices)
            assert [d.topology.nodes[0].ID for d in first.devices] == [g.numa_node for g in fake.gpus]
            stream.cancel()
        async with run.kubelet.plugin(SHARED) as plugin:
            stream = plugin.ListAndWatch(pb.Empty())
            devices = await next_devices(stream)
            assert sorted(devices) == sorted(f"{g.uuid}::{s}" for g in fake.gpus for s in range(3))
            stream.cancel()


async def test_kubelet_restart_gets_a_new_registration(
    kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path
) -> None:
    async with running_plugin(fake, socket_dir, str(kmock.url)) as run:
        await run.kubelet.wait_registrations(2)
        assert run.runner.registrations == 1
        await run.kubelet.restart()  # the kubelet deletes the plugin sockets and serves a new kubelet.sock
        again = await run.kubelet.wait_registrations(4)
        assert {r.resource_name for r in again[2:]} == {GPU, SHARED}
        await until(lambda: run.runner.registrations == 2)
        async with run.kubelet.plugin(GPU) as plugin:  # the new socket serves
            devices = await next_devices(plugin.ListAndWatch(pb.Empty()))
            assert len(devices) == 4


async def test_registration_is_retried_until_the_kubelet_accepts(
    kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path
) -> None:
    async with running_plugin(fake, socket_dir, str(kmock.url)) as run:
        await run.kubelet.wait_registrations(2)
        run.kubelet.reject = "not now"
        await run.kubelet.restart()
        await until(lambda: run.kubelet.rejected >= 2)  # refused, then retried at the next poll
        assert run.runner.registrations == 1  # refused attempts are not counted
        run.kubelet.reject = None
        await run.kubelet.wait_registrations(4)
        await until(lambda: run.runner.registrations == 2)


async def test_allocate_gives_the_gpus_kelvin_assigned(
    kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path
) -> None:
    add_pods(kmock, pod("train", gpus=2, assigned="2,3"), pod("cpu-only"))
    async with running_plugin(fake, socket_dir, str(kmock.url)) as run, run.kubelet.plugin(GPU) as plugin:
        # the kubelet offers GPUs 0 and 1; the container gets kelvin's 2 and 3
        resp = await plugin.Allocate(allocate_request(uuid(fake, 0), uuid(fake, 1)), timeout=10)
    (container,) = resp.container_responses
    assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{uuid(fake, 2)},{uuid(fake, 3)}"}
    assert stored_annotations(kmock, "train")[ann.GPU_ALLOCATED] == "2,3"


async def test_allocate_takes_the_oldest_waiting_pod_then_the_next(
    kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path
) -> None:
    add_pods(
        kmock,
        pod("newer", gpus=1, assigned="3", scheduled="2026-12-01T04:00:05Z"),
        pod("older", gpus=1, assigned="1", scheduled="2026-12-01T04:00:01Z"),
        pod("done", gpus=1, assigned="0", scheduled="2026-12-01T03:00:00Z", phase="Succeeded"),
        pod("elsewhere", gpus=1, assigned="2", node="gpu-node-9", assigned_node="gpu-node-9"),
    )
    async with running_plugin(fake, socket_dir, str(kmock.url)) as run, run.kubelet.plugin(GPU) as plugin:
        first = await plugin.Allocate(allocate_request(uuid(fake, 0)), timeout=10)
        second = await plugin.Allocate(allocate_request(uuid(fake, 0)), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await plugin.Allocate(allocate_request(uuid(fake, 0)), timeout=10)
    assert first.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == uuid(fake, 1)
    assert second.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == uuid(fake, 3)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # both served: nobody is waiting any more
    assert stored_annotations(kmock, "older")[ann.GPU_ALLOCATED] == "1"
    assert stored_annotations(kmock, "newer")[ann.GPU_ALLOCATED] == "3"


async def test_shared_pod_gets_its_gpu_and_mps_limits(
    kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path
) -> None:
    pool = {ann.GPU_MEMORY: "20Gi", ann.GPU_SHARE: "250"}
    add_pods(kmock, pod("pool", shared=1, assigned="2", annotations=pool))
    async with running_plugin(fake, socket_dir, str(kmock.url)) as run, run.kubelet.plugin(SHARED) as plugin:
        resp = await plugin.Allocate(allocate_request(f"{uuid(fake, 0)}::1"), timeout=10)
    assert dict(resp.container_responses[0].envs) == {
        "NVIDIA_VISIBLE_DEVICES": uuid(fake, 2),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }
    assert stored_annotations(kmock, "pool")[ann.GPU_ALLOCATED] == "2"


async def test_cdi_strategy_names_cdi_devices(kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path) -> None:
    add_pods(kmock, pod("train", gpus=1, assigned="1"))
    async with (
        running_plugin(fake, socket_dir, str(kmock.url), cdi_kind="nvidia.com/gpu") as run,
        run.kubelet.plugin(GPU) as plugin,
    ):
        resp = await plugin.Allocate(allocate_request(uuid(fake, 1)), timeout=10)
    container = resp.container_responses[0]
    assert [d.name for d in container.cdi_devices] == [f"nvidia.com/gpu={uuid(fake, 1)}"]
    assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": "void"}  # not the image's "all"


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        ([pod("plain", gpus=1)], ["no pending pod bound here is waiting for 1 nvidia.com/gpu", "ml/plain"]),
        (
            [pod("bad", gpus=1, assigned="zero")],
            ["pod ml/bad: kelvin.dev/gpu-assigned='zero' is not a comma-separated"],
        ),
        ([pod("far", gpus=1, assigned="7")], ["names GPU 7", "does not serve (it serves GPUs 0,1,2,3)"]),
        ([pod("stale", gpus=1, assigned="1", assigned_node="gpu-node-2")], ["names another node: ml/stale"]),
        ([pod("two", gpus=2, assigned="1,2")], ["waiting for 1 nvidia.com/gpu"]),  # asks for 2: not this container
        ([], ["no pending pod bound here is waiting", "pods bound by kelvin's scheduler extender"]),
    ],
    ids=["absent", "malformed", "not-on-node", "other-node", "other-count", "no-pod"],
)
async def test_allocate_without_a_valid_assignment_is_a_clear_error(
    kmock: km.KubernetesEmulator,
    fake: FakeNvml,
    socket_dir: Path,
    pods: list[dict[str, Any]],
    expected: list[str],
) -> None:
    add_pods(kmock, *pods)
    async with running_plugin(fake, socket_dir, str(kmock.url)) as run, run.kubelet.plugin(GPU) as plugin:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await plugin.Allocate(allocate_request(uuid(fake, 0)), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    for text in expected:
        assert text in (err.value.details() or ""), err.value.details()
    assert all(ann.GPU_ALLOCATED not in stored_annotations(kmock, p["metadata"]["name"]) for p in pods)


async def test_allocate_when_the_api_server_is_unreachable(fake: FakeNvml, socket_dir: Path) -> None:
    async with running_plugin(fake, socket_dir, "http://127.0.0.1:9") as run, run.kubelet.plugin(GPU) as plugin:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await plugin.Allocate(allocate_request(uuid(fake, 0)), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert f"kelvin device plugin on node {NODE}: cannot read or mark this node's pods" in (err.value.details() or "")


async def test_preferred_allocation_prefers_kelvins_gpus(
    kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path
) -> None:
    add_pods(kmock, pod("train", gpus=2, assigned="3,1"), pod("pool", shared=1, assigned="2"))
    whole = [g.uuid for g in fake.gpus]
    slots = [f"{g.uuid}::{s}" for g in fake.gpus for s in range(4)]
    async with running_plugin(fake, socket_dir, str(kmock.url)) as run:
        async with run.kubelet.plugin(GPU) as plugin:
            resp = await plugin.GetPreferredAllocation(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(available_deviceIDs=whole, allocation_size=2),
                        # no pod asks for 3 GPUs: the kubelet's must-include, then the first available
                        pb.ContainerPreferredAllocationRequest(
                            available_deviceIDs=whole, must_include_deviceIDs=[whole[2]], allocation_size=3
                        ),
                    ]
                ),
                timeout=10,
            )
        async with run.kubelet.plugin(SHARED) as plugin:
            shared = await plugin.GetPreferredAllocation(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(available_deviceIDs=slots[1:], allocation_size=1)
                    ]
                ),
                timeout=10,
            )
    assert list(resp.container_responses[0].deviceIDs) == [whole[3], whole[1]]
    assert list(resp.container_responses[1].deviceIDs) == [whole[2], whole[0], whole[1]]
    assert list(shared.container_responses[0].deviceIDs) == [f"{whole[2]}::0"]
    assert ann.GPU_ALLOCATED not in stored_annotations(kmock, "train")  # a preference marks nothing


async def test_critical_xid_marks_the_gpu_and_its_slots_unhealthy(
    kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path
) -> None:
    async with (
        running_plugin(fake, socket_dir, str(kmock.url)) as run,
        run.kubelet.plugin(GPU) as plugin,
        run.kubelet.plugin(SHARED) as shared_plugin,
    ):
        stream = plugin.ListAndWatch(pb.Empty())
        shared_stream = shared_plugin.ListAndWatch(pb.Empty())
        assert set((await next_devices(stream)).values()) == {"Healthy"}
        await next_devices(shared_stream)
        fake.inject_xid(0, 13)  # an application's fault: not the GPU's
        fake.inject_xid(1, 79)  # fallen off the bus
        devices = await next_devices(stream)
        assert [d for d, h in devices.items() if h == "Unhealthy"] == [uuid(fake, 1)]
        sick_slots = [d for d, h in (await next_devices(shared_stream)).items() if h == "Unhealthy"]
        assert sorted(sick_slots) == [f"{uuid(fake, 1)}::{s}" for s in range(4)]
        # NVML still reads the GPU, yet it stays Unhealthy until the plugin restarts (as NVIDIA's plugin does)
        checks = run.runner.health_checks
        await until(lambda: run.runner.health_checks >= checks + 5)
        assert run.runner.state is not None and run.runner.state.unhealthy == frozenset({1})
        stream.cancel()
        shared_stream.cancel()


async def test_lost_gpu_is_unhealthy_until_it_reads_again(
    kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path
) -> None:
    add_pods(kmock, pod("train", gpus=1, assigned="2"))
    async with (
        running_plugin(fake, socket_dir, str(kmock.url), watch_xids=False) as run,
        run.kubelet.plugin(GPU) as plugin,
    ):
        stream = plugin.ListAndWatch(pb.Empty())
        await next_devices(stream)
        fake.lose_gpu(2)
        devices = await next_devices(stream)
        assert [d for d, h in devices.items() if h == "Unhealthy"] == [uuid(fake, 2)]
        with pytest.raises(grpc.aio.AioRpcError) as err:  # a pod assigned a lost GPU is refused, clearly
            await plugin.Allocate(allocate_request(uuid(fake, 0)), timeout=10)
        assert "its assigned GPU 2 on node gpu-node-1 is Unhealthy" in (err.value.details() or "")
        fake.restore_gpu(2)
        assert set((await next_devices(stream)).values()) == {"Healthy"}
        stream.cancel()


async def test_plugin_started_before_the_kubelet_registers_when_it_comes(
    kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path
) -> None:
    client = KubeClient(KubeConfig(server=str(kmock.url)), timeout_s=5.0)
    runner = DevicePluginRunner(
        PluginConfig(node=NODE, socket_dir=socket_dir, poll_s=0.05), fake, NodePods(client, NODE)
    )
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(runner.run(stop, ready))
    kubelet = FakeKubelet(socket_dir)
    try:
        await until(lambda: runner.polls >= 5)
        assert not ready.is_set() and runner.registrations == 0  # no kubelet.sock yet: waiting
        await kubelet.start()
        await asyncio.wait_for(ready.wait(), 10)
        assert {r.resource_name for r in await kubelet.wait_registrations(2)} == {GPU, SHARED}
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()
        await client.close()


async def test_allocate_calls_the_api_from_the_plugins_own_loop_with_one_session(
    kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path
) -> None:
    """grpc.aio runs the handlers as tasks of the plugin's event loop (no handler threads, no loop per call): the API
    client's one aiohttp session belongs to that loop and serves every Allocate."""
    add_pods(kmock, pod("a", gpus=1, assigned="1"), pod("b", gpus=1, assigned="2", scheduled="2026-12-01T04:00:05Z"))
    async with running_plugin(fake, socket_dir, str(kmock.url)) as run, run.kubelet.plugin(GPU) as plugin:
        await plugin.Allocate(allocate_request(uuid(fake, 1)), timeout=10)
        client = run.runner.pods.client
        (session,) = client._sessions.values()
        await plugin.Allocate(allocate_request(uuid(fake, 2)), timeout=10)
        assert list(client._sessions.items()) == [(asyncio.get_running_loop(), session)]


async def test_init_container_then_app_container_get_the_pods_gpus(
    kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path
) -> None:
    init = pod("init", gpus=2, assigned="3,2", scheduled="2026-12-01T04:00:00Z")
    init["spec"]["initContainers"] = [{"name": "fetch", "resources": {"limits": {GPU: "1"}}}]
    add_pods(kmock, init, pod("next", gpus=1, assigned="0", scheduled="2026-12-01T04:00:05Z"))
    async with running_plugin(fake, socket_dir, str(kmock.url)) as run, run.kubelet.plugin(GPU) as plugin:
        first = await plugin.Allocate(allocate_request(uuid(fake, 3)), timeout=10)  # the init container
        app = await plugin.Allocate(allocate_request(uuid(fake, 3), uuid(fake, 2)), timeout=10)
        other = await plugin.Allocate(allocate_request(uuid(fake, 0)), timeout=10)
    assert first.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == uuid(fake, 3)
    assert app.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == f"{uuid(fake, 3)},{uuid(fake, 2)}"
    assert other.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == uuid(fake, 0)
    assert stored_annotations(kmock, "init")[ann.GPU_ALLOCATED] == "3;3,2"


async def test_pods_bound_close_together_in_another_creation_order_are_logged(
    kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # independent of whatever level an earlier test left on the "scheduler_plugin" logger
    caplog.set_level(logging.WARNING, logger="scheduler_plugin.deviceplugin.service")
    add_pods(
        kmock,
        pod("b1", gpus=1, assigned="1", created="2026-12-01T03:59:30Z", annotations={AT: "2026-12-01T04:00:00.1Z"}),
        pod("b2", gpus=1, assigned="2", created="2026-12-01T03:59:00Z", annotations={AT: "2026-12-01T04:00:00.2Z"}),
    )
    async with running_plugin(fake, socket_dir, str(kmock.url)) as run, run.kubelet.plugin(GPU) as plugin:
        resp = await plugin.Allocate(allocate_request(uuid(fake, 1)), timeout=10)
    assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == uuid(fake, 1)  # bound first: served
    warned = [r.getMessage() for r in caplog.records if "bound less than 2 s apart" in r.getMessage()]
    assert len(warned) == 1 and "ml/b1" in warned[0] and "ml/b2" in warned[0]


async def test_waiting_for_the_kubelet_is_said_then_warned_then_registered(
    kmock: km.KubernetesEmulator, fake: FakeNvml, socket_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = KubeClient(KubeConfig(server=str(kmock.url)), timeout_s=5.0)
    config = PluginConfig(node=NODE, socket_dir=socket_dir, poll_s=0.02, wait_warn_s=0.2)
    runner = DevicePluginRunner(config, fake, NodePods(client, NODE))
    stop, ready = asyncio.Event(), asyncio.Event()
    kubelet = FakeKubelet(socket_dir)
    sock = str(socket_dir / "kubelet.sock")

    def said(level: int, text: str) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "scheduler_plugin.deviceplugin.plugin" and r.levelno == level and text in r.getMessage()
        ]

    with caplog.at_level(logging.INFO, logger="scheduler_plugin.deviceplugin.plugin"):
        task = asyncio.create_task(runner.run(stop, ready))
        try:
            await until(lambda: len(said(logging.WARNING, "still waiting")) >= 2)
            waiting = said(logging.INFO, "waiting for the kubelet")
            assert len(waiting) == 1 and f"no {sock} yet" in waiting[0]  # once, naming the socket
            warned = said(logging.WARNING, "still waiting")
            assert f"no {sock} after" in warned[0] and str(socket_dir) in warned[0]
            assert runner.polls >= 10 and len(warned) <= runner.polls // 5  # every wait_warn_s, not every poll
            await kubelet.start()
            await asyncio.wait_for(ready.wait(), 10)
            assert said(logging.INFO, "the kubelet is up after") and said(logging.INFO, "registered nvidia.com/gpu")
            n_warned = len(said(logging.WARNING, "still waiting"))
            await until(lambda: runner.polls >= 30)
            assert len(said(logging.WARNING, "still waiting")) == n_warned  # registered: no more warnings
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
            await kubelet.stop()
            await client.close()


def test_wait_warn_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="wait_warn_s: must be > 0 seconds, got 0"):
        PluginConfig(node=NODE, wait_warn_s=0)
