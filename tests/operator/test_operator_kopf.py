"""The real kopf operator against a fake API server (kmock): the webhook server over HTTPS answering
AdmissionReviews, and the node timer tainting and evicting through the pods index."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import jsonpatch  # type: ignore[import-untyped]
import kmock as km
import kopf
import pytest
from kelvin_operator.config import OperatorConfig
from kelvin_operator.handlers import build_registry
from kelvin_operator.runtime import Runtime
from kelvin_operator.tls import self_signed
from kopf._core.engines.peering import Identity  # kopf.operator(identity=...) takes this NewType
from opkit import gpu, node, node_obj, pod, proc
from opkube import NODES, PODS, evictions_succeed

from scheduler_plugin.kube import KubeConfig
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.gpu import GpuNode


class FixedSource:
    """A telemetry source answering the nodes it was given (now-stamped)."""

    name = "fixed"

    def __init__(self, nodes: Sequence[GpuNode]) -> None:
        self.nodes = list(nodes)

    async def fetch(self) -> Sequence[GpuNode]:
        return [replace(n, observed_at=time.time()) for n in self.nodes]

    async def close(self) -> None:
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def declare(kmock: km.KubernetesEmulator, peering: bool) -> None:
    info = km.ResourceInfo
    kmock.resources["v1/pods"] = info(
        kind="Pod", namespaced=True, verbs=["list", "watch", "get", "patch"], subresources=["eviction"]
    )
    kmock.resources["v1/nodes"] = info(kind="Node", namespaced=False, verbs=["list", "watch", "get", "patch"])
    kmock.resources["v1/events"] = info(kind="Event", namespaced=True, verbs=["create"])
    # kopf waits for namespaces and CRDs to be discoverable (clusterwide, scanning disabled: neither is listed)
    kmock.resources["v1/namespaces"] = info(kind="Namespace", namespaced=False, verbs=["list", "watch"])
    # and, with admission handlers, for the webhook configuration resources (listed only when kopf manages them)
    for plural, kind in (
        ("validatingwebhookconfigurations", "ValidatingWebhookConfiguration"),
        ("mutatingwebhookconfigurations", "MutatingWebhookConfiguration"),
    ):
        kmock.resources[f"admissionregistration.k8s.io/v1/{plural}"] = info(kind=kind, namespaced=False, verbs=["list"])
    kmock.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = info(
        kind="CustomResourceDefinition", namespaced=False, verbs=["list", "watch"]
    )
    if peering:
        kmock.resources["kopf.dev/v1/clusterkopfpeerings"] = info(
            kind="ClusterKopfPeering", namespaced=False, verbs=["list", "watch", "get", "patch"]
        )


@contextlib.asynccontextmanager
async def running(
    kmock: km.KubernetesEmulator, cfg: OperatorConfig, nodes: Sequence[GpuNode], *, priority: int = 0, ident: str = "r0"
) -> AsyncIterator[list[Runtime]]:
    """One replica of the operator (kopf.operator in this loop); yields a list holding its runtime once started."""
    declare(kmock, peering=not cfg.standalone)
    kube_config = KubeConfig(server=str(kmock.url))
    runtimes: list[Runtime] = []

    async def start(c: OperatorConfig) -> Runtime:
        runtimes.append(await Runtime.start(c, kube_config, FixedSource(nodes), refresh_interval_s=0.2))
        return runtimes[-1]

    registry = build_registry(cfg, start, kube_config)
    stop, ready = asyncio.Event(), asyncio.Event()
    peering = {} if cfg.standalone else {"peering_name": cfg.peering, "priority": priority, "identity": Identity(ident)}
    task = asyncio.create_task(
        kopf.operator(
            registry=registry, clusterwide=True, standalone=cfg.standalone, stop_flag=stop, ready_flag=ready, **peering
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 20)
        yield runtimes
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


@pytest.fixture
def cert(tmp_path: Path) -> tuple[Path, Path]:
    return self_signed(tmp_path, ["localhost", "127.0.0.1"])


def review(obj: dict[str, Any], uid: str = "r1") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": obj["metadata"]["namespace"],
            "name": obj["metadata"]["name"],
            "object": obj,
            "userInfo": {"username": "tester"},
            "dryRun": False,
        },
    }


async def wait_for(cond: Any, timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.05)


async def webhook_up(http: httpx.AsyncClient, url: str, timeout: float = 15.0) -> None:
    """Until the webhook server answers (it starts after the first snapshot is taken), instead of a fixed sleep."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                await http.post(f"{url}/gpu-env", json=review(pod("probe", gpus=0), "probe"))
                return
            except httpx.TransportError:
                await asyncio.sleep(0.05)


async def test_admission_over_https(kmock: km.KubernetesEmulator, cert: tuple[Path, Path]) -> None:
    port = free_port()
    cfg = OperatorConfig(
        standalone=True,
        metrics_port=0,
        interval_s=3600,
        webhook={"addr": "127.0.0.1", "port": port, "host": "localhost", "certfile": cert[0], "pkeyfile": cert[1]},
    )
    fleet = [node("n1", gpu(0, total_gib=80), mps=True)]
    ctx = ssl.create_default_context(cafile=str(cert[0]))
    async with running(kmock, cfg, fleet), httpx.AsyncClient(verify=ctx, timeout=10) as http:
        url = f"https://localhost:{port}"
        await webhook_up(http, url)  # the first snapshot is taken at startup; the server starts right after

        too_big = pod("big", annotations={ann.GPU_MEMORY: "100Gi"}, gpus=1)
        r = (await http.post(f"{url}/gpu-memory", json=review(too_big, "u1"))).json()
        assert r["kind"] == "AdmissionReview" and r["response"]["uid"] == "u1"
        assert r["response"]["allowed"] is False
        assert "larger than the largest GPU in the cluster (H100, 80.0 GiB)" in r["response"]["status"]["message"]
        assert r["response"]["status"]["code"] == 400

        bad = pod("bad", annotations={ann.GPU_MEMORY: "twenty gigs"}, gpus=1)
        r = (await http.post(f"{url}/gpu-memory", json=review(bad))).json()
        assert (
            not r["response"]["allowed"] and "kelvin.dev/gpu-memory='twenty gigs'" in r["response"]["status"]["message"]
        )

        multi = pod("multi", annotations={ann.GPU_MEMORY: "20Gi"}, gpus=2)
        r = (await http.post(f"{url}/gpu-memory", json=review(multi))).json()
        assert not r["response"]["allowed"] and "requests 2 whole GPUs" in r["response"]["status"]["message"]

        ok = pod("ok", annotations={ann.GPU_MEMORY: "20Gi", ann.GPU_SHARE: "250"}, gpus=1)
        r = (await http.post(f"{url}/gpu-memory", json=review(ok))).json()
        assert r["response"]["allowed"] is True

        r = (await http.post(f"{url}/gpu-env", json=review(ok, "m1"))).json()
        assert r["response"]["allowed"] is True and r["response"]["patchType"] == "JSONPatch"
        patched = jsonpatch.apply_patch(ok, json.loads(base64.b64decode(r["response"]["patch"])))
        env = {e["name"]: e["value"] for e in patched["spec"]["containers"][0]["env"]}
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.250"

        # a whole-GPU pod is left alone
        whole = pod("whole", gpus=1)
        r = (await http.post(f"{url}/gpu-env", json=review(whole))).json()
        assert r["response"]["allowed"] is True and "patch" not in r["response"]

        # a pool-only pod (no GPU resource) would bypass the extender: refused, naming both fixes
        pool_only = pod("pool-only", annotations={ann.GPU_MEMORY: "20Gi"}, gpus=0)
        r = (await http.post(f"{url}/gpu-memory", json=review(pool_only))).json()
        assert not r["response"]["allowed"]
        assert "nvidia.com/gpu: 1" in r["response"]["status"]["message"]
        assert "devicePlugin.enabled=true" in r["response"]["status"]["message"]
        r = (await http.post(f"{url}/gpu-env", json=review(pool_only, "m2"))).json()
        patched = jsonpatch.apply_patch(pool_only, json.loads(base64.b64decode(r["response"]["patch"])))
        assert "kelvin.dev/shared-gpu" not in patched["spec"]["containers"][0]["resources"].get("limits", {})

        # and plain HTTP is refused: the server only speaks TLS
        with pytest.raises(httpx.HTTPError):
            async with httpx.AsyncClient(timeout=3) as plain:
                await plain.post(f"http://localhost:{port}/gpu-memory", json=review(ok))


async def test_pool_only_pod_gets_a_shared_gpu_slot(kmock: km.KubernetesEmulator, cert: tuple[Path, Path]) -> None:
    """webhook.sharedGpuResource (the device plugin is on): the mutating webhook requests kelvin.dev/shared-gpu: 1
    for a pool-only pod, and the validating webhook, which sees the mutated pod, admits it."""
    port = free_port()
    cfg = OperatorConfig(
        standalone=True,
        metrics_port=0,
        interval_s=3600,
        webhook={
            "addr": "127.0.0.1",
            "port": port,
            "host": "localhost",
            "certfile": cert[0],
            "pkeyfile": cert[1],
            "shared_gpu_resource": True,
        },
    )
    ctx = ssl.create_default_context(cafile=str(cert[0]))
    async with running(kmock, cfg, [node("n1", gpu(0, total_gib=80))]), httpx.AsyncClient(verify=ctx) as http:
        url = f"https://localhost:{port}"
        await webhook_up(http, url)
        p = pod("pool-only", annotations={ann.GPU_MEMORY: "20Gi"}, gpus=0)
        r = (await http.post(f"{url}/gpu-env", json=review(p, "m1"))).json()
        assert r["response"]["allowed"] is True
        patched = jsonpatch.apply_patch(p, json.loads(base64.b64decode(r["response"]["patch"])))
        resources = patched["spec"]["containers"][0]["resources"]
        assert resources["requests"]["kelvin.dev/shared-gpu"] == "1" == resources["limits"]["kelvin.dev/shared-gpu"]
        r = (await http.post(f"{url}/gpu-memory", json=review(patched, "v1"))).json()
        assert r["response"]["allowed"] is True
        # had the mutating webhook not run, the pod is still refused
        r = (await http.post(f"{url}/gpu-memory", json=review(p, "v2"))).json()
        assert not r["response"]["allowed"] and "did not run" in r["response"]["status"]["message"]


async def test_timer_taints_and_evicts_through_the_index(kmock: km.KubernetesEmulator) -> None:
    evictions_succeed(kmock)
    kmock.objects[NODES, None, "n1"] = node_obj("n1")
    kmock.objects[PODS, "ml", "hot"] = pod("hot", gpu_indices="0", now=time.time())
    kmock.objects[PODS, "ml", "cpu"] = pod("cpu", gpus=0, now=time.time())
    cfg = OperatorConfig(
        standalone=True, metrics_port=0, interval_s=0.5, webhook={"enabled": False}, protection={"min_pod_age_s": 0}
    )
    fleet = [node("n1", gpu(0, 91.0, procs=(proc("hot", 10),)))]
    async with running(kmock, cfg, fleet):
        await wait_for(lambda: len(kmock["post", PODS, km.subresource("eviction")]) >= 1)
        taints = kmock.objects[NODES, None, "n1"]["spec"]["taints"]
        assert [t["key"] for t in taints] == ["kelvin.dev/thermal"]
    evicted = [str(r.url.path) for r in kmock["post", PODS, km.subresource("eviction")]]
    assert set(evicted) == {"/api/v1/namespaces/ml/pods/hot/eviction"}


async def test_two_replicas_only_the_peering_leader_acts(kmock: km.KubernetesEmulator) -> None:
    evictions_succeed(kmock)
    now = time.time()
    kmock.objects[NODES, None, "n1"] = node_obj("n1")
    kmock.objects[PODS, "ml", "hot"] = pod("hot", gpu_indices="0", now=now)
    kmock.objects[km.resource("kopf.dev", "v1", "clusterkopfpeerings"), None, "kelvin"] = {
        "apiVersion": "kopf.dev/v1",
        "kind": "ClusterKopfPeering",
        "metadata": {"name": "kelvin"},
        "status": {},
    }
    cfg = OperatorConfig(metrics_port=0, interval_s=0.3, webhook={"enabled": False}, protection={"min_pod_age_s": 0})
    fleet = [node("n1", gpu(0, 91.0, procs=(proc("hot", 10),)))]
    async with running(kmock, cfg, fleet, priority=200, ident="leader") as leader:
        await wait_for(lambda: bool(leader) and "n1" in leader[0].reconciler.states)
        async with running(kmock, cfg, fleet, priority=100, ident="follower") as follower:
            await wait_for(lambda: len(kmock["post", PODS, km.subresource("eviction")]) >= 1)
            await asyncio.sleep(1.5)  # several timer intervals in which the follower would have acted
            assert follower[0].reconciler.states == {}
        status = kmock.objects[km.resource("kopf.dev", "v1", "clusterkopfpeerings"), None, "kelvin"]["status"]
        assert "leader" in status
    # (kmock's direct deletion sends no watch event, so the index may still list the pod and the leader may retry
    # it, getting a 404; what matters is that the follower never acted)
    assert {str(r.url.path) for r in kmock["post", PODS, km.subresource("eviction")]} == {
        "/api/v1/namespaces/ml/pods/hot/eviction"
    }


async def test_cli_runs_the_operator(kmock: km.KubernetesEmulator) -> None:
    """``kelvin operator`` as a process: kopf starts, watches nodes and pods, serves /metrics and the webhooks, and
    stops cleanly on SIGTERM."""
    import os
    import signal
    import sys

    declare(kmock, peering=False)
    kmock.objects[NODES, None, "gpu-node-1"] = node_obj("gpu-node-1")
    root = Path(__file__).resolve().parents[2]
    metrics_port, webhook_port, live_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), str(root / "operator"), os.environ.get("PYTHONPATH", "")]),
        "KELVIN_SOURCE": "simulated",
        "KELVIN_FLEET_NODES": "1",
        "KELVIN_OPERATOR_INTERVAL_S": "1",
        "KELVIN_OPERATOR_WEBHOOK__ADDR": "127.0.0.1",
        "KELVIN_OPERATOR_METRICS_ADDR": "127.0.0.1",
    }
    code = "from scheduler_plugin.cli import app; app()"
    args = [
        "operator",
        "--standalone",
        "--kube-server",
        str(kmock.url).rstrip("/"),
        "--metrics-port",
        str(metrics_port),
        "--webhook-port",
        str(webhook_port),
        "--liveness",
        f"http://127.0.0.1:{live_port}/healthz",
        "--log-level",
        "warning",
    ]
    proc_ = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        *args,
        env=env,
        cwd=root,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            text = ""
            async with asyncio.timeout(30):
                while "kelvin_operator_hot_nodes" not in text or not kmock["get", NODES]:
                    await asyncio.sleep(0.2)
                    with contextlib.suppress(httpx.HTTPError):
                        text = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
            assert 'kelvin_operator_evictions_total{dry_run="false",reason="thermal",result="evicted"} 0.0' in text
            assert "kelvin_telemetry_nodes" in text
            async with asyncio.timeout(15):
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(f"http://127.0.0.1:{live_port}/healthz")).status_code == 200:
                            break
                    await asyncio.sleep(0.2)
            with contextlib.suppress(httpx.HTTPError):  # TLS only: the self-signed cert is not trusted here
                await http.post(f"http://127.0.0.1:{webhook_port}/gpu-memory", json={})
                raise AssertionError("the webhook answered plain HTTP")
    finally:
        if proc_.returncode is None:
            proc_.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc_.communicate(), 30)
    assert proc_.returncode == 0, out.decode()[-3000:]


def test_only_gpu_or_tainted_nodes_get_a_timer() -> None:
    from kelvin_operator.handlers import _gpu_node

    assert _gpu_node(kopf.Body(node_obj("g", gpus=8)))
    assert not _gpu_node(kopf.Body(node_obj("cpu", gpus=0)))
    assert _gpu_node(kopf.Body(node_obj("cpu-tainted", gpus=0, tainted=True)))  # so its taint can still be removed


def test_shared_gpu_pods_and_nodes_are_watched() -> None:
    """kelvin.dev/shared-gpu (kelvin's device plugin) marks GPU pods and GPU nodes as nvidia.com/gpu does; init
    containers count."""
    from kelvin_operator.handlers import _gpu_node, _gpu_pod

    def indexed(kind: str, resources: dict[str, Any]) -> bool:
        body = kopf.Body({"spec": {"nodeName": "n1", "containers": [{"name": "c"}], kind: [{"resources": resources}]}})
        return _gpu_pod(spec=body.spec, annotations=body.metadata.annotations)

    assert indexed("containers", {"requests": {"kelvin.dev/shared-gpu": "1"}})
    assert indexed("initContainers", {"limits": {"nvidia.com/gpu": "1"}})
    assert not indexed("containers", {"requests": {"cpu": "1"}})
    assert _gpu_node(kopf.Body({"status": {"capacity": {"kelvin.dev/shared-gpu": "16"}}}))
