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
from scheduler_plugin.extender.service import OUTAGE_RETRY, Extender
from scheduler_plugin.model import GpuNode


class PerNodeSource(StaticSource):
    """A static source whose ``frozen`` nodes keep the ``observed_at`` they had when frozen."""

    def __init__(self, nodes: Sequence[GpuNode], clock: Clock) -> None:
        super().__init__(nodes, clock)
        self.frozen: dict[str, float] = {}

    async def fetch(self) -> Sequence[GpuNode]:
        nodes = await super().fetch()
        return [replace(n, observed_at=self.frozen.get(n.name, n.observed_at)) for n in nodes]


def _refresh(c: TestClient, ext: Extender) -> bool:
    assert c.portal is not None  # inside ``with TestClient(...)``
    return bool(c.portal.call(ext.cache.refresh_once))


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


# -- right after an outage: some nodes fresh again, others not yet (issue 20, defect 8) -------------------------------
#
# A restarted Prometheus answers with its old samples until it has scraped each exporter again, and those first
# scrapes land at different moments: for a while some nodes are fresh and others stale, so the snapshot is no outage
# as a whole. A pod whose candidates are all among the stale ones used to get every node failed: kube-scheduler parked
# it as unschedulable (its telemetry coming back is no cluster event) until its 5-minute flush.


def _restarted(clock: Clock) -> tuple[PerNodeSource, Extender, TestClient]:
    """An extender over a source whose nodes can be frozen (:func:`_outage_then_back`)."""
    src = PerNodeSource(capture_nodes(), clock)
    ext, _, _ = make_extender(on_stale="deny", source=src, clock=clock)
    return src, ext, TestClient(create_app(ext))


def _outage_then_back(c: TestClient, ext: Extender, src: PerNodeSource, clock: Clock, fresh: Sequence[str]) -> None:
    """The source out for 45 s, then back: ``fresh`` nodes already scraped again, the others still carrying their
    samples of before the outage."""
    assert _refresh(c, ext) is True
    src.fail = True
    before = clock.t
    clock.t += 45
    assert _refresh(c, ext) is False
    src.fail = False
    src.frozen = {n.name: before for n in src.nodes if n.name not in fresh}
    assert _refresh(c, ext) is True


def test_every_candidate_still_stale_after_an_outage_answers_error_not_failed_nodes() -> None:
    clock = Clock()
    src, ext, client = _restarted(clock)
    with client as c:
        _outage_then_back(c, ext, src, clock, fresh=["gpu-node-2"])
        assert ext.outage(ext.framework.context(ext.cache.snapshot.arrays, clock.t).stale, clock.t) is None
        # gpu-node-2 is fresh but not the pod's candidate (kube-scheduler's own filters dropped it: a taint)
        body = c.post("/filter", content=args(pod(), ["gpu-node-1"])).json()
        assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {} and body["NodeNames"] == []
        assert body["Error"].startswith("kelvin's GPU telemetry is stale for every candidate node: 1 older than")
        assert body["Error"].endswith(OUTAGE_RETRY)
        # the fresh node passes as soon as it is a candidate; the stale one still fails beside it
        both = c.post("/filter", content=args(pod())).json()
        assert both["Error"] == "" and both["NodeNames"] == ["gpu-node-2"]
        assert "stale telemetry" in both["FailedAndUnresolvableNodes"]["gpu-node-1"]
        m = c.get("/metrics").text
        assert 'kelvin_extender_rejections_total{reason="stale_telemetry"} 2.0' in m
        # gpu-node-1 scraped again: the backoff retry passes
        src.frozen.clear()
        clock.t += 1
        assert _refresh(c, ext) is True
        again = c.post("/filter", content=args(pod(), ["gpu-node-1"])).json()
        assert again["Error"] == "" and again["NodeNames"] == ["gpu-node-1"]


def test_candidates_not_yet_in_the_snapshot_after_an_outage_answer_error() -> None:
    """After an outage longer than Prometheus' lookback (5 min) a restarted Prometheus has no sample of a node it has
    not scraped again yet: the node is missing from the snapshot, as transient as a stale one."""
    clock = Clock()
    src = StaticSource(capture_nodes(), clock)
    ext, _, _ = make_extender(on_stale="deny", source=src, clock=clock)
    with TestClient(create_app(ext)) as c:
        src.fail = True
        clock.t += 400
        assert _refresh(c, ext) is False
        src.fail, src.nodes = False, capture_nodes()[1:]  # back: gpu-node-1 not scraped yet
        clock.t += 1
        assert _refresh(c, ext) is True
        body = c.post("/filter", content=args(pod(), ["gpu-node-1"])).json()
        assert body["FailedAndUnresolvableNodes"] == {} and body["NodeNames"] == []
        assert "every candidate node: 1 not in the snapshot;" in body["Error"] and body["Error"].endswith(OUTAGE_RETRY)


def test_a_node_still_stale_max_age_after_the_outage_fails_again() -> None:
    """The window is bounded: a node not scraped again within ``maxAgeSeconds`` of the outage's end is gone (its
    exporter, or the node), not coming back; a pod that only fits there is parked again, as before the outage."""
    clock = Clock()
    src, ext, client = _restarted(clock)
    with client as c:
        _outage_then_back(c, ext, src, clock, fresh=["gpu-node-2"])
        clock.t += 29
        assert _refresh(c, ext) is True
        inside = c.post("/filter", content=args(pod(), ["gpu-node-1"])).json()
        assert "back 29 s ago from an outage" in inside["Error"]
        clock.t += 1
        assert _refresh(c, ext) is True
        after = c.post("/filter", content=args(pod(), ["gpu-node-1"])).json()
        assert after["Error"] == "" and "stale telemetry" in after["FailedAndUnresolvableNodes"]["gpu-node-1"]


def test_the_window_is_the_policys_max_age_not_the_caches() -> None:
    """The policy's ``telemetry.maxAgeSeconds`` (30 s here) judges the nodes, so it bounds the window too, whatever
    the cache's own ``max_telemetry_age_s`` (readiness, the refresh cadence)."""
    clock = Clock()
    src = PerNodeSource(capture_nodes(), clock)
    ext, _, _ = make_extender(on_stale="deny", source=src, clock=clock, max_telemetry_age_s=90)
    with TestClient(create_app(ext)) as c:
        _outage_then_back(c, ext, src, clock, fresh=["gpu-node-2"])
        clock.t += 30
        assert _refresh(c, ext) is True
        assert ext.cache.after_outage(clock.t)  # the cache's 90 s
        after = c.post("/filter", content=args(pod(), ["gpu-node-1"])).json()
        assert after["Error"] == "" and "stale telemetry" in after["FailedAndUnresolvableNodes"]["gpu-node-1"]


def test_a_fresh_node_without_room_beside_stale_ones_still_fails_every_node() -> None:
    """Stale telemetry is not the only reason the pod is refused: a fresh node it does not fit. Failing the nodes
    keeps preemption possible there (an ``Error`` reply skips kube-scheduler's PostFilter); the pod is parked."""
    clock = Clock()
    src, ext, client = _restarted(clock)
    with client as c:
        _outage_then_back(c, ext, src, clock, fresh=["gpu-node-1"])
        body = c.post("/filter", content=args(pod(gpus=4))).json()  # gpu-node-1 has 2 free GPUs, gpu-node-2 stale
        assert body["Error"] == "" and body["NodeNames"] == []
        assert set(body["FailedNodes"]) == {"gpu-node-1"}
        assert set(body["FailedAndUnresolvableNodes"]) == {"gpu-node-2"}


def test_a_bad_annotation_is_never_retried_as_stale_telemetry() -> None:
    clock = Clock()
    src, ext, client = _restarted(clock)
    with client as c:
        _outage_then_back(c, ext, src, clock, fresh=["gpu-node-2"])
        bad = pod(annotations={"kelvin.dev/gpu-memory": "lots"})
        body = c.post("/filter", content=args(bad, ["gpu-node-1"])).json()
        assert body["Error"] == "" and "kelvin.dev/gpu-memory" in body["FailedAndUnresolvableNodes"]["gpu-node-1"]
