"""A telemetry outage answers filter with ``Error`` (kube-scheduler's backoff path), not failed nodes.

kube-scheduler parks a pod whose nodes all failed in its unschedulable queue until a cluster event or its 5-minute
flush; an ``Error`` is a scheduling error, retried with backoff (10 s at most by default). See docs/extender.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ext_helpers import Clock, StaticSource, args, capture_nodes, make_extender, pod
from fastapi.testclient import TestClient

from scheduler_plugin.extender.app import create_app
from scheduler_plugin.model import GpuNode


class PerNodeSource(StaticSource):
    """A static source whose ``frozen`` nodes keep the ``observed_at`` they had when frozen."""

    def __init__(self, nodes: Sequence[GpuNode], clock: Clock) -> None:
        super().__init__(nodes, clock)
        self.frozen: dict[str, float] = {}

    async def fetch(self) -> Sequence[GpuNode]:
        nodes = await super().fetch()
        return [replace(n, observed_at=self.frozen.get(n.name, n.observed_at)) for n in nodes]


def _refresh(c: TestClient, ext: object) -> bool:
    return bool(c.portal.call(ext.cache.refresh_once))  # type: ignore[attr-defined, union-attr]


def test_source_down_longer_than_max_age_answers_error_then_recovers() -> None:
    ext, src, clock = make_extender(on_stale="deny")
    with TestClient(create_app(ext)) as c:
        ok = c.post("/filter", content=args(pod())).json()
        assert ok["NodeNames"] == ["gpu-node-1", "gpu-node-2"] and ok["Error"] == ""
        src.fail = True  # Prometheus down
        clock.t += 45
        assert _refresh(c, ext) is False
        body = c.post("/filter", content=args(pod())).json()
        assert body["Error"].startswith("kelvin's GPU telemetry is stale: last successful refresh 45 s ago")
        assert "maxAgeSeconds 30" in body["Error"] and "static source is down (test)" in body["Error"]
        assert body["Error"].endswith("the pod is retried with backoff")
        # not the unschedulable-queue answer: no node failed, none passed
        assert body["FailedAndUnresolvableNodes"] == {} and body["FailedNodes"] == {} and body["NodeNames"] == []
        m = c.get("/metrics").text
        assert 'kelvin_extender_rejections_total{reason="stale_telemetry"} 2.0' in m
        # Prometheus back: the next refresh succeeds and the same request (the scheduler's backoff retry) passes
        src.fail = False
        clock.t += 5
        assert _refresh(c, ext) is True
        again = c.post("/filter", content=args(pod())).json()
        assert again["Error"] == "" and again["NodeNames"] == ["gpu-node-1", "gpu-node-2"]


def test_outage_in_node_objects_mode_echoes_no_nodes() -> None:
    ext, src, clock = make_extender(on_stale="deny")
    with TestClient(create_app(ext)) as c:
        src.fail = True
        clock.t += 31
        _refresh(c, ext)
        items = [{"metadata": {"name": "gpu-node-1"}}, {"metadata": {"name": "gpu-node-2"}}]
        body = c.post("/filter", json={"Pod": pod(), "Nodes": {"items": items}, "NodeNames": None}).json()
        assert "telemetry is stale" in body["Error"] and body["Nodes"]["items"] == []


def test_every_node_stale_though_source_answers_is_an_outage() -> None:
    ext, src, clock = make_extender(on_stale="deny")
    with TestClient(create_app(ext)) as c:
        src.frozen_at = clock.t  # the exporters stopped reporting; Prometheus still answers
        clock.t += 120
        assert _refresh(c, ext) is True
        body = c.post("/filter", content=args(pod(), ["gpu-node-1"])).json()
        assert "no node of the 2 in the snapshot has telemetry newer than maxAgeSeconds (30 s)" in body["Error"]
        assert body["FailedAndUnresolvableNodes"] == {}


def test_one_stale_node_among_fresh_is_failed_as_before() -> None:
    clock = Clock()
    src = PerNodeSource(capture_nodes(), clock)
    ext, _, _ = make_extender(on_stale="deny", source=src, clock=clock)
    with TestClient(create_app(ext)) as c:
        src.frozen["gpu-node-1"] = clock.t
        clock.t += 120
        assert _refresh(c, ext) is True
        body = c.post("/filter", content=args(pod())).json()
        assert body["Error"] == "" and body["NodeNames"] == ["gpu-node-2"]
        assert "telemetry" in body["FailedAndUnresolvableNodes"]["gpu-node-1"]
        # the stale node is the pod's only candidate: still that node's problem, not an outage
        only = c.post("/filter", content=args(pod(), ["gpu-node-1"])).json()
        assert only["Error"] == "" and list(only["FailedAndUnresolvableNodes"]) == ["gpu-node-1"]


def test_empty_snapshot_is_an_outage_and_unknown_nodes_otherwise_fail() -> None:
    clock = Clock()
    src = StaticSource([], clock)  # a restarted Prometheus before its first scrape: it answers, with nothing
    ext, _, _ = make_extender(on_stale="deny", source=src, clock=clock)
    with TestClient(create_app(ext)) as c:
        body = c.post("/filter", content=args(pod())).json()
        assert "reported no GPU node" in body["Error"] and body["FailedAndUnresolvableNodes"] == {}
        src.nodes = capture_nodes()[1:]
        _refresh(c, ext)
        body = c.post("/filter", content=args(pod())).json()
        assert body["Error"] == "" and body["NodeNames"] == ["gpu-node-2"]
        assert "no GPU telemetry" in body["FailedAndUnresolvableNodes"]["gpu-node-1"]


def test_no_refresh_yet_is_an_outage() -> None:
    ext, src, _ = make_extender(on_stale="deny")
    src.fail = True
    with TestClient(create_app(ext)) as c:
        body = c.post("/filter", content=args(pod())).json()
        assert body["Error"].startswith("kelvin has no GPU telemetry yet") and "down (test)" in body["Error"]


def test_allow_and_cpu_pods_never_get_the_outage_error() -> None:
    ext, src, clock = make_extender(on_stale="allow")
    with TestClient(create_app(ext)) as c:
        src.fail = True
        clock.t += 120
        _refresh(c, ext)
        body = c.post("/filter", content=args(pod())).json()
        assert body["Error"] == "" and body["NodeNames"] == ["gpu-node-1", "gpu-node-2"]
    ext, src, clock = make_extender(on_stale="deny")
    with TestClient(create_app(ext)) as c:
        src.fail = True
        clock.t += 120
        _refresh(c, ext)
        cpu = c.post("/filter", content=args(pod(gpus=0))).json()
        assert cpu["Error"] == "" and cpu["NodeNames"] == ["gpu-node-1", "gpu-node-2"]
