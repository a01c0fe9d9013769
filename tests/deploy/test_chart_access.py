"""Who may reach what: the extender's verbs on loopback only, NetworkPolicies, webhook matchConditions (evaluated as
CEL against sample pods), and monitoring objects only where the Prometheus Operator's API exists."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from deploy_helpers import (
    CHART,
    K8S_VERSION,
    NAMESPACE,
    PROMETHEUS_OPERATOR_API,
    Doc,
    Render,
    by_kind,
    cel,
    one,
    pod_spec,
    run_helm,
)

pytestmark = pytest.mark.helm

WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def _extender(docs: list[Doc]) -> Doc:
    (c,) = [c for c in pod_spec(one(docs, "Deployment", "scheduler"))["containers"] if c["name"] == "extender"]
    return c


def test_extender_verbs_listen_on_loopback_and_only_metrics_are_exposed(render: Render) -> None:
    docs = render()
    c = _extender(docs)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KELVIN_HOST"] == "127.0.0.1" and env["KELVIN_PORT"] == "8888"
    assert env["KELVIN_METRICS_HOST"] == "0.0.0.0" and env["KELVIN_METRICS_PORT"] == "8889"
    assert c["args"] == ["extender"]  # no --host flag overriding the loopback default
    assert c["ports"] == [{"name": "metrics", "containerPort": 8889}]  # the verbs' port is not a pod port
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    svc = one(docs, "Service", "extender")
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 8889, "targetPort": "metrics", "protocol": "TCP"}]
    # metricsPort is a value; the same port for both listeners is refused at render time
    moved = _extender(render(None, "extender.metricsPort=9999"))
    assert moved["ports"][0]["containerPort"] == 9999
    assert {"name": "KELVIN_METRICS_PORT", "value": "9999"} in moved["env"]


def test_metrics_port_equal_to_the_verbs_port_is_refused(helm_bin: str) -> None:
    proc = run_helm(helm_bin, "template", "kelvin", str(CHART), "--set", "extender.metricsPort=8888", check=False)
    assert proc.returncode != 0 and "extender.port and extender.metricsPort are both 8888" in proc.stderr


def _labels_of_pods(docs: list[Doc]) -> dict[str, dict[str, str]]:
    return {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]["metadata"]["labels"]
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
    }


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_network_policies_admit_only_kelvins_traffic(render: Render) -> None:
    assert not by_kind(render(), "NetworkPolicy")  # off by default
    docs = render(None, "networkPolicy.enabled=true")
    policies = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p for p in by_kind(docs, "NetworkPolicy")}
    assert set(policies) == {"scheduler", "operator", "exporter"}
    pods = _labels_of_pods(docs)
    prometheus = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    for component, policy in policies.items():
        kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        # each policy selects exactly its own component's pods
        assert [c for c, labels in pods.items() if _selects(spec["podSelector"], labels)] == [component]

    (rule,) = policies["scheduler"]["spec"]["ingress"]  # the metrics port from Prometheus, nothing else
    assert rule == {"from": [prometheus], "ports": [{"port": 8889, "protocol": "TCP"}]}

    webhook, metrics = policies["operator"]["spec"]["ingress"]
    assert webhook == {"ports": [{"port": 9443, "protocol": "TCP"}]}  # from anywhere: the API server
    assert metrics == {"from": [prometheus], "ports": [{"port": 8080, "protocol": "TCP"}]}

    (rule,) = policies["exporter"]["spec"]["ingress"]
    assert rule["ports"] == [{"port": 9400, "protocol": "TCP"}]
    peers = rule["from"]
    assert prometheus in peers
    readers = [
        c
        for c, labels in pods.items()
        if any(set(p) == {"podSelector"} and _selects(p["podSelector"], labels) for p in peers)
    ]
    assert sorted(readers) == ["operator", "scheduler"]  # the scrape telemetry source of both

    # Prometheus anywhere: empty selectors are kept as {} (every namespace / every pod), not dropped
    anywhere = render(None, "networkPolicy.enabled=true", "networkPolicy.prometheus.namespaceSelector=null")
    (rule,) = one(anywhere, "NetworkPolicy", "scheduler")["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {}, "podSelector": prometheus["podSelector"]}]
    # without webhooks the operator admits only the metrics scrape
    quiet = one(
        render(None, "networkPolicy.enabled=true", "operator.webhook.enabled=false"), "NetworkPolicy", "operator"
    )
    assert [r.get("from") for r in quiet["spec"]["ingress"]] == [[prometheus]]


def _pod(annotations: dict[str, str] | None = None, **containers: list[dict[str, Any]]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ml"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [{"name": "c"}], **containers}}


def _res(**parts: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": "c", "image": "x", "resources": parts}]


SAMPLES: list[tuple[str, dict[str, Any], bool]] = [
    ("plain pod", _pod(), False),
    ("other annotations", _pod({"prometheus.io/scrape": "true"}), False),
    ("cpu only", _pod(containers=_res(requests={"cpu": "1"}, limits={"memory": "1Gi"})), False),
    ("empty resources", _pod(containers=[{"name": "c", "resources": {}}]), False),
    ("a GPU in an other vendor's resource", _pod(containers=_res(limits={"amd.com/gpu": "1"})), False),
    ("whole GPU as a limit", _pod(containers=_res(limits={"nvidia.com/gpu": "1"})), True),
    ("whole GPU as a request", _pod(containers=_res(requests={"nvidia.com/gpu": "1"})), True),
    ("shared-GPU slot", _pod(containers=_res(requests={"kelvin.dev/shared-gpu": "1"})), True),
    ("GPU in an init container", _pod(initContainers=_res(limits={"nvidia.com/gpu": "1"})), True),
    ("GPU in the second container", _pod(containers=[{"name": "a"}, *_res(limits={"nvidia.com/gpu": "2"})]), True),
    ("pool-only pod (annotation)", _pod({"kelvin.dev/gpu-memory": "20Gi"}), True),
    ("checkpoint annotation", _pod({"kelvin.dev/checkpoint": "true"}), True),
]


def _conditions(docs: list[Doc]) -> list[list[dict[str, str]]]:
    return [hook.get("matchConditions", []) for kind in WEBHOOK_KINDS for hook in one(docs, kind)["webhooks"]]


@pytest.mark.parametrize(("what", "pod", "calls"), SAMPLES, ids=[s[0] for s in SAMPLES])
def test_only_gpu_pods_call_the_webhooks(render: Render, what: str, pod: dict[str, Any], calls: bool) -> None:
    """The rendered CEL, evaluated as the API server does (every condition true: the webhook is called)."""
    run = cel(pod)
    for conditions in _conditions(render()):
        assert [c["name"] for c in conditions] == ["kelvin-gpu-pods"]
        results = [run(c["expression"]) for c in conditions]
        assert all(results) is calls, what


def test_match_conditions_follow_the_managed_resources_and_can_be_turned_off(render: Render) -> None:
    docs = render(None, "scheduler.extender.managedResources[0].name=example.com/gpu")  # --set: a one-item list
    for conditions in _conditions(docs):
        assert "r in ['example.com/gpu']" in conditions[0]["expression"]
        assert "nvidia.com/gpu" not in conditions[0]["expression"]
    off = render(None, "operator.webhook.matchConditions=false")
    assert _conditions(off) == [[], []]


def test_monitoring_objects_render_only_with_the_prometheus_operator_api(render: Render, helm_bin: str) -> None:
    values = CHART / "ci" / "monitoring-values.yaml"
    with_api = render(values, api_versions=(PROMETHEUS_OPERATOR_API,))
    assert by_kind(with_api, "ServiceMonitor") and by_kind(with_api, "PrometheusRule")
    without = render(values, api_versions=())
    assert not by_kind(without, "ServiceMonitor") and not by_kind(without, "PrometheusRule")
    assert by_kind(without, "ConfigMap")  # the dashboards need no CRD and stay
    notes = run_helm(helm_bin, "install", "kelvin", str(CHART), "-n", NAMESPACE, "--dry-run=client", "-f", str(values))
    assert "the ServiceMonitor and the PrometheusRule were skipped" in notes.stdout
    assert "no monitoring.coreos.com/v1 API" in notes.stdout
    quiet = run_helm(helm_bin, "install", "kelvin", str(CHART), "-n", NAMESPACE, "--dry-run=client")
    assert "were skipped" not in quiet.stdout and "was skipped" not in quiet.stdout
