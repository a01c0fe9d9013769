"""Every endpoint and error path of the extender over TestClient, plus one run against a real uvicorn server."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from ext_helpers import Clock, StaticSource, args, gpu_node, make_extender, pod
from fastapi.testclient import TestClient

from scheduler_plugin.extender.app import create_app
from scheduler_plugin.extender.server import ServerThread
from scheduler_plugin.extender.service import Extender
from scheduler_plugin.policies import Framework, PolicyConfig
from scheduler_plugin.simulator.simulated_fleet import FleetSpec, SimulatedFleetSource


@pytest.fixture
def ext() -> Extender:
    return make_extender()[0]


@pytest.fixture
def client(ext: Extender) -> Iterator[TestClient]:
    with TestClient(create_app(ext)) as c:
        yield c


def _src(ext: Extender) -> StaticSource:
    assert isinstance(ext.source, StaticSource)
    return ext.source


# -- malformed bodies: 400 naming the problem, never 422 or 500 ------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"", "empty request body"),
        (b"{not json", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"Pod": "x", "NodeNames": []}', "Pod: must be a Pod object"),
        (b'{"Pod": {"spec": {}}, "NodeNames": []}', "Pod.metadata.name"),
        (b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": "gpu-node-1"}', "NodeNames: must be a list"),
        (b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["a", 3]}', "NodeNames[1]: must be a string"),
        (b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": null, "NodeNames": null}', "Nodes and NodeNames"),
        (b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"spec": {}}]}}', "Nodes.items[0].metadata"),
        (b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": 5}}', "Nodes.items: must be a list"),
        (b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"metadata": null}]}}', "Nodes.items[0].metadata"),
        (b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"metadata": "x"}]}}', "Nodes.items[0].metadata"),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_malformed_body_is_400_naming_the_problem(client: TestClient, verb: str, body: bytes, words: str) -> None:
    resp = client.post(f"/{verb}", content=body)
    assert resp.status_code == 400
    assert words in resp.json()["Error"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{}", "PodName"),
        (b'{"PodName": "p", "PodNamespace": "default", "Node": 7}', "Node: must be a non-empty string"),
        (b'{"PodName": "p", "PodNamespace": "default", "Node": "n", "PodUID": 1}', "PodUID"),
        (b"nope", "not valid JSON"),
        (b"", "empty request body: expected a JSON object with PodName, PodNamespace, PodUID and Node"),
    ],
)
def test_malformed_bind_is_400(client: TestClient, body: bytes, words: str) -> None:
    resp = client.post("/bind", content=body)
    assert resp.status_code == 400 and words in resp.json()["Error"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"[]", "body: Input should be an object"),
        (b'{"pod": {}}', "node: Field required"),
        (b'{"pod": 1, "node": "gpu-node-1"}', "pod: "),
    ],
)
def test_malformed_explain_is_400_not_422(client: TestClient, body: bytes, words: str) -> None:
    resp = client.post("/explain", content=body)
    assert resp.status_code == 400 and words in resp.json()["Error"]


# -- bad annotations ---------------------------------------------------------------------------------------------------


def test_bad_annotation_fails_every_node_unresolvable(client: TestClient) -> None:
    body = client.post("/filter", content=args(pod(annotations={"kelvin.dev/gpu-memory": "lots"}))).json()
    assert body["NodeNames"] == [] and body["FailedNodes"] == {} and body["Error"] == ""
    assert set(body["FailedAndUnresolvableNodes"]) == {"gpu-node-1", "gpu-node-2"}
    assert "kelvin.dev/gpu-memory='lots'" in body["FailedAndUnresolvableNodes"]["gpu-node-1"]
    resp = client.post("/prioritize", content=args(pod(annotations={"kelvin.dev/topology": "ring"})))
    assert resp.status_code == 400 and "kelvin.dev/topology" in resp.json()["Error"]
    metrics = client.get("/metrics").text
    assert 'kelvin_extender_rejections_total{reason="bad_request"} 2.0' in metrics


# -- pods without GPUs (sent when the chart's scheduler.extender.cpuOnlyPods is on) ---------------------------------


def cpu_pod(cores: int) -> dict[str, Any]:
    p = pod("cpu-only")
    p["spec"]["containers"][0]["resources"] = {"requests": {"cpu": str(cores)}}
    return p


def test_a_pod_without_gpus_passes_every_node_and_is_ranked_by_best_fit() -> None:
    """gpu-node-1 keeps 2 GPUs free, gpu-node-2 keeps 7: the pod's 8 cores strand nothing on either, so best fit
    decides (node 1 is left fuller); a node kelvin has no GPUs for (a CPU node) scores the maximum and every GPU
    node less. Without a CPU node among the names, kelvin's first GPU node gets 10 alone."""
    ext, _, _ = make_extender()
    names = ["cpu-node-9", "gpu-node-1", "gpu-node-2"]
    with TestClient(create_app(ext)) as c:
        body = c.post("/filter", content=args(cpu_pod(8), names)).json()
        assert body["NodeNames"] == names and not body["FailedNodes"] and not body["FailedAndUnresolvableNodes"]
        prio = {h["Host"]: h["Score"] for h in c.post("/prioritize", content=args(cpu_pod(8), names)).json()}
        gpu_only = {h["Host"]: h["Score"] for h in c.post("/prioritize", content=args(cpu_pod(8), names[1:])).json()}
    assert prio["cpu-node-9"] == 10 and prio["gpu-node-1"] == 9, prio
    assert prio["gpu-node-2"] < prio["gpu-node-1"], prio
    assert gpu_only["gpu-node-1"] == 10 and gpu_only["gpu-node-2"] < 10, gpu_only


def test_without_cpu_only_ranking_a_pod_without_gpus_scores_zero_everywhere() -> None:
    ext, _, _ = make_extender()
    cfg = PolicyConfig.from_mapping({"cpuOnly": {"fragmentationWeight": 0, "packWeight": 0}})
    ext.framework = Framework.from_config(cfg, ledger=ext.ledger)
    names = ["cpu-node-9", "gpu-node-1", "gpu-node-2"]
    with TestClient(create_app(ext)) as c:
        prio = c.post("/prioritize", content=args(cpu_pod(8), names)).json()
    assert [h["Score"] for h in prio] == [0, 0, 0], prio


# -- unknown nodes and stale telemetry -----------------------------------------------------------------------------


def test_unknown_nodes_denied() -> None:
    ext, _, _ = make_extender(on_stale="deny")
    with TestClient(create_app(ext)) as c:
        body = c.post("/filter", content=args(pod(), ["gpu-node-2", "cpu-node-9"])).json()
        assert body["NodeNames"] == ["gpu-node-2"]
        assert "no GPU telemetry" in body["FailedAndUnresolvableNodes"]["cpu-node-9"]
        prio = c.post("/prioritize", content=args(pod(), ["cpu-node-9", "gpu-node-2"])).json()
        assert prio[0] == {"Host": "cpu-node-9", "Score": 0}
        assert 'kelvin_extender_rejections_total{reason="unknown_node"} 1.0' in c.get("/metrics").text


def test_unknown_nodes_allowed() -> None:
    ext, _, _ = make_extender(on_stale="allow")
    with TestClient(create_app(ext)) as c:
        body = c.post("/filter", content=args(pod(), ["cpu-node-9", "gpu-node-2"])).json()
        assert body["NodeNames"] == ["cpu-node-9", "gpu-node-2"] and body["FailedAndUnresolvableNodes"] == {}


@pytest.mark.parametrize("on_stale", ["deny", "allow"])
def test_stale_telemetry(on_stale: str) -> None:
    ext, src, clock = make_extender(on_stale=on_stale)
    with TestClient(create_app(ext)) as c:
        assert c.get("/readyz").status_code == 200
        src.frozen_at = clock.t  # the exporter stopped reporting; the source still answers
        clock.t += 120
        c.portal.call(ext.cache.refresh_once)  # type: ignore[union-attr]
        body = c.post("/filter", content=args(pod())).json()
        if on_stale == "deny":
            # every node stale: an outage, answered with Error (retried with backoff, see test_extender_outage.py)
            assert body["NodeNames"] == [] and body["FailedAndUnresolvableNodes"] == {}
            assert "kelvin's GPU telemetry is stale" in body["Error"]
        else:
            assert body["NodeNames"] == ["gpu-node-1", "gpu-node-2"]
        m = c.get("/metrics").text
        assert 'kelvin_telemetry_nodes{source="static",state="stale"} 2.0' in m
        stale_rejections = "2.0" if on_stale == "deny" else "0.0"
        assert f'kelvin_extender_rejections_total{{reason="stale_telemetry"}} {stale_rejections}' in m


def test_readyz_fails_when_snapshot_is_old_or_source_fails() -> None:
    ext, src, clock = make_extender()
    with TestClient(create_app(ext)) as c:
        ok = c.get("/readyz")
        assert ok.status_code == 200 and ok.json()["ready"] is True
        clock.t += 31
        old = c.get("/readyz")
        assert old.status_code == 503 and "31s old" in old.json()["reason"]
        src.fail = True
        assert c.portal.call(ext.cache.refresh_once) is False  # type: ignore[union-attr]
        down = c.get("/readyz").json()
        assert down["ready"] is False and "down (test)" in down["reason"]
        # the last good snapshot keeps serving
        assert c.post("/filter", content=args(pod())).status_code == 200
        assert c.get("/healthz").status_code == 200
        assert 'kelvin_telemetry_refresh_total{result="error",source="static"} 1.0' in c.get("/metrics").text


def test_readyz_before_any_snapshot() -> None:
    ext, src, _ = make_extender()
    src.fail = True
    with TestClient(create_app(ext)) as c:
        r = c.get("/readyz")
        assert r.status_code == 503 and "no telemetry snapshot yet" in r.json()["reason"]
        body = c.post("/filter", content=args(pod())).json()  # no data at all: an outage -> Error, retried
        assert body["NodeNames"] == [] and body["FailedAndUnresolvableNodes"] == {}
        assert body["Error"].startswith("kelvin has no GPU telemetry yet")


# -- internal errors never become a 500 ------------------------------------------------------------------------------


def test_internal_error_is_an_error_reply_not_500(
    ext: Extender, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*a: Any, **k: Any) -> Any:
        raise RuntimeError("policy exploded")

    monkeypatch.setattr(ext.framework, "filter", boom)
    monkeypatch.setattr(ext.framework, "prioritize", boom)
    f = client.post("/filter", content=args(pod()))
    assert f.status_code == 200 and "policy exploded" in f.json()["Error"] and f.json()["NodeNames"] is None
    p = client.post("/prioritize", content=args(pod()))
    assert p.status_code == 503 and "policy exploded" in p.json()["Error"]


@pytest.mark.parametrize("verb", ["filter", "bind"])
async def test_a_client_disconnect_is_not_an_internal_failure(
    ext: Extender, verb: str, caplog: pytest.LogCaptureFixture
) -> None:
    """kube-scheduler gave up while sending the body: logged at info without a traceback, counted as 499."""
    app = create_app(ext)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": f"/{verb}",
        "raw_path": f"/{verb}".encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"kelvin"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    events = [{"type": "http.request", "body": b'{"Pod":', "more_body": True}, {"type": "http.disconnect"}]

    async def receive() -> dict[str, Any]:
        return events.pop(0) if events else {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with caplog.at_level(logging.INFO, logger="scheduler_plugin.extender.routes"):
        await app(scope, receive, send)
    m = ext.metrics
    assert m.requests.labels(verb, "499")._value.get() == 1
    assert m.requests.labels(verb, "200")._value.get() == 0
    assert m.decisions.labels("bind", "error")._value.get() == 0
    (rec,) = [r for r in caplog.records if "disconnected" in r.getMessage()]
    assert rec.levelname == "INFO" and rec.exc_info is None
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]


# -- explain, healthz, metrics ----------------------------------------------------------------------------------------


def test_explain(client: TestClient) -> None:
    r = client.post("/explain", json={"pod": pod(gpus=2), "node": "gpu-node-2"})
    assert r.status_code == 200
    e = r.json()
    assert e["fits"] is True and 0 <= e["score"] <= 10 and len(e["gpus"]) == 2
    assert {s["policy"] for s in e["scores"]} >= {"thermal", "topology"}
    assert all(s["reasons"] for s in e["scores"])
    full = client.post("/explain", json={"pod": pod(gpus=4), "node": "gpu-node-1"}).json()
    assert full["fits"] is False and any(not f["passed"] and f["reason"] for f in full["filters"])
    unknown = client.post("/explain", json={"pod": pod(), "node": "nope"})
    assert unknown.status_code == 400 and "'nope' is not in kelvin's snapshot" in unknown.json()["Error"]


def test_metrics_count_requests_decisions_and_reasons(client: TestClient) -> None:
    client.post("/filter", content=args(pod(gpus=4)))  # node 1 rejected (2 free), node 2 passes
    client.post("/prioritize", content=args(pod()))
    m = client.get("/metrics").text
    assert 'kelvin_extender_request_duration_seconds_count{verb="filter"} 1.0' in m
    assert 'kelvin_extender_requests_total{code="200",verb="prioritize"} 1.0' in m
    assert 'kelvin_extender_decisions_total{result="passed",verb="filter"} 1.0' in m
    assert 'kelvin_extender_decisions_total{result="rejected",verb="filter"} 1.0' in m
    assert 'kelvin_extender_rejections_total{reason="gpu_count"} 1.0' in m
    assert 'kelvin_extender_rejections_total{reason="thermal"} 0.0' in m  # pre-initialised
    assert 'kelvin_telemetry_snapshot_age_seconds{source="static"}' in m
    assert "kelvin_fleet_stranded_gpu_memory_bytes" in m
    assert client.get("/healthz").json() == {"status": "ok"}


def test_hot_gpus_are_rejected_as_thermal() -> None:
    nodes = [gpu_node("gpu-node-1", hot=range(8)), gpu_node("gpu-node-2")]
    ext, _, _ = make_extender(nodes)
    with TestClient(create_app(ext)) as c:
        body = c.post("/filter", content=args(pod())).json()
        assert body["NodeNames"] == ["gpu-node-2"]
        assert "slowdown" in body["FailedAndUnresolvableNodes"]["gpu-node-1"]
        assert 'kelvin_extender_rejections_total{reason="thermal"} 1.0' in c.get("/metrics").text


# -- bind on the simulated fleet (no API server) -------------------------------------------------------------------


def test_bind_on_the_simulated_fleet_records_the_placement() -> None:
    src = SimulatedFleetSource(FleetSpec.uniform(2, 8, seed=0, initial_load=0.0))
    ext, _, _ = make_extender(source=src, clock=time.time)
    with TestClient(create_app(ext)) as c:
        p = pod("train", gpus=8)
        assert c.post("/filter", content=args(p)).json()["NodeNames"] == ["gpu-node-1", "gpu-node-2"]
        bind = {"PodName": "train", "PodNamespace": "default", "PodUID": "uid-train", "Node": "gpu-node-1"}
        assert c.post("/bind", json=bind).json() == {"Error": ""}
        node, a = src.placements()["default/train"]
        assert node == "gpu-node-1" and a.gpu_indices == tuple(range(8))
        assert ext.ledger.entries(ext.clock())["gpu-node-1"][0].pod_key == "default/train"
        # the ledger makes the node full at once, before telemetry shows it
        body = c.post("/filter", content=args(pod("next", gpus=1))).json()
        assert body["NodeNames"] == ["gpu-node-2"]
        # a second 8-GPU pod cannot bind there any more
        c.post("/filter", content=args(pod("again", gpus=8)))
        again = c.post("/bind", json={**bind, "PodName": "again", "PodUID": "uid-again"}).json()
        assert "no longer fits node gpu-node-1" in again["Error"]
        # bind of a pod kelvin never saw, with no API server to read it from
        unseen = c.post("/bind", json={**bind, "PodName": "ghost", "PodUID": "uid-ghost"}).json()
        assert "has not seen pod default/ghost" in unseen["Error"]
        m = c.get("/metrics").text
        assert 'kelvin_extender_decisions_total{result="bound",verb="bind"} 1.0' in m
        assert 'kelvin_extender_decisions_total{result="error",verb="bind"} 2.0' in m
        assert "kelvin_extender_assumed_allocations 1.0" in m


def test_bind_disabled() -> None:
    ext, _, _ = make_extender(bind_enabled=False)
    with TestClient(create_app(ext)) as c:
        c.post("/filter", content=args(pod()))
        r = c.post("/bind", json={"PodName": "p1", "PodNamespace": "default", "PodUID": "", "Node": "gpu-node-2"})
        assert "disabled" in r.json()["Error"]


# -- a real server on loopback ---------------------------------------------------------------------------------------


def test_real_uvicorn_server_on_loopback() -> None:
    src = SimulatedFleetSource(FleetSpec.uniform(6, 8, seed=1))
    ext, _, _ = make_extender(source=src, clock=time.time)
    with ServerThread(create_app(ext)) as url, httpx.Client(base_url=url, timeout=10) as c:
        assert url.startswith("http://127.0.0.1:")
        assert c.get("/readyz").status_code == 200
        p = pod("real", gpus=2)
        names = src.node_names
        fr = c.post("/scheduler/filter", content=json.dumps({"Pod": p, "Nodes": None, "NodeNames": names}))
        # the verbs' replies, written by kelvin's own ASGI endpoint: typed, sized, and no server header naming uvicorn
        assert fr.headers["content-type"] == "application/json" and int(fr.headers["content-length"]) == len(fr.content)
        assert "server" not in fr.headers and "date" in fr.headers
        f = fr.json()
        assert f["Error"] == "" and f["NodeNames"]
        prio = c.post(
            "/scheduler/prioritize", content=json.dumps({"Pod": p, "Nodes": None, "NodeNames": f["NodeNames"]})
        ).json()
        best = max(prio, key=lambda h: h["Score"])["Host"]
        b = c.post(
            "/scheduler/bind", json={"PodName": "real", "PodNamespace": "default", "PodUID": "uid-real", "Node": best}
        )
        assert b.json() == {"Error": ""}
        assert src.placements()["default/real"][0] == best
        assert "kelvin_extender_request_duration_seconds_bucket" in c.get("/metrics").text


def test_clock_helper() -> None:
    c = Clock(5.0)
    c.t += 1
    assert c() == 6.0


# -- assembly ---------------------------------------------------------------------------------------------------------


def test_a_real_source_with_an_api_server_gets_kube_binding_and_pod_records() -> None:
    from scheduler_plugin.extender.app import build_extender
    from scheduler_plugin.extender.binder import KubeBinder
    from scheduler_plugin.settings import Settings
    from scheduler_plugin.telemetry.assignments import AssignedSource

    ext = build_extender(Settings(source="prometheus", kube_server="http://127.0.0.1:9"))
    assert isinstance(ext.binder, KubeBinder) and isinstance(ext.source, AssignedSource)
    asyncio.run(ext.binder.close())


def test_a_real_source_without_an_api_server_refuses_to_bind(monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler_plugin.extender.app import build_extender
    from scheduler_plugin.extender.binder import BindError, NoApiBinder
    from scheduler_plugin.settings import Settings

    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    ext = build_extender(Settings(source="prometheus"))
    assert isinstance(ext.binder, NoApiBinder)
    with pytest.raises(BindError, match="no Kubernetes API configured"):
        asyncio.run(ext.binder.bind("default", "p1", "uid", "gpu-node-1", (0,)))


@pytest.mark.parametrize(
    ("annotations", "gpus", "node", "code"),
    [
        ({"kelvin.dev/gpu-models": "A100-SXM4-80GB"}, 1, "gpu-node-2", "gpu_model"),
        ({"kelvin.dev/gpu-memory": "20Gi"}, 1, "gpu-node-1", "gpu_memory"),
        ({"kelvin.dev/topology": "nvlink-required"}, 4, "gpu-node-2", "topology"),
        ({}, 4, "gpu-node-2", "gpu_count"),
    ],
)
def test_rejections_are_counted_by_reason(annotations: dict[str, str], gpus: int, node: str, code: str) -> None:
    from dataclasses import replace

    full = gpu_node("gpu-node-1", busy=range(8))  # every GPU taken, 10 GiB of memory left on each
    pcie = gpu_node("gpu-node-2", busy=range(5))  # 3 free GPUs, no NVLink
    pcie = replace(pcie, gpus=tuple(replace(g, nvlink_peers=frozenset()) for g in pcie.gpus))
    ext, _, _ = make_extender([full, pcie])
    with TestClient(create_app(ext)) as c:
        body = c.post("/filter", content=args(pod(gpus=gpus, annotations=annotations), [node])).json()
        assert body["NodeNames"] == [], body
        assert f'kelvin_extender_rejections_total{{reason="{code}"}} 1.0' in c.get("/metrics").text
