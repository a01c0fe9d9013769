"""One real kubelet node (tests/e2e/kubelet.py) with kelvin's device plugin: real containers run and stop, the plugin
registers its resources, hands a pod placed by kelvin-scheduler exactly its assigned GPUs, refuses a pod kelvin did
not assign, and registers again after a kubelet restart. Every check reads the API server, containerd or the kubelet's
pod logs.

kelvin-scheduler knows the node as it knows the fake ones: a ``kelvin exporter --fake`` for ``e2e-kubelet-1`` with
the device plugin's fake GPUs (same model, count and ``--fake-seed``, hence the same UUIDs), scraped by the suite's
Prometheus for this module (:func:`kubelet_telemetry`). So the GPU pods of the assignment and restart scenarios go
kube-scheduler -> kelvin's extender (filter, prioritize, bind) -> kubelet -> the plugin's Allocate; the pool,
init-container and refusal scenarios, which need GPUs or a binding of the test's choosing, are bound by kelvin's own
binder (``KubeBinder``) on the kelvin-scheduler token."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from scheduler_plugin.extender.binder import KubeBinder
from scheduler_plugin.kubeapi import KubeClient, KubeConfig
from scheduler_plugin.nvml.fake import FakeNvml
from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster, Process, spawn
from tests.e2e.conftest import IN_CI
from tests.e2e.images import busybox
from tests.e2e.install import helm_template
from tests.e2e.kelvin_scheduler import NAMESPACE as KELVIN_NAMESPACE
from tests.e2e.kelvin_scheduler import SCHEDULER_NAME, KelvinScheduler
from tests.e2e.kelvin_scheduler import SERVICE_ACCOUNT as SCHEDULER_SA
from tests.e2e.kubelet import IMAGE, LABEL, TOLERATION, KubeletNode, NodeUnavailable
from tests.e2e.kubelet import running as kubelet_running
from tests.e2e.pods import GPU_ASSIGNED, GPU_ASSIGNED_NODE
from tests.e2e.telemetry import Telemetry

GPUS = 8
SLOTS_PER_GPU = 16
FAKE_SEED = 20
#: The device plugin's fake model (its ``--fake-model`` default) and the node exporter's.
FAKE_MODEL = "H100-SXM-80GB"
RELEASE = "e2e-kubelet"
DEVICE_PLUGIN_SA = f"{RELEASE}-kelvin-device-plugin"
#: No scheduler has this name: the pods of the scenarios that choose their GPUs are bound by the test, as kelvin's
#: binder binds them.
NO_SCHEDULER = "e2e-kubelet-none"
GPU_ALLOCATED = "kelvin.dev/gpu-allocated"
WHOLE = "nvidia.com/gpu"
SHARED = "kelvin.dev/shared-gpu"
ENV = ["sh", "-c", "env; exec sleep infinity"]
#: The device plugin's refusal of a pod kelvin did not assign (docs/device-plugin.md, Refusals).
REFUSAL = "GPUs on kelvin nodes go only to pods bound by kelvin's scheduler extender"


@pytest.fixture(scope="module")
def kubelet_node(cluster: LoopbackCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeletNode]:
    try:
        with kubelet_running(cluster, tmp_path_factory.mktemp("kubelet-node")) as node:
            yield node
    except NodeUnavailable as exc:
        if IN_CI:
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def _uuids() -> list[str]:
    """The fake backend's GPU UUIDs by NVML index, as the plugin started with the same options reads them."""
    nvml = FakeNvml(GPUS, FAKE_MODEL, seed=FAKE_SEED)
    nvml.nvmlInit()
    try:
        return [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(GPUS)]
    finally:
        nvml.nvmlShutdown()


def _device_plugin_rbac(cluster: LoopbackCluster, helm_bin: str, out: Path) -> None:
    """The chart's device-plugin ServiceAccount, ClusterRole and ClusterRoleBinding (devicePlugin.enabled): the plugin
    runs with exactly the rights the chart gives it."""
    values = out / "values.yaml"
    values.write_text(yaml.safe_dump({"devicePlugin": {"enabled": True}}))
    manifest = helm_template(helm_bin, RELEASE, KELVIN_NAMESPACE, out / "chart.yaml", [values])
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    docs = [
        d
        for d in yaml.safe_load_all(manifest.read_text())
        if d and d["kind"] in kinds and d["metadata"]["name"] == DEVICE_PLUGIN_SA
    ]
    assert {d["kind"] for d in docs} == kinds, [(d["kind"], d["metadata"]["name"]) for d in docs]
    rbac = out / "device-plugin-rbac.yaml"
    rbac.write_text(yaml.safe_dump_all(docs))
    cluster.kubectl("apply", "--server-side", "-f", str(rbac))


@pytest.fixture(scope="module")
def device_plugin(
    cluster: LoopbackCluster, kelvin_installed: None, kubelet_node: KubeletNode, helm_bin: str, tmp_path_factory: Any
) -> Iterator[Process]:
    """``kelvin device-plugin`` (fake NVML, 8 GPUs) on the node's device-plugins folder, on the chart's
    device-plugin ServiceAccount's token."""
    out = tmp_path_factory.mktemp("device-plugin")
    _device_plugin_rbac(cluster, helm_bin, out)
    kubeconfig = cluster.token_kubeconfig(KELVIN_NAMESPACE, DEVICE_PLUGIN_SA)
    kelvin = Path(sys.executable).with_name("kelvin")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KELVIN_") and k != "KUBECONFIG"}
    plugin = spawn(
        "kelvin-device-plugin",
        [
            kelvin,
            "device-plugin",
            f"--node-name={kubelet_node.name}",
            f"--socket-dir={kubelet_node.device_plugin_dir}",
            f"--kubeconfig={kubeconfig}",
            f"--shared-slots-per-gpu={SLOTS_PER_GPU}",
            "--fake",
            f"--fake-gpus={GPUS}",
            f"--fake-seed={FAKE_SEED}",
            "--health-interval=1",
        ],
        cluster.logs,
        env=env,
    )
    try:
        yield plugin
    finally:
        plugin.stop(timeout=10)


@pytest.fixture(scope="module")
def kubelet_telemetry(
    kubelet_node: KubeletNode, telemetry: Telemetry, kelvin_scheduler: KelvinScheduler
) -> Iterator[Telemetry]:
    """The node's exporter in the suite's telemetry, with the device plugin's fake GPUs (model, count, seed: the same
    UUIDs), until the extender has the node fresh; afterwards the exporter goes and the extender is restarted (its
    snapshot: the suite's nodes only)."""
    telemetry.add_exporter(kubelet_node.name, FAKE_MODEL, seed=FAKE_SEED)
    try:
        series = telemetry.wait_query(f'kelvin_gpu_memory_total_bytes{{node="{kubelet_node.name}"}}')
        by_index = {int(s["metric"]["gpu"]): s["metric"]["uuid"] for s in series}
        assert [by_index[i] for i in range(GPUS)] == _uuids(), by_index  # the GPUs the device plugin serves

        def known() -> bool:
            kelvin_scheduler.check_alive()
            try:
                return bool(kelvin_scheduler.explain(_kelvin_pod("probe", ENV, 1), kubelet_node.name)["fits"])
            except httpx.HTTPStatusError as exc:  # 400 "... is not in kelvin's snapshot" until its next refresh
                if exc.response.status_code == 400 and "not in kelvin's snapshot" in exc.response.text:
                    return False
                raise

        wait_for(f"kelvin: a 1-GPU pod fits {kubelet_node.name}", known, 60, 0.5)
        yield telemetry
    finally:
        telemetry.remove_exporter(kubelet_node.name)
        kelvin_scheduler.restart_extender()


def _container(name: str, command: list[str], gpus: int = 0, resource: str = WHOLE) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "image": IMAGE,
        "imagePullPolicy": "Never",  # no registry: the image was imported into the node's containerd
        "command": command,
    }
    if gpus:
        container["resources"] = {"limits": {resource: str(gpus)}}
    return container


def _pod(
    name: str,
    command: list[str],
    *,
    gpus: int = 0,
    resource: str = WHOLE,
    scheduler: str | None = None,
    grace_s: int = 5,
    annotations: dict[str, str] | None = None,
    init: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "containers": [_container("main", command, gpus, resource)],
        "tolerations": [TOLERATION],
        "terminationGracePeriodSeconds": grace_s,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
    }
    if init is not None:
        spec["initContainers"] = [init]
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    else:
        spec["nodeSelector"] = {LABEL: "true"}
    metadata = {"name": name, "annotations": annotations or {}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _kelvin_pod(name: str, command: list[str], gpus: int) -> dict[str, Any]:
    """A pod for kelvin-scheduler (kube-scheduler with the chart's configuration and kelvin's extender), kept to the
    node by its label and toleration."""
    pod = _pod(name, command, gpus=gpus)
    pod["spec"]["schedulerName"] = SCHEDULER_NAME
    return pod


def _get(cluster: LoopbackCluster, namespace: str, name: str) -> dict[str, Any] | None:
    pod = cluster.api.get_or_none(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return dict(pod) if pod is not None else None


def _running(cluster: LoopbackCluster, node: KubeletNode, namespace: str, name: str) -> dict[str, Any] | None:
    node.check_alive()
    pod = _get(cluster, namespace, name)
    if pod is None:
        return None
    assert pod["status"].get("phase") not in ("Failed", "Succeeded"), pod["status"]
    statuses = pod["status"].get("containerStatuses", [])
    if pod["status"].get("phase") == "Running" and statuses and all("running" in s["state"] for s in statuses):
        return pod
    return None


def _log_line(node: KubeletNode, namespace: str, name: str, prefix: str, container: str = "main") -> str | None:
    for line in node.container_log(namespace, name, container):
        if line.startswith(prefix):
            return line
    return None


def test_a_host_network_pod_runs_on_the_real_kubelet(
    cluster: LoopbackCluster, kubelet_node: KubeletNode, namespace: str
) -> None:
    cluster.api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        _pod("hello", ["sh", "-c", "echo hello from $(cat /proc/1/comm); exec sleep infinity"]),
    )
    pod = wait_for("pod hello Running", lambda: _running(cluster, kubelet_node, namespace, "hello"), 120)
    assert pod["spec"]["nodeName"] == kubelet_node.name  # default-scheduler placed it by the node's label
    (status,) = pod["status"]["containerStatuses"]
    assert status["containerID"].startswith("containerd://") and status["ready"] is True
    task = kubelet_node.task(status["containerID"])
    assert task is not None and task[1] == "RUNNING", task
    line = wait_for("the container's output", lambda: _log_line(kubelet_node, namespace, "hello", "hello"), 30)
    assert line == "hello from sh"


def test_an_eviction_really_stops_the_container(
    cluster: LoopbackCluster, kubelet_node: KubeletNode, namespace: str
) -> None:
    cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", _pod("victim", ["sleep", "infinity"], grace_s=3))
    pod = wait_for("pod victim Running", lambda: _running(cluster, kubelet_node, namespace, "victim"), 120)
    container_id = pod["status"]["containerStatuses"][0]["containerID"]
    task = kubelet_node.task(container_id)
    assert task is not None and task[1] == "RUNNING", task
    pid = task[0]
    assert Path(f"/proc/{pid}").exists()
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "victim", "namespace": namespace}}
    cluster.api.create(f"/api/v1/namespaces/{namespace}/pods/victim/eviction", eviction)
    # the kubelet stops the container, then the pod object goes: nothing else finishes deletions on this node
    wait_for("evicted pod gone", lambda: _get(cluster, namespace, "victim") is None, 60)
    after = kubelet_node.task(container_id)
    assert after is None or after[1] == "STOPPED", after
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/cmdline").read_bytes() != b"sleep\0infinity\0"


def _kelvin_bind(cluster: LoopbackCluster, namespace: str, name: str, node: str, gpus: tuple[int, ...]) -> None:
    """Bind the pod as kelvin's extender does: its binder (KubeBinder) on the kelvin-scheduler ServiceAccount's token,
    the Binding carrying ``kelvin.dev/gpu-assigned``, ``-node`` and ``-at`` (none when ``gpus`` is empty, as for a
    pod without GPUs)."""
    pod = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    kubeconfig = cluster.token_kubeconfig(KELVIN_NAMESPACE, SCHEDULER_SA)

    async def bind() -> None:
        binder = KubeBinder(KubeClient(KubeConfig.from_kubeconfig(kubeconfig)))
        try:
            await binder.bind(namespace, name, pod["metadata"]["uid"], node, gpus)
        finally:
            await binder.close()

    asyncio.run(bind())


def _allocatable(cluster: LoopbackCluster, node: KubeletNode) -> dict[str, str]:
    node.check_alive()
    return dict(cluster.api.get(f"/api/v1/nodes/{node.name}")["status"].get("allocatable", {}))


def _registered(cluster: LoopbackCluster, node: KubeletNode, plugin: Process) -> bool:
    if not plugin.alive():
        raise RuntimeError(f"kelvin device-plugin exited ({plugin.popen.returncode}):\n{plugin.tail()}")
    allocatable = _allocatable(cluster, node)
    return allocatable.get("nvidia.com/gpu") == str(GPUS) and allocatable.get("kelvin.dev/shared-gpu") == str(
        GPUS * SLOTS_PER_GPU
    )


def _scheduled_by(cluster: LoopbackCluster, namespace: str, name: str) -> set[str]:
    """The components that reported the pod's ``Scheduled`` Event (kube-scheduler names its profile)."""
    events = cluster.api.get(
        f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"involvedObject.name={name},reason=Scheduled"
    )["items"]
    return {e.get("reportingComponent") or e.get("source", {}).get("component", "") for e in events}


def _visible_devices(
    cluster: LoopbackCluster, node: KubeletNode, namespace: str, name: str, gpus: int
) -> tuple[list[str], tuple[int, ...], dict[str, Any]]:
    """Create a pod asking for ``gpus`` GPUs for kelvin-scheduler and return, once it runs, the container's
    NVIDIA_VISIBLE_DEVICES (from its ``env`` output in the pod log), the GPUs kelvin assigned, and the pod."""
    cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", _kelvin_pod(name, ENV, gpus))
    pod = wait_for(f"pod {name} Running", lambda: _running(cluster, node, namespace, name), 120)
    annotations = pod["metadata"]["annotations"]
    assert pod["spec"]["nodeName"] == node.name and annotations[GPU_ASSIGNED_NODE] == node.name, pod["metadata"]
    assigned = tuple(int(i) for i in annotations[GPU_ASSIGNED].split(","))
    assert len(set(assigned)) == gpus and all(0 <= i < GPUS for i in assigned), annotations
    # placed and bound through kube-scheduler (the kelvin-scheduler profile), not by the test
    assert wait_for(f"{name}'s Scheduled Event", lambda: _scheduled_by(cluster, namespace, name), 30) == {
        SCHEDULER_NAME
    }
    line = wait_for(
        f"{name}'s environment in its log",
        lambda: _log_line(node, namespace, name, "NVIDIA_VISIBLE_DEVICES="),
        30,
    )
    return line.removeprefix("NVIDIA_VISIBLE_DEVICES=").split(","), assigned, pod


def _delete(cluster: LoopbackCluster, node: KubeletNode, namespace: str, name: str) -> None:
    """Delete the pod and wait until the kubelet has stopped it and the object is gone (its GPUs free again for the
    scenarios that bind GPUs of their own choosing)."""
    cluster.api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
    wait_for(f"pod {name} gone", lambda: node.check_alive() or _get(cluster, namespace, name) is None, 60)


def test_the_device_plugin_registers_with_the_kubelet(
    cluster: LoopbackCluster, kubelet_node: KubeletNode, device_plugin: Process
) -> None:
    wait_for("nvidia.com/gpu and kelvin.dev/shared-gpu allocatable", lambda: _registered(cluster, kubelet_node,
             device_plugin), 60)  # fmt: skip
    node = cluster.api.get(f"/api/v1/nodes/{kubelet_node.name}")
    assert node["status"]["capacity"]["nvidia.com/gpu"] == str(GPUS)
    assert node["status"]["capacity"]["kelvin.dev/shared-gpu"] == str(GPUS * SLOTS_PER_GPU)
    for sock in ("kelvin-gpu.sock", "kelvin-shared-gpu.sock"):
        assert (kubelet_node.device_plugin_dir / sock).is_socket()


def test_a_pod_placed_by_kelvin_scheduler_gets_exactly_its_assigned_gpus(
    cluster: LoopbackCluster,
    kubelet_node: KubeletNode,
    device_plugin: Process,
    kubelet_telemetry: Telemetry,
    namespace: str,
) -> None:
    """kube-scheduler (chart configuration) -> kelvin's filter, prioritize and bind -> the kubelet -> the plugin's
    Allocate: the container sees exactly the GPUs kelvin chose, in the assignment's order."""
    wait_for("device plugin registered", lambda: _registered(cluster, kubelet_node, device_plugin), 60)
    uuids = _uuids()
    try:
        visible, assigned, pod = _visible_devices(cluster, kubelet_node, namespace, "assigned", 2)
        assert visible == [uuids[i] for i in assigned]
        # the plugin's record of what it served
        assert pod["metadata"]["annotations"][GPU_ALLOCATED] == ",".join(map(str, assigned))
    finally:
        _delete(cluster, kubelet_node, namespace, "assigned")


def _environment(node: KubeletNode, namespace: str, name: str, container: str = "main") -> dict[str, str]:
    """The container's environment from its ``env`` output in the pod log, once NVIDIA_VISIBLE_DEVICES is in it."""
    wait_for(
        f"{name}/{container}'s environment in its log",
        lambda: _log_line(node, namespace, name, "NVIDIA_VISIBLE_DEVICES=", container),
        30,
    )
    return dict(line.split("=", 1) for line in node.container_log(namespace, name, container) if "=" in line)


def test_a_memory_pool_pod_gets_its_gpu_and_mps_limits(
    cluster: LoopbackCluster, kubelet_node: KubeletNode, device_plugin: Process, namespace: str
) -> None:
    """One kelvin.dev/shared-gpu slot: the container sees the assigned GPU and the MPS limits of its pool."""
    wait_for("device plugin registered", lambda: _registered(cluster, kubelet_node, device_plugin), 60)
    pool = {"kelvin.dev/gpu-memory": "20Gi", "kelvin.dev/gpu-share": "250"}
    cluster.api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        _pod("pool", ENV, gpus=1, resource=SHARED, scheduler=NO_SCHEDULER, annotations=pool),
    )
    _kelvin_bind(cluster, namespace, "pool", kubelet_node.name, (3,))
    pod = wait_for("pod pool Running", lambda: _running(cluster, kubelet_node, namespace, "pool"), 120)
    env = _environment(kubelet_node, namespace, "pool")
    assert env["NVIDIA_VISIBLE_DEVICES"] == _uuids()[3]
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert pod["metadata"]["annotations"][GPU_ALLOCATED] == "3"


def test_an_init_container_and_the_app_share_the_assigned_gpus_as_kelvin_charges(
    cluster: LoopbackCluster, kubelet_node: KubeletNode, device_plugin: Process, namespace: str
) -> None:
    """The kubelet calls Allocate per container: the init container (1 GPU) gets the first assigned GPU, the app
    container (2) both; the pod holds max(1, 2) = 2 GPUs, as kelvin's extender charges it."""
    wait_for("device plugin registered", lambda: _registered(cluster, kubelet_node, device_plugin), 60)
    init = _container("init", ["env"], gpus=1)
    cluster.api.create(
        f"/api/v1/namespaces/{namespace}/pods", _pod("staged", ENV, gpus=2, scheduler=NO_SCHEDULER, init=init)
    )
    _kelvin_bind(cluster, namespace, "staged", kubelet_node.name, (4, 6))
    pod = wait_for("pod staged Running", lambda: _running(cluster, kubelet_node, namespace, "staged"), 120)
    uuids = _uuids()
    assert _environment(kubelet_node, namespace, "staged", "init")["NVIDIA_VISIBLE_DEVICES"] == uuids[4]
    assert _environment(kubelet_node, namespace, "staged")["NVIDIA_VISIBLE_DEVICES"] == f"{uuids[4]},{uuids[6]}"
    assert pod["metadata"]["annotations"][GPU_ALLOCATED] == "4;4,6"


def test_a_pod_without_kelvins_assignment_fails_admission(
    cluster: LoopbackCluster, kubelet_node: KubeletNode, device_plugin: Process, namespace: str
) -> None:
    wait_for("device plugin registered", lambda: _registered(cluster, kubelet_node, device_plugin), 60)
    cluster.api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        _pod("unassigned", ["sleep", "infinity"], gpus=1, scheduler=NO_SCHEDULER),
    )
    # bound to the node without GPUs chosen (as another scheduler would bind it): no kelvin.dev/gpu-assigned
    _kelvin_bind(cluster, namespace, "unassigned", kubelet_node.name, ())

    def failed() -> dict[str, Any] | None:
        kubelet_node.check_alive()
        pod = _get(cluster, namespace, "unassigned")
        return pod if pod is not None and pod["status"].get("phase") == "Failed" else None

    pod = wait_for("pod unassigned Failed", failed, 60)
    status = pod["status"]
    assert status["reason"] == "UnexpectedAdmissionError", status
    assert REFUSAL in status["message"] and f"{namespace}/unassigned" in status["message"], status["message"]
    assert not status.get("containerStatuses") or all("running" not in c["state"] for c in status["containerStatuses"])
    assert GPU_ASSIGNED not in pod["metadata"].get("annotations", {})


def test_the_plugin_registers_again_after_a_kubelet_restart(
    cluster: LoopbackCluster,
    kubelet_node: KubeletNode,
    device_plugin: Process,
    kubelet_telemetry: Telemetry,
    namespace: str,
) -> None:
    wait_for("device plugin registered", lambda: _registered(cluster, kubelet_node, device_plugin), 60)
    gpu_sock = kubelet_node.device_plugin_dir / "kelvin-gpu.sock"

    def identity() -> tuple[int, int] | None:  # a new socket file may get the deleted one's inode number back
        with contextlib.suppress(FileNotFoundError):
            st = gpu_sock.stat()
            return st.st_ino, st.st_ctime_ns
        return None

    before = identity()
    assert before is not None
    kubelet_node.restart_kubelet()
    # the restarted kubelet deletes the plugins' sockets; the plugin serves and registers again on new ones
    wait_for("the plugin's new socket", lambda: identity() not in (None, before), 60)
    kubelet_node.wait_ready()
    wait_for("resources allocatable again", lambda: _registered(cluster, kubelet_node, device_plugin), 60)
    uuids = _uuids()
    visible, (gpu,), pod = _visible_devices(cluster, kubelet_node, namespace, "after-restart", 1)
    assert visible == [uuids[gpu]]
    assert pod["metadata"]["annotations"][GPU_ALLOCATED] == str(gpu)


def test_the_node_images_are_one_layer_of_static_busybox(tmp_path: Path) -> None:
    """The docker-archive ``ctr images import`` reads: each image's config names the layer's digest, the sandbox image
    runs ``sleep infinity``, the layer holds busybox with the applets the scenarios run, the same busybox gives the
    same bytes, and a dynamically linked busybox is refused (no cluster needed)."""
    if not busybox.BUSYBOX.is_file() or not busybox.is_static(busybox.BUSYBOX):
        reason = f"no static {busybox.BUSYBOX}: apt-get install busybox-static"
        pytest.fail(reason) if IN_CI else pytest.skip(reason)
    archive = tmp_path / "images.tar"
    assert busybox.build(archive) == (busybox.IMAGE, busybox.SANDBOX_IMAGE)
    with tarfile.open(archive) as tar:

        def member(name: str) -> bytes:
            file = tar.extractfile(name)
            assert file is not None, name
            return file.read()

        manifest = json.loads(member("manifest.json"))
        configs = {m["RepoTags"][0]: json.loads(member(m["Config"])) for m in manifest}
        (layer_path,) = {layer for m in manifest for layer in m["Layers"]}
        layer = member(layer_path)
    assert set(configs) == {busybox.IMAGE, busybox.SANDBOX_IMAGE}
    for config in configs.values():
        assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    sandbox = configs[busybox.SANDBOX_IMAGE]["config"]
    assert sandbox["Entrypoint"] + sandbox["Cmd"] == ["/bin/sleep", "infinity"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as rootfs:
        members = {m.name: m for m in rootfs.getmembers()}
    assert members["bin/busybox"].size == busybox.BUSYBOX.stat().st_size
    assert all(members[f"bin/{applet}"].linkname == "busybox" for applet in ("sh", "sleep", "env"))
    busybox.build(tmp_path / "again.tar")
    assert (tmp_path / "again.tar").read_bytes() == archive.read_bytes()
    dynamic = Path("/bin/sh").resolve()  # dash: linked against libc
    assert not busybox.is_static(dynamic)
    with pytest.raises(FileNotFoundError, match="not statically linked"):
        busybox.build(tmp_path / "bad.tar", dynamic)
