"""The real kopf operator against a fake API server (kmock): the webhook server over HTTPS answering
AdmissionReviews, and the node timer tainting and evicting through the pods index."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
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
from kelvin_operator.handlers import build_registry
from kelvin_operator.runtime import Runtime
from kelvin_operator.settings import OperatorConfig
from kelvin_operator.tls import self_signed
from kopf._core.engines.peering import Identity  # kopf.operator(identity=...) takes this NewType
from opkit import gpu, node, node_obj, pod, proc
from opkube import NODES, PODS, evictions_succeed
from prometheus_client import generate_latest

from scheduler_plugin.kubeapi import KubeConfig
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


async def test_a_denial_is_an_info_decision_not_an_operator_error(
    kmock: km.KubernetesEmulator, cert: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """kopf logs every admission denial at ERROR (``Webhook 'gpu-memory' failed permanently: ...``: AdmissionError is
    a PermanentError), so a user's refused pod read as an operator failure; kelvin logs the decision at INFO."""
    port = free_port()
    cfg = webhook_cfg(cert, port)
    fleet = [node("n1", gpu(0, total_gib=80), mps=True)]
    ctx = ssl.create_default_context(cafile=str(cert[0]))
    with caplog.at_level(logging.INFO):
        async with running(kmock, cfg, fleet), httpx.AsyncClient(verify=ctx, timeout=10) as http:
            url = f"https://localhost:{port}"
            await webhook_up(http, url)
            bad = pod("bad", annotations={ann.GPU_MEMORY: "lots"}, gpus=1)
            r = (await http.post(f"{url}/gpu-memory", json=review(bad, "d1"))).json()
            assert r["response"]["allowed"] is False
    errors = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert not errors, errors
    decisions = [rec for rec in caplog.records if "refused pod" in rec.getMessage()]
    assert len(decisions) == 1 and decisions[0].levelno == logging.INFO, [r.getMessage() for r in caplog.records]
    assert "/bad at admission" in decisions[0].getMessage()
    assert "kelvin.dev/gpu-memory='lots'" in decisions[0].getMessage()


async def test_admission_over_https(kmock: km.KubernetesEmulator, cert: tuple[Path, Path]) -> None:
    port = free_port()
    cfg = webhook_cfg(cert, port)
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


def webhook_cfg(cert: tuple[Path, Path], port: int) -> OperatorConfig:
    return OperatorConfig(
        standalone=True,
        metrics_port=0,
        interval_s=3600,
        webhook={"addr": "127.0.0.1", "port": port, "host": "localhost", "certfile": cert[0], "pkeyfile": cert[1]},
    )


@pytest.mark.slow
async def test_malformed_reviews_get_400_naming_the_field(
    kmock: km.KubernetesEmulator, cert: tuple[Path, Path]
) -> None:
    """Bodies that are not an AdmissionReview kelvin can judge: HTTP 400 with a Status naming the field, on both
    webhooks, never a 500 nor an admission decision (the full table is test_operator_review.py's)."""
    from test_operator_review import MALFORMED, mutations

    port = free_port()
    ctx = ssl.create_default_context(cafile=str(cert[0]))
    fleet = [node("n1", gpu(0, total_gib=80), mps=True)]
    async with running(kmock, webhook_cfg(cert, port), fleet), httpx.AsyncClient(verify=ctx, timeout=10) as http:
        url = f"https://localhost:{port}"
        await webhook_up(http, url)
        for path in ("/gpu-memory", "/gpu-env"):
            for what, body, says in MALFORMED:
                r = await http.post(f"{url}{path}", content=body, headers={"Content-Type": "application/json"})
                assert r.status_code == 400, (path, what, r.status_code, r.text[:300])
                status = r.json()
                assert status["kind"] == "Status" and status["code"] == 400, (path, what)
                assert says in status["message"] and path[1:] in status["message"], (path, what, status["message"])
        # 300 reviews with one field replaced by random JSON: a decision or a 400 with a message, never a 500
        answers: dict[int, int] = {}
        for i, body in enumerate(mutations(300)):
            path = ("/gpu-memory", "/gpu-env")[i % 2]
            r = await http.post(f"{url}{path}", content=body, headers={"Content-Type": "application/json"})
            answers[r.status_code] = answers.get(r.status_code, 0) + 1
            assert r.status_code in (200, 400), (path, body[:300], r.status_code, r.text[:300])
            if r.status_code == 400:
                assert r.json()["message"], body[:300]
            else:
                assert isinstance(r.json()["response"]["allowed"], bool)
        assert answers.get(200, 0) > 30 and answers.get(400, 0) > 30, answers  # both kinds were exercised
        # a path that names no webhook (a mistyped clientConfig.path) is a 404, not an admission with no handler run
        r = await http.post(f"{url}/gpu-memroy", json=review(pod("p", annotations={ann.GPU_MEMORY: "lots"}, gpus=1)))
        assert r.status_code == 404, r.text
        assert r.json()["message"] == "no kelvin admission webhook at /gpu-memroy; served: /gpu-memory, /gpu-env"
        # the server is still answering real reviews
        r = await http.post(f"{url}/gpu-memory", json=review(pod("ok", gpus=1)))
        assert r.status_code == 200 and r.json()["response"]["allowed"] is True


async def test_only_create_is_judged(kmock: km.KubernetesEmulator, cert: tuple[Path, Path]) -> None:
    """The chart registers pods CREATE only; kopf runs the handlers for every operation, so a DELETE of an old pod
    with a bad annotation was denied, and an UPDATE got the environment patched into its (immutable) containers."""
    port = free_port()
    ctx = ssl.create_default_context(cafile=str(cert[0]))
    async with running(kmock, webhook_cfg(cert, port), [node("n1", gpu(0, total_gib=80), mps=True)]) as rts:
        async with httpx.AsyncClient(verify=ctx, timeout=10) as http:
            url = f"https://localhost:{port}"
            await webhook_up(http, url)
            bad = pod("old", annotations={ann.GPU_MEMORY: "twenty gigs"}, gpus=1)
            pool = pod("pool", annotations={ann.GPU_MEMORY: "20Gi"}, gpus=1)
            create = (await http.post(f"{url}/gpu-memory", json=review(bad, "c1"))).json()["response"]
            assert create["allowed"] is False  # CREATE is judged
            for operation in ("UPDATE", "DELETE", "CONNECT"):
                for path, obj in (("/gpu-memory", bad), ("/gpu-env", pool)):
                    body = review(obj, f"{operation}-{path}")
                    req = body["request"]
                    req["operation"] = operation
                    if operation == "UPDATE":
                        req["oldObject"] = obj
                    if operation == "DELETE":
                        req["oldObject"], req["object"] = obj, None
                    if operation == "CONNECT":
                        req["subResource"], req["object"] = "exec", {"kind": "PodExecOptions", "command": ["sh"]}
                    r = await http.post(f"{url}{path}", json=body)
                    assert r.status_code == 200, (operation, path, r.text)
                    answer = r.json()["response"]
                    assert answer["uid"] == req["uid"] and answer["allowed"] is True, (operation, path, answer)
                    assert "patch" not in answer and "status" not in answer, (operation, path, answer)
        text = generate_latest(rts[0].metrics.registry).decode()
        assert 'kelvin_operator_webhook_requests_total{result="error",webhook="validate"} 0.0' in text


async def test_a_failing_handler_is_the_webhook_failing_not_a_denial(
    kmock: km.KubernetesEmulator,
    cert: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An exception in a handler (here: the decisions made to raise) is answered HTTP 500, so the API server applies
    the webhook's failurePolicy (Ignore: the pod is admitted unchecked), with the traceback logged at ERROR. kopf
    answered ``allowed: false`` with the exception's text, a denial failurePolicy Ignore cannot undo."""
    from kelvin_operator import webhooks

    def broken(*_: Any, **__: Any) -> None:
        raise AttributeError("'str' object has no attribute 'get'")

    port = free_port()
    ctx = ssl.create_default_context(cafile=str(cert[0]))
    async with running(kmock, webhook_cfg(cert, port), [node("n1", gpu(0, total_gib=80))]) as rts:
        async with httpx.AsyncClient(verify=ctx, timeout=10) as http:
            url = f"https://localhost:{port}"
            await webhook_up(http, url)
            monkeypatch.setattr(webhooks, "validate", broken)
            monkeypatch.setattr(webhooks, "mutate", broken)
            p = pod("p", annotations={ann.GPU_MEMORY: "20Gi"}, gpus=1)
            with caplog.at_level(logging.ERROR):
                for path in ("/gpu-memory", "/gpu-env"):
                    r = await http.post(f"{url}{path}", json=review(p))
                    assert r.status_code == 500, (path, r.text)
                    status = r.json()
                    assert status["kind"] == "Status" and "has no attribute 'get'" in status["message"], status
                    assert "response" not in status
            tracebacks = [rec for rec in caplog.records if rec.levelno == logging.ERROR and rec.exc_info]
            assert len(tracebacks) >= 2, [rec.getMessage() for rec in caplog.records]
            # a denial of the validation itself is still a 200 with allowed: false
            monkeypatch.undo()
            bad = pod("bad", annotations={ann.GPU_MEMORY: "twenty gigs"}, gpus=1)
            r = await http.post(f"{url}/gpu-memory", json=review(bad))
            assert r.status_code == 200 and r.json()["response"]["allowed"] is False
            assert r.json()["response"]["status"]["code"] == 400
        text = generate_latest(rts[0].metrics.registry).decode()
        assert 'kelvin_operator_webhook_requests_total{result="error",webhook="validate"} 1.0' in text
        assert 'kelvin_operator_webhook_requests_total{result="error",webhook="mutate"} 1.0' in text


async def test_webhook_port_in_use_stops_the_operator_with_one_message(
    kmock: km.KubernetesEmulator, cert: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """The webhook server's start (after the startup handler, when kopf starts it) finds its port taken: the
    operator is told once, naming the port and the settings, and stops; no traceback of a failed root task."""
    declare(kmock, peering=False)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = int(holder.getsockname()[1])
        cfg = webhook_cfg(cert, port)
        kube_config = KubeConfig(server=str(kmock.url))
        stop = asyncio.Event()
        failures: list[str] = []

        def failed(message: str) -> None:
            failures.append(message)
            stop.set()

        async def start(c: OperatorConfig) -> Runtime:
            return await Runtime.start(c, kube_config, FixedSource([node("n1", gpu(0))]), refresh_interval_s=0.2)

        registry = build_registry(cfg, start, kube_config, on_failure=failed)
        await asyncio.wait_for(
            kopf.operator(registry=registry, clusterwide=True, standalone=True, stop_flag=stop), timeout=30
        )
    assert len(failures) == 1
    assert not [r.getMessage() for r in caplog.records if r.exc_info], "a traceback was logged"
    assert f"cannot listen on 127.0.0.1:{port}: the port {port} is in use" in failures[0]
    assert "KELVIN_OPERATOR_WEBHOOK__PORT" in failures[0] and "--webhook-port" in failures[0]


async def test_an_unusable_webhook_certificate_is_one_message(tmp_path: Path, cert: tuple[Path, Path]) -> None:
    """A certificate that is not PEM, or a key file that does not exist: one message naming the settings and the
    file, reported to ``on_failure`` (or raised as WebhookStartError without one)."""
    from kelvin_operator.webhook_server import AdmissionServer, WebhookStartError

    async def never(*_: Any, **__: Any) -> Any:
        raise AssertionError("no review expected")

    garbage = tmp_path / "garbage.crt"
    garbage.write_text("not a certificate\n")
    cases = [
        (str(garbage), str(cert[1]), "cannot load"),
        (str(cert[0]), str(tmp_path / "missing.key"), f"{tmp_path / 'missing.key'} is not a file"),
        (str(cert[1]), str(cert[0]), "cannot load"),  # the two swapped
    ]
    for certfile, pkeyfile, says in cases:
        failures: list[str] = []
        server = AdmissionServer(
            on_failure=failures.append, addr="127.0.0.1", port=free_port(), certfile=certfile, pkeyfile=pkeyfile
        )
        task = asyncio.ensure_future(anext(aiter(server(never))))
        await wait_for(lambda f=failures: bool(f), 10)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert len(failures) == 1 and says in failures[0], failures
        assert "KELVIN_OPERATOR_WEBHOOK__CERTFILE" in failures[0], failures
        with pytest.raises(WebhookStartError, match=says):
            await anext(
                aiter(AdmissionServer(addr="127.0.0.1", port=free_port(), certfile=certfile, pkeyfile=pkeyfile)(never))
            )


async def test_timer_taints_and_evicts_through_the_index(kmock: km.KubernetesEmulator) -> None:
    evictions_succeed(kmock)
    kmock.objects[NODES, None, "n1"] = node_obj("n1")
    kmock.objects[PODS, "ml", "hot"] = pod("hot", gpu_indices="0", now=time.time())
    kmock.objects[PODS, "ml", "cpu"] = pod("cpu", gpus=0, now=time.time())
    cfg = OperatorConfig(
        standalone=True,
        metrics_port=0,
        interval_s=0.5,
        webhook={"enabled": False},
        protection={"min_pod_age_s": 0},
        thermal_eviction={"rule": "warm"},
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
    cfg = OperatorConfig(
        metrics_port=0,
        interval_s=0.3,
        webhook={"enabled": False},
        protection={"min_pod_age_s": 0},
        thermal_eviction={"rule": "warm"},
    )
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


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize(
    ("taken", "setting"),
    [
        ("webhook", "KELVIN_OPERATOR_WEBHOOK__PORT"),
        ("metrics", "KELVIN_OPERATOR_METRICS_PORT"),
        ("liveness", "--liveness"),
    ],
)
def test_cli_port_in_use_is_one_error_line(kmock: km.KubernetesEmulator, taken: str, setting: str) -> None:
    """``kelvin operator`` whose webhook (or /metrics, or liveness) port is taken: exit status 3 (as the extender's
    failed startup) and one ``error:`` line naming the address, the port and the setting, no traceback (it was 182
    lines and no error line)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), str(root / "operator"), os.environ.get("PYTHONPATH", "")]),
        "KELVIN_SOURCE": "simulated",
        "KELVIN_FLEET_NODES": "1",
        "KELVIN_OPERATOR_WEBHOOK__ADDR": "127.0.0.1",
        "KELVIN_OPERATOR_METRICS_ADDR": "127.0.0.1",
    }
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = int(holder.getsockname()[1])
        ports = {"webhook": free_port(), "metrics": free_port(), "liveness": free_port(), taken: port}
        args = [
            *("operator", "--standalone", "--kube-server", str(kmock.url).rstrip("/")),
            *("--webhook-port", str(ports["webhook"]), "--metrics-port", str(ports["metrics"])),
            *("--liveness", f"http://127.0.0.1:{ports['liveness']}/healthz"),
        ]
        done = subprocess.run(
            [sys.executable, "-c", "from scheduler_plugin.cli import app; app()", *args],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
        )
    out = done.stdout + done.stderr
    assert done.returncode == 3, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out, out
    assert f"cannot listen on 127.0.0.1:{port}: the port {port} is in use" in errors[0], errors
    assert setting in errors[0], errors
    assert len(out.splitlines()) == 1, out


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


async def test_timer_success_is_logged_at_debug_and_decisions_at_info(
    kmock: km.KubernetesEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    evictions_succeed(kmock)
    kmock.objects[NODES, None, "n1"] = node_obj("n1")
    kmock.objects[PODS, "ml", "hot"] = pod("hot", gpu_indices="0", now=time.time())
    cfg = OperatorConfig(
        standalone=True,
        metrics_port=0,
        interval_s=0.2,
        webhook={"enabled": False},
        protection={"min_pod_age_s": 0},
        thermal_eviction={"rule": "warm"},
    )
    fleet = [node("n1", gpu(0, 91.0, procs=(proc("hot", 10),)))]

    def lines(text: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if text in r.getMessage()]

    with caplog.at_level(logging.DEBUG):
        async with running(kmock, cfg, fleet):
            await wait_for(lambda: len(lines("Timer 'node_cycle' succeeded.")) >= 3)
            await wait_for(lambda: bool(lines("evicted ml/hot")))
    success = lines("Timer 'node_cycle' succeeded.")
    assert {r.levelname for r in success} == {"DEBUG"}, [(r.levelname, r.getMessage()) for r in success]
    assert {r.levelno for r in lines("evicted ml/hot")} == {logging.INFO}  # the decision stays at INFO
    caplog.clear()
    with caplog.at_level(logging.INFO):  # at the default level the per-cycle line is not emitted at all
        async with running(kmock, cfg, fleet):
            await asyncio.sleep(1.0)
    assert not lines("Timer 'node_cycle' succeeded.")
    assert lines("Activity 'build_registry.<locals>.startup' succeeded.")  # once per run: kept at INFO
    assert lines("kelvin operator started")  # kelvin's own INFO lines still come through
