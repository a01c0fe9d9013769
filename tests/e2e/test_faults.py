"""Faults: the extender killed and restarted, the API server restarted, Prometheus stopped and back; kelvin-scheduler
places pods again after each, as the API server shows."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from scheduler_plugin.extender.service import OUTAGE_RETRY
from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster
from tests.e2e.fleet import GPU_NODES
from tests.e2e.kelvin_scheduler import KelvinScheduler
from tests.e2e.pods import assigned, bound, gpu_pod, unschedulable
from tests.e2e.telemetry import Telemetry


def test_pod_created_while_the_extender_is_down_is_placed_after_its_restart(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, namespace: str
) -> None:
    def while_down() -> None:
        cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", gpu_pod("during-outage", 1))
        # ignorable: false (the chart's default): without kelvin the pod waits, with the scheduler's error as reason
        condition = unschedulable(cluster, namespace, "during-outage", kelvin_scheduler, extender_down=True)
        assert "127.0.0.1" in condition["message"] or "extender" in condition["message"].lower(), condition

    kelvin_scheduler.restart_extender(while_down)
    pod = bound(cluster, namespace, "during-outage", kelvin_scheduler)
    assert pod["spec"]["nodeName"] in GPU_NODES
    assert len(assigned(pod)) == 1


def test_kelvin_places_pods_after_an_api_server_restart(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, namespace: str, gpu_nodes: tuple[str, ...]
) -> None:
    """kube-scheduler may lose its leader Lease while the API server is away and exit, by design; it is restarted as
    the kubelet would restart its container. The extender and the fake nodes reconnect on their own."""
    cluster.restart("kube-apiserver")
    cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", gpu_pod("after-restart", 1))
    pod = bound(cluster, namespace, "after-restart", kelvin_scheduler, supervise=True)
    assert len(assigned(pod)) == 1
    assert all(cluster.node_ready(name) for name in gpu_nodes)


#: The extender's series that tell which reply a pod got: per-node decisions, rejections by kind, nodes by freshness.
WATCHED_SERIES = ("kelvin_extender_decisions_total", "kelvin_extender_rejections_total", "kelvin_telemetry_nodes")


def _extender_series(ks: KelvinScheduler) -> dict[str, float]:
    """The extender's :data:`WATCHED_SERIES` now ({} when its metrics port does not answer)."""
    try:
        text = httpx.get(f"http://127.0.0.1:{ks.extender_metrics_port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in WATCHED_SERIES:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def _replies(cluster: LoopbackCluster, ks: KelvinScheduler, namespace: str, name: str, since: dict[str, float]) -> str:
    """What the pod was told, for a failure: its PodScheduled condition, kube-scheduler's lines about it (an
    ``Error`` reply is "Error selecting node", failed nodes are "no fit; waiting": parked as unschedulable) and the
    extender's decisions and rejections since ``since``, with its nodes by freshness."""
    pod = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    conditions = [c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"]
    lines = [
        line.strip()[:600]
        for line in (ks.logs / "kelvin-kube-scheduler.log").read_text(errors="replace").splitlines()
        if f'pod="{namespace}/{name}"' in line
    ]
    now = _extender_series(ks)
    gauges = [f"  {k} = {v:g}" for k, v in sorted(now.items()) if k.startswith("kelvin_telemetry_nodes")]
    counts = [
        f"  {k} {v - since.get(k, 0.0):+g}"
        for k, v in sorted(now.items())
        if not k.startswith("kelvin_telemetry_nodes") and v != since.get(k, 0.0)
    ]
    head = [f"PodScheduled: {conditions}", "kube-scheduler about the pod:", *lines[-30:], "extender since the pod:"]
    return "\n".join([*head, *counts, *gauges])


def test_pod_refused_for_stale_telemetry_is_bound_within_15_s_of_prometheus_back(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, fresh_telemetry: Telemetry, namespace: str
) -> None:
    """Issue 20, defect 8: Prometheus stopped for longer than the policy's ``telemetry.maxAgeSeconds``: a GPU pod
    created then is refused with the outage's ``Error`` (kube-scheduler retries it with backoff, it is not parked as
    unschedulable) in its PodScheduled condition; once Prometheus is back (same port and tsdb), the pod is bound
    within 15 s, not at kube-scheduler's 5-minute flush, including while Prometheus has scraped some nodes again and
    not yet the others (the filter answers ``Error`` while every candidate is stale). On failure it says which replies
    the pod got."""
    policy = yaml.safe_load((kelvin_scheduler.workdir / "policy.yaml").read_text())
    max_age = float(policy.get("telemetry", {}).get("maxAgeSeconds", 30))
    prometheus = fresh_telemetry.prometheus
    prometheus.stop()
    down = time.monotonic()
    time.sleep(max(0.0, down + max_age + 2 - time.monotonic()))
    since = _extender_series(kelvin_scheduler)
    cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", gpu_pod("stale", 1))
    condition = unschedulable(cluster, namespace, "stale", kelvin_scheduler)
    # the outage's Error, not the per-node stale reason of failed nodes (both say "stale")
    told = _replies(cluster, kelvin_scheduler, namespace, "stale", since)
    assert "kelvin's GPU telemetry is stale" in condition["message"], told
    assert OUTAGE_RETRY in condition["message"], told
    prometheus.start()
    back = time.monotonic()
    try:
        pod = bound(cluster, namespace, "stale", kelvin_scheduler)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{_replies(cluster, kelvin_scheduler, namespace, 'stale', since)}") from None
    took = time.monotonic() - back
    print(f"prometheus down {back - down:.0f} s; pod bound {took:.1f} s after prometheus was ready")
    assert took <= 15, f"bound {took:.1f} s after prometheus was back\n" + _replies(
        cluster, kelvin_scheduler, namespace, "stale", since
    )
    assert len(assigned(pod)) == 1


@contextlib.contextmanager
def _paused(telemetry: Telemetry, nodes: tuple[str, ...]) -> Iterator[None]:
    """The exporters of ``nodes`` stopped (SIGSTOP to each one's own process group), resumed on exit: Prometheus'
    scrapes of them time out, as of exporters it has not reached yet."""
    groups = [telemetry.exporters[n].process.popen.pid for n in nodes]
    try:
        for pgid in groups:
            os.killpg(pgid, signal.SIGSTOP)
        yield
    finally:
        for pgid in groups:
            os.killpg(pgid, signal.SIGCONT)


def test_pod_whose_nodes_are_scraped_last_after_an_outage_is_retried_not_parked(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, fresh_telemetry: Telemetry, namespace: str
) -> None:
    """Issue 20, defect 8, the window made deterministic: after the outage Prometheus has scraped another node again
    (e2e-islands-1, which the pod does not tolerate) but not yet the pod's candidates (their exporters paused). The
    telemetry is no outage as a whole then, and the pod's filter used to fail every candidate as stale: parked as
    unschedulable, never bound within 60 s. It must get an ``Error`` (retried with backoff) and be bound within 15 s
    of its nodes reporting again."""
    policy = yaml.safe_load((kelvin_scheduler.workdir / "policy.yaml").read_text())
    max_age = float(policy.get("telemetry", {}).get("maxAgeSeconds", 30))
    prometheus = fresh_telemetry.prometheus
    since = _extender_series(kelvin_scheduler)
    with _paused(fresh_telemetry, GPU_NODES):
        prometheus.stop()
        time.sleep(max_age + 2)
        cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", gpu_pod("scraped-last", 1))
        condition = unschedulable(cluster, namespace, "scraped-last", kelvin_scheduler)
        assert "kelvin's GPU telemetry is stale" in condition["message"], condition
        prometheus.start()
        wait_for("e2e-islands-1 fresh in the extender's snapshot", lambda: kelvin_scheduler.telemetry_nodes(), 30)

        def retried() -> dict[str, Any] | None:
            c = unschedulable(cluster, namespace, "scraped-last", kelvin_scheduler)
            return c if "stale for every candidate node" in c["message"] else None

        try:
            condition = wait_for("the pod's filter answered with the candidates' Error", retried, 20)
        except TimeoutError as exc:
            raise AssertionError(
                f"{exc}\n{_replies(cluster, kelvin_scheduler, namespace, 'scraped-last', since)}"
            ) from None
        assert OUTAGE_RETRY in condition["message"], condition
        resumed = time.monotonic()
    try:
        pod = bound(cluster, namespace, "scraped-last", kelvin_scheduler)
    except TimeoutError as exc:
        raise AssertionError(
            f"{exc}\n{_replies(cluster, kelvin_scheduler, namespace, 'scraped-last', since)}"
        ) from None
    took = time.monotonic() - resumed
    print(f"pod bound {took:.1f} s after its nodes' exporters resumed")
    assert took <= 15, f"bound {took:.1f} s after its nodes reported again\n" + _replies(
        cluster, kelvin_scheduler, namespace, "scraped-last", since
    )
    assert pod["spec"]["nodeName"] in GPU_NODES and len(assigned(pod)) == 1
