"""Faults: the extender killed and restarted, the API server restarted, Prometheus stopped and back; kelvin-scheduler
places pods again after each, as the API server shows."""

from __future__ import annotations

import time

import yaml

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


def test_pod_refused_for_stale_telemetry_is_bound_within_15_s_of_prometheus_back(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, fresh_telemetry: Telemetry, namespace: str
) -> None:
    """Issue 20, defect 8: Prometheus stopped for longer than the policy's ``telemetry.maxAgeSeconds``: a GPU pod
    created then is refused with the stale-telemetry reason in its PodScheduled condition; once Prometheus is back
    (same port and tsdb), the pod is bound within 15 s, not at kube-scheduler's 5-minute flush."""
    policy = yaml.safe_load((kelvin_scheduler.workdir / "policy.yaml").read_text())
    max_age = float(policy.get("telemetry", {}).get("maxAgeSeconds", 30))
    prometheus = fresh_telemetry.prometheus
    prometheus.stop()
    down = time.monotonic()
    time.sleep(max(0.0, down + max_age + 2 - time.monotonic()))
    cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", gpu_pod("stale", 1))
    condition = unschedulable(cluster, namespace, "stale", kelvin_scheduler)
    assert "stale" in condition["message"], condition
    prometheus.start()
    back = time.monotonic()
    pod = bound(cluster, namespace, "stale", kelvin_scheduler)
    took = time.monotonic() - back
    print(f"prometheus down {back - down:.0f} s; pod bound {took:.1f} s after prometheus was ready")
    assert took <= 15, f"bound {took:.1f} s after prometheus was back"
    assert len(assigned(pod)) == 1
