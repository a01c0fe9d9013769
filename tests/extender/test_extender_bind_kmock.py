"""Bind against a fake Kubernetes API server (kmock, real HTTP on loopback): annotation first, then the Binding."""

from __future__ import annotations

import time
from typing import Any

import httpx
import kmock
import pytest
from ext_helpers import args, make_extender, pod

from scheduler_plugin.extender.app import create_app
from scheduler_plugin.extender.binder import BindError, KubeBinder, bind_time
from scheduler_plugin.extender.service import bind_refused
from scheduler_plugin.kubeapi import KubeClient, KubeConfig, KubeError
from scheduler_plugin.model.claim import charged_milli
from scheduler_plugin.model.times import parse_time_ns
from scheduler_plugin.telemetry.assignments import assignment_of_pod, list_assigned_pods

pytestmark = pytest.mark.kmock(cls=kmock.RawHandler)

POD = "/api/v1/namespaces/default/pods/p1"


def _client(k: kmock.RawHandler) -> KubeClient:
    return KubeClient(KubeConfig.load(server=str(k.url)))


async def _asgi(ext: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(ext)), base_url="http://kelvin")


def _requests(k: kmock.RawHandler) -> list[Any]:
    return list(k)


async def test_bind_is_one_binding_that_carries_the_gpus(kmock: kmock.RawHandler) -> None:
    """Issue 10: a bind was a merge patch, then the Binding (then an undo patch on failure): two or three round trips
    that queued behind one another under a burst. The API server merges a Binding's annotations into the pod in the
    same write that sets nodeName, so one call does it all."""
    kmock[f"post {POD}/binding"] << 201 << {"kind": "Status", "status": "Success"}
    ext, _, _ = make_extender(binder=KubeBinder(_client(kmock)))
    await ext.cache.refresh_once()
    before = time.time_ns()
    async with await _asgi(ext) as c:
        await c.post("/filter", content=args(pod(gpus=2)))
        r = await c.post(
            "/bind", json={"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "gpu-node-2"}
        )
    assert r.status_code == 200 and r.json() == {"Error": ""}
    reqs = _requests(kmock)
    assert [str(q.method).upper().split(".")[-1] for q in reqs] == ["POST"]
    (binding,) = reqs
    gpus = ext.ledger.entries(ext.clock())["gpu-node-2"][0].gpu_indices
    assert len(gpus) == 2 and 0 not in gpus  # gpu 0 of gpu-node-2 is busy
    assert binding.url.path == f"{POD}/binding"
    assert binding.data["kind"] == "Binding"
    at = binding.data["metadata"]["annotations"].pop("kelvin.dev/gpu-assigned-at")
    assert before <= parse_time_ns(at) <= time.time_ns()  # the bind time, to the nanosecond
    assert binding.data["metadata"] == {
        "name": "p1",
        "namespace": "default",
        "uid": "uid-p1",  # the API server's precondition: not a pod recreated under the same name
        "annotations": {
            "kelvin.dev/gpu-assigned": ",".join(map(str, gpus)),
            "kelvin.dev/gpu-assigned-node": "gpu-node-2",
        },
    }
    assert binding.data["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-2"}
    await ext.binder.close()


UID_CONFLICT = (
    'Operation cannot be fulfilled on pods/binding "p1": Precondition failed: UID in precondition: uid-p1, '
    "UID in object meta: uid-other"
)


@pytest.mark.parametrize(
    ("status", "message", "still_assumed"),
    [
        (404, 'pods "p1" not found', False),  # gone: nothing was bound
        (409, UID_CONFLICT, False),  # recreated under the same name: this Binding was refused
        (422, "Binding is invalid", False),
        (409, 'pod p1 is already assigned to node "gpu-node-2"', True),  # an earlier attempt may have landed
        (500, "etcdserver: request timed out", True),  # the write may still land
        (504, "Timeout: request did not complete within 60s", True),
    ],
)
async def test_failed_binding_forgets_the_gpus_only_when_refused(
    kmock: kmock.RawHandler, status: int, message: str, still_assumed: bool
) -> None:
    kmock[f"post {POD}/binding"] << status << {"kind": "Status", "code": status, "message": message}
    ext, _, _ = make_extender(binder=KubeBinder(_client(kmock)))
    await ext.cache.refresh_once()
    async with await _asgi(ext) as c:
        await c.post("/filter", content=args(pod()))
        r = await c.post(
            "/bind", json={"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "gpu-node-2"}
        )
    err = r.json()["Error"]
    assert "cannot bind pod default/p1 to gpu-node-2 with GPUs" in err
    assert f"HTTP {status}" in err and message in err
    assert len(_requests(kmock)) == 1  # nothing to undo: the annotations were part of the Binding
    assert len(ext.ledger) == (1 if still_assumed else 0)
    await ext.binder.close()


class ResetClient:
    """The connection dies after the Binding was sent: KubeClient's status 0."""

    async def post(self, path: str, body: Any) -> Any:
        raise KubeError(0, f"POST {path}: connection reset by peer")

    async def close(self) -> None:
        return None


async def test_a_binding_without_an_answer_keeps_the_gpus_assumed() -> None:
    ext, _, _ = make_extender(binder=KubeBinder(ResetClient()))  # type: ignore[arg-type]
    await ext.cache.refresh_once()
    async with await _asgi(ext) as c:
        await c.post("/filter", content=args(pod()))
        r = await c.post(
            "/bind", json={"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "gpu-node-2"}
        )
    assert "connection reset" in r.json()["Error"]
    assert [a.pod_key for a in ext.ledger.entries(ext.clock())["gpu-node-2"]] == ["default/p1"]


async def test_a_binding_that_never_reached_the_api_server_releases_the_gpus() -> None:
    """No connection could be made (an API-server outage): nothing was applied, so the GPUs must not stay held for
    the ledger's TTL on every failed bind."""
    client = KubeClient(KubeConfig(server="http://127.0.0.1:9"), timeout_s=2.0)
    ext, _, _ = make_extender(binder=KubeBinder(client))
    await ext.cache.refresh_once()
    async with await _asgi(ext) as c:
        await c.post("/filter", content=args(pod()))
        r = await c.post(
            "/bind", json={"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "gpu-node-2"}
        )
    assert "API server unreachable" in r.json()["Error"]
    assert ext.ledger.entries(ext.clock()) == {}
    await client.close()


def test_only_definite_refusals_release_the_gpus() -> None:
    assert bind_refused(BindError("kelvin cannot bind: no API server"))  # no call made
    assert bind_refused(BindError("HTTP 403: forbidden", 403))
    assert not bind_refused(BindError("connection reset", 0))
    assert not bind_refused(BindError("HTTP 503", 503))
    assert not bind_refused(BindError("HTTP 409: pod p1 is already assigned to node x", 409))
    assert bind_refused(BindError(f"HTTP 409: {UID_CONFLICT}", 409))


async def test_bind_of_a_pod_without_gpus_carries_no_annotations(kmock: kmock.RawHandler) -> None:
    kmock[f"post {POD}/binding"] << 201 << {"kind": "Status"}
    ext, _, _ = make_extender(binder=KubeBinder(_client(kmock)))
    await ext.cache.refresh_once()
    plain = pod()
    plain["spec"]["containers"][0]["resources"] = {}
    async with await _asgi(ext) as c:
        await c.post("/filter", content=args(plain))
        r = await c.post("/bind", json={"PodName": "p1", "PodNamespace": "default", "PodUID": "", "Node": "gpu-node-1"})
    assert r.json() == {"Error": ""}
    (binding,) = _requests(kmock)
    assert binding.data["metadata"] == {"name": "p1", "namespace": "default"}
    await ext.binder.close()


async def test_bind_reads_the_pod_when_filter_was_not_seen(kmock: kmock.RawHandler) -> None:
    kmock[f"get {POD}"] << pod("p1", gpus=1, annotations={"kelvin.dev/gpu-memory": "20Gi"})
    kmock[f"post {POD}/binding"] << 201 << {"kind": "Status"}
    ext, _, _ = make_extender(binder=KubeBinder(_client(kmock)))
    await ext.cache.refresh_once()
    async with await _asgi(ext) as c:
        r = await c.post(
            "/bind", json={"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "gpu-node-1"}
        )
    assert r.json() == {"Error": ""}
    a = ext.ledger.entries(ext.clock())["gpu-node-1"][0]
    assert a.memory_bytes == 20 * 2**30 and a.milli is None and len(a.gpu_indices) == 1  # a pool, no compute share
    nd = ext.cache.snapshot.node("gpu-node-1")
    assert nd is not None and nd.gpu(a.gpu_indices[0]).memory_total_bytes == 80 * 2**30
    assert charged_milli(a, 80 * 2**30) == 250
    await ext.binder.close()


async def test_assignments_are_listed_from_pod_annotations(kmock: kmock.RawHandler) -> None:
    bound = pod("a", gpus=2, annotations={"kelvin.dev/gpu-assigned": "0,1", "kelvin.dev/gpu-assigned-node": "n1"})
    bound["spec"]["nodeName"] = "n1"
    shared = pod("b", gpus=1, annotations={"kelvin.dev/gpu-assigned": "3", "kelvin.dev/gpu-memory": "10Gi"})
    shared["spec"]["nodeName"] = "n1"
    done = pod("c", gpus=1, annotations={"kelvin.dev/gpu-assigned": "4"})
    done["spec"]["nodeName"] = "n1"
    done["status"] = {"phase": "Succeeded"}
    moved = pod("d", annotations={"kelvin.dev/gpu-assigned": "5", "kelvin.dev/gpu-assigned-node": "n2"})
    moved["spec"]["nodeName"] = "n1"
    plain = pod("e")
    kmock["get /api/v1/pods"] << {"kind": "PodList", "metadata": {}, "items": [bound, shared, done, moved, plain]}
    client = _client(kmock)
    record = await list_assigned_pods(client)
    await client.close()
    assert list(record) == ["n1"]
    by_key = {a.pod_key: a for a in record["n1"]}
    assert set(by_key) == {"default/a", "default/b"}
    assert by_key["default/a"].gpu_indices == (0, 1) and by_key["default/a"].milli == 1000
    assert by_key["default/b"].memory_bytes == 10 * 2**30
    assert assignment_of_pod({"metadata": {"annotations": {"kelvin.dev/gpu-assigned": "x"}}}) is None


async def test_assigned_source_merges_pod_records_into_telemetry(kmock: kmock.RawHandler) -> None:
    from ext_helpers import Clock, StaticSource, gpu_node

    from scheduler_plugin.telemetry.assignments import AssignedSource

    notes = {"kelvin.dev/gpu-assigned": "6,7", "kelvin.dev/gpu-assigned-node": "gpu-node-2"}
    bound = pod("a", gpus=2, annotations=notes)
    bound["spec"]["nodeName"] = "gpu-node-2"
    kmock["get /api/v1/pods"] << {"kind": "PodList", "metadata": {}, "items": [bound]}
    client = _client(kmock)
    src = AssignedSource(StaticSource([gpu_node("gpu-node-1"), gpu_node("gpu-node-2", busy=[0])], Clock()), client)
    nodes = {n.name: n for n in await src.fetch()}
    assert [a.pod_key for a in nodes["gpu-node-2"].assignments] == ["other/gpu-node-2-0", "default/a"]
    assert nodes["gpu-node-1"].assignments == ()
    await src.fetch()  # within the list interval: no second list
    assert len(list(kmock)) == 1
    await src.close()
    await client.close()


def test_bind_time_keeps_nanoseconds() -> None:
    """Pods bound in the same second still have distinct, ordered bind times (PodScheduled has whole seconds)."""
    ns = 1_796_097_600_000_000_001  # 2026-12-01T04:00:00 UTC + 1 ns
    assert bind_time(ns) == "2026-12-01T04:00:00.000000001Z"
    assert parse_time_ns(bind_time(ns)) == ns
    assert parse_time_ns(bind_time(ns + 1)) == ns + 1
