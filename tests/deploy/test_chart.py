"""helm lint, helm template for every ci/*-values.yaml, and every rendered object validated.

Built-in kinds are validated against the Kubernetes OpenAPI schemas (kubernetes-validate, strict: unknown fields
fail). Objects of custom resources cannot be: ClusterKopfPeering is validated against the CRD the chart ships;
ServiceMonitor, PrometheusRule, Certificate and Issuer against hand-written JSON schemas of the fields the chart
uses, copied from the upstream CRDs (prometheus-operator monitoring.coreos.com/v1, cert-manager.io/v1), strict as
well. The PrometheusRule's rules themselves are checked by promtool (test_rules.py).
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate
import pytest
import yaml
from deploy_helpers import (
    CHART,
    CI_VALUES,
    K8S_VERSION,
    NAMESPACE,
    RELEASE,
    Doc,
    Render,
    by_kind,
    one,
    pod_spec,
    run_helm,
)

pytestmark = pytest.mark.helm

_STR = {"type": "string"}
_STRMAP = {"type": "object", "additionalProperties": _STR}
_META = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {"name": _STR, "namespace": _STR, "labels": _STRMAP, "annotations": _STRMAP},
}


def _cr(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": _META, "spec": spec},
    }


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": props, "required": required or []}


_SELECTOR = _obj(
    {
        "matchLabels": _STRMAP,
        "matchExpressions": {
            "type": "array",
            "items": _obj(
                {
                    "key": _STR,
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array"},
                },
                ["key", "operator"],
            ),
        },
    }
)
_PROM_DURATION = "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_RELABEL = _obj(
    {
        "sourceLabels": {"type": "array", "items": _STR},
        "targetLabel": _STR,
        "regex": _STR,
        "replacement": _STR,
        "action": _STR,
        "separator": _STR,
    }
)
_RULE = _obj(
    {
        "alert": _STR,
        "record": _STR,
        "expr": _STR,
        "for": _STR,
        "keep_firing_for": _STR,
        "labels": _STRMAP,
        "annotations": _STRMAP,
    },
    ["expr"],
)
CUSTOM_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": _cr(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        _obj(
            {
                "selector": _SELECTOR,
                "namespaceSelector": _obj({"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": _STR}}),
                "jobLabel": _STR,
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": _obj(
                        {
                            "port": _STR,
                            "path": _STR,
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {
                                "type": "string",
                                "pattern": _PROM_DURATION,
                            },
                            "relabelings": {"type": "array", "items": _RELABEL},
                            "metricRelabelings": {"type": "array", "items": _RELABEL},
                        }
                    ),
                },
            },
            ["selector", "endpoints"],
        ),
    ),
    "PrometheusRule": _cr(
        "monitoring.coreos.com/v1",
        "PrometheusRule",
        _obj(
            {
                "groups": {
                    "type": "array",
                    "items": _obj(
                        {"name": _STR, "interval": _STR, "rules": {"type": "array", "items": _RULE}}, ["name", "rules"]
                    ),
                }
            },
            ["groups"],
        ),
    ),
    "Issuer": _cr(
        "cert-manager.io/v1", "Issuer", _obj({"selfSigned": _obj({"crlDistributionPoints": {"type": "array"}})})
    ),
    "Certificate": _cr(
        "cert-manager.io/v1",
        "Certificate",
        _obj(
            {
                "secretName": _STR,
                "duration": _STR,
                "renewBefore": _STR,
                "dnsNames": {"type": "array", "minItems": 1, "items": _STR},
                "privateKey": _obj(
                    {
                        "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                        "size": {"type": "integer"},
                        "rotationPolicy": {"enum": ["Never", "Always"]},
                        "encoding": {"enum": ["PKCS1", "PKCS8"]},
                    }
                ),
                "issuerRef": _obj({"name": _STR, "kind": _STR, "group": _STR}, ["name"]),
            },
            ["secretName", "issuerRef"],
        ),
    ),
}


def _crd_schemas() -> dict[str, dict[str, Any]]:
    """Schemas of the custom resources whose CRDs the chart ships (crds/)."""
    out = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        version = crd["spec"]["versions"][0]
        schema = dict(version["schema"]["openAPIV3Schema"])
        props = dict(schema.get("properties", {}))
        props.update(
            {
                "apiVersion": {"const": f"{crd['spec']['group']}/{version['name']}"},
                "kind": {"const": crd["spec"]["names"]["kind"]},
                "metadata": _META,
            }
        )
        out[crd["spec"]["names"]["kind"]] = {**schema, "properties": props, "additionalProperties": False}
    return out


SHIPPED_CRD_SCHEMAS = _crd_schemas()


def validate_object(doc: Doc) -> None:
    kind = doc.get("kind", "")
    schema = SHIPPED_CRD_SCHEMAS.get(kind) or CUSTOM_SCHEMAS.get(kind)
    name = f"{kind}/{doc.get('metadata', {}).get('name')}"
    if schema is not None:
        try:
            jsonschema.validate(doc, schema)
        except jsonschema.ValidationError as exc:
            pytest.fail(f"{name}: {exc.message} at {'/'.join(map(str, exc.absolute_path))}")
        return
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{name}: {exc.message} at {'/'.join(map(str, exc.path))}")
    except kubernetes_validate.SchemaNotFoundError:
        pytest.fail(f"{name}: no Kubernetes {K8S_VERSION} schema for {doc.get('apiVersion')} {kind}")


@pytest.mark.slow
def test_helm_lint_strict(helm_bin: str) -> None:
    for values in [None, *CI_VALUES]:
        args = ["lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
        proc = run_helm(helm_bin, *args, check=False)
        assert proc.returncode == 0, f"helm lint {values}:\n{proc.stdout}{proc.stderr}"


@pytest.mark.slow
@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_every_rendered_object_validates(render: Render, values: Path) -> None:
    docs = render(values, crds=True)
    assert len(docs) >= 5
    for doc in docs:
        validate_object(doc)


def test_defaults_validate_on_the_oldest_supported_kubernetes(render: Render) -> None:
    """Chart.yaml says kubeVersion >=1.28: nothing rendered may need a newer API."""
    oldest = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"].removeprefix(">=").split("-")[0]
    assert oldest == "1.28.0"
    for doc in render(crds=True):
        if doc["kind"] in SHIPPED_CRD_SCHEMAS or doc["kind"] in CUSTOM_SCHEMAS:
            continue
        try:
            kubernetes_validate.validate(doc, oldest, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} on Kubernetes {oldest}: {exc.message}")


def test_validation_catches_a_bad_object() -> None:
    """The validators used above do reject what the API server would reject (a misspelt field, a bad CR)."""
    bad = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {"replica": 1, "selector": {"matchLabels": {"a": "b"}}, "template": {}},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    sm = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": "x"},
          "spec": {"selector": {}, "endpoints": [{"port": "metrics", "intervall": "30s"}]}}  # fmt: skip
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(sm, CUSTOM_SCHEMAS["ServiceMonitor"])


def test_expected_objects_per_configuration(render: Render) -> None:
    def kinds(docs: list[Doc]) -> list[str]:
        return sorted({d["kind"] for d in docs})

    default = render(CHART / "ci" / "default-values.yaml")
    assert {
        "Deployment",
        "DaemonSet",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "Secret",
    } <= set(kinds(default))
    assert not by_kind(default, "ServiceMonitor") and not by_kind(default, "PrometheusRule")  # off by default
    monitoring = render(CHART / "ci" / "monitoring-values.yaml")
    assert by_kind(monitoring, "ServiceMonitor") and by_kind(monitoring, "PrometheusRule")
    cm = render(CHART / "ci" / "cert-manager-values.yaml")
    assert by_kind(cm, "Certificate") and by_kind(cm, "Issuer") and not by_kind(cm, "Secret")
    dcgm = render(CHART / "ci" / "dcgm-values.yaml")
    assert not by_kind(dcgm, "DaemonSet")
    dry = render(CHART / "ci" / "dry-run-operator-values.yaml")
    assert not by_kind(dry, "MutatingWebhookConfiguration") and not by_kind(dry, "PodDisruptionBudget")


def _kube_scheduler_config(docs: list[Doc]) -> dict[str, Any]:
    cm = one(docs, "ConfigMap", "scheduler")
    return yaml.safe_load(cm["data"]["scheduler-config.yaml"])  # type: ignore[no-any-return]


def test_profile_score_plugins_and_nodes_to_score_are_values(render: Render, helm_bin: str) -> None:
    (kept,) = _kube_scheduler_config(render(None, "scheduler.disabledScorePlugins=null"))["profiles"]
    assert kept == {"schedulerName": "kelvin-scheduler"}  # every plugin of kube-scheduler's default profile
    (every,) = _kube_scheduler_config(render(None, "scheduler.percentageOfNodesToScore=100"))["profiles"]
    assert every["percentageOfNodesToScore"] == 100
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for bad, what in (("scheduler.percentageOfNodesToScore=101", "percentageOfNodesToScore"),
                      ("scheduler.disabledScorePlugins[0]=NodeResourcesFitt", "disabledScorePlugins")):  # fmt: skip
        proc = run_helm(helm_bin, *args, "--set", bad, check=False)
        assert proc.returncode != 0 and what in proc.stderr, proc.stderr


def test_cpu_only_pods_cannot_keep_a_resource_the_scheduler_ignores(helm_bin: str) -> None:
    """Sending every pod leaves kube-scheduler no managedResources list: an ignoredByScheduler resource would be
    silently dropped, so the chart refuses it and says what to change."""
    sets = ["scheduler.extender.managedResources[0].name=example.com/fpga",
            "scheduler.extender.managedResources[0].ignoredByScheduler=true"]  # fmt: skip
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(helm_bin, *args, check=False)
    assert proc.returncode != 0
    assert "example.com/fpga has ignoredByScheduler: true" in proc.stderr and "cpuOnlyPods: false" in proc.stderr
    proc = run_helm(helm_bin, *args, "--set", "scheduler.extender.cpuOnlyPods=false", check=False)
    assert proc.returncode == 0, proc.stderr


def test_scheduler_config_calls_the_sidecar_extender(render: Render, fixtures_dir: Path) -> None:
    docs = render()
    cfg = _kube_scheduler_config(docs)
    real = yaml.safe_load((fixtures_dir / "scheduler-config" / "scheduler-extender-nodecache-true.yaml").read_text())
    assert cfg["apiVersion"] == real["apiVersion"] and cfg["kind"] == real["kind"]
    # every extender field we set is one a real kube-scheduler v1.32 accepted, plus bindVerb and preemptVerb (same
    # struct; the e2e suite runs this configuration on kube-scheduler 1.36, whose config loading is strict)
    (ext,) = cfg["extenders"]
    assert set(ext) <= set(real["extenders"][0]) | {"bindVerb", "preemptVerb"}
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is False and ext["bindVerb"] == "bind"
    assert ext["preemptVerb"] == "preempt"
    # cpuOnlyPods (default): no managedResources, so kube-scheduler sends every pod of the profile, CPU-only ones too
    assert "managedResources" not in ext
    (only_gpu,) = _kube_scheduler_config(render(None, "scheduler.extender.cpuOnlyPods=false"))["extenders"]
    assert only_gpu["managedResources"] == [
        {"name": "nvidia.com/gpu", "ignoredByScheduler": False},
        {"name": "kelvin.dev/shared-gpu", "ignoredByScheduler": False},  # pool-only pods reach the extender too
    ]
    # kube-scheduler's resource scores off in kelvin's profile (they spread against kelvin's packing), its filters on
    assert cfg["profiles"] == [
        {
            "schedulerName": "kelvin-scheduler",
            "plugins": {
                "score": {"disabled": [{"name": "NodeResourcesFit"}, {"name": "NodeResourcesBalancedAllocation"}]}
            },
        }
    ]
    le = cfg["leaderElection"]
    assert le["leaderElect"] is True and le["resourceLock"] == "leases" and le["resourceNamespace"] == NAMESPACE
    # componentbaseconfig/v1alpha1 LeaderElectionConfiguration (what KubeSchedulerConfiguration v1 embeds)
    upstream_le = {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock", "resourceName",
                   "resourceNamespace"}  # fmt: skip
    assert set(le) <= upstream_le
    assert set(cfg) <= set(real) | {"extenders", "profiles"} and "clientConnection" not in cfg  # in-cluster config
    # the urlPrefix reaches the extender sidecar of the same pod on localhost
    dep = one(docs, "Deployment", "scheduler")
    containers = {c["name"]: c for c in pod_spec(dep)["containers"]}
    assert set(containers) == {"kube-scheduler", "extender"}
    env = {e["name"]: e.get("value") for e in containers["extender"]["env"]}
    assert ext["urlPrefix"] == f"http://127.0.0.1:{env['KELVIN_PORT']}" and env["KELVIN_HOST"] == "127.0.0.1"
    assert containers["extender"]["args"][0] == "extender"
    assert any(
        a.startswith("--config=/etc/kubernetes/kelvin-scheduler/") for a in containers["kube-scheduler"]["command"]
    )
    # ignorable is a documented switch
    ign = _kube_scheduler_config(render(None, "scheduler.extender.ignorable=true"))
    assert ign["extenders"][0]["ignorable"] is True


def _rules(docs: list[Doc]) -> list[dict[str, Any]]:
    return [r for d in by_kind(docs, "ClusterRole") + by_kind(docs, "Role") for r in d["rules"]]


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_rbac_is_least_privilege(render: Render, values: Path) -> None:
    for rule in _rules(render(values)):
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(field, []), f"wildcard in {rule}"
        assert "secrets" not in rule["resources"], f"secrets access: {rule}"
        assert not {"delete", "deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"]), rule


def test_rbac_grants_what_each_component_calls(render: Render) -> None:
    docs = render()

    def grants(role: Doc) -> set[tuple[str, str, str]]:
        return {
            (g, r, v)
            for rule in role["rules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["verbs"]
        }

    extender = grants(one(docs, "ClusterRole", "extender"))
    assert extender == {
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods/binding", "create"),  # the Binding carries the GPU annotations: no pod patch
        ("", "nodes", "list"),  # the topology levels' labels, for `kelvin explain`'s gang forecast
        ("policy", "poddisruptionbudgets", "list"),  # the preempt verb's own list of budgets
    }
    namespaced = grants(one(docs, "Role", "scheduler"))
    assert ("discovery.k8s.io", "endpointslices", "list") in namespaced  # default source: scrape, own namespace only
    assert ("coordination.k8s.io", "leases", "update") in namespaced
    prom = grants(one(render(None, "extender.source=prometheus"), "Role", "scheduler"))
    assert not any(r == "endpointslices" for _, r, _ in prom)
    operator = grants(one(docs, "ClusterRole", "operator"))
    assert {
        ("", "nodes", "patch"),
        ("", "pods/eviction", "create"),
        ("", "events", "create"),
        ("kopf.dev", "clusterkopfpeerings", "patch"),
    } <= operator
    # kube-scheduler itself runs with the upstream roles
    bound = {b["roleRef"]["name"] for b in by_kind(docs, "ClusterRoleBinding")}
    assert {"system:kube-scheduler", "system:volume-scheduler"} <= bound
    lease = one(docs, "Role", "scheduler")
    assert any(r.get("resourceNames") == ["kelvin-scheduler"] for r in lease["rules"])


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_pod_security(render: Render, values: Path) -> None:
    for doc in [d for d in render(values) if d["kind"] in {"Deployment", "DaemonSet"}]:
        spec = pod_spec(doc)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert "resources" in c and c["resources"]["requests"] and c["resources"]["limits"]["memory"], c["name"]
            assert "livenessProbe" in c, c["name"]
        host_access = spec.get("hostPID", False) or any("hostPath" in v for v in spec.get("volumes", []))
        attribution = doc["kind"] == "DaemonSet" and "attribution" in values.name
        assert bool(host_access) == attribution, f"{doc['metadata']['name']}: host access only for pod attribution"


def test_exporter_daemonset_targets_gpu_nodes(render: Render) -> None:
    ds = one(render(), "DaemonSet", "exporter")
    spec = pod_spec(ds)
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]
    assert {"key": "kelvin.dev/thermal", "operator": "Exists"} in spec["tolerations"]
    assert "runtimeClassName" not in spec and "hostPID" not in spec
    attributed = pod_spec(one(render(CHART / "ci" / "exporter-attribution-values.yaml"), "DaemonSet"))
    assert attributed["runtimeClassName"] == "nvidia" and attributed["hostPID"] is True
    assert attributed["securityContext"]["supplementalGroups"] == [44]
    assert "supplementalGroups" not in spec["securityContext"]


def test_webhooks_never_see_kube_system_and_share_the_ca(render: Render) -> None:
    docs = render()
    secret = one(docs, "Secret", "webhook")
    ca = secret["data"]["ca.crt"]
    assert base64.b64decode(ca).startswith(b"-----BEGIN CERTIFICATE-----")
    svc = one(docs, "Service", "webhook")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in one(docs, kind)["webhooks"]:
            assert hook["failurePolicy"] == "Ignore"
            assert hook["clientConfig"]["caBundle"] == ca
            assert hook["clientConfig"]["service"]["name"] == svc["metadata"]["name"]
            (expr,) = hook["namespaceSelector"]["matchExpressions"]
            assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "NotIn"
            assert {"kube-system", NAMESPACE} <= set(expr["values"])
    # cert-manager: no caBundle from Helm, the cainjector annotation instead
    cm = render(CHART / "ci" / "cert-manager-values.yaml")
    hook_cfg = one(cm, "ValidatingWebhookConfiguration")
    assert hook_cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/kelvin-webhook"
    assert "caBundle" not in hook_cfg["webhooks"][0]["clientConfig"]
    assert hook_cfg["webhooks"][0]["failurePolicy"] == "Fail"
    cert = one(cm, "Certificate")
    assert f"{svc['metadata']['name']}.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]


def test_policy_configmap_checksum_rolls_the_pods(render: Render) -> None:
    def checksums(docs: list[Doc]) -> dict[str, str]:
        return {
            d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for d in by_kind(docs, "Deployment")
        }

    base = render()
    changed = render(None, "policy.ledger.ttlSeconds=45")
    assert set(checksums(base)) == {"kelvin-scheduler", "kelvin-operator"}
    assert len(set(checksums(base).values())) == 1  # both mount the same ConfigMap
    assert checksums(base)["kelvin-scheduler"] != checksums(changed)["kelvin-scheduler"]
    policy = yaml.safe_load(one(changed, "ConfigMap", "policy")["data"]["policy.yaml"])
    assert policy["ledger"]["ttlSeconds"] == 45
    for dep in by_kind(base, "Deployment"):
        vols = {v["name"]: v for v in pod_spec(dep)["volumes"]}
        assert vols["policy"]["configMap"]["name"] == one(base, "ConfigMap", "policy")["metadata"]["name"]


def test_dashboards_configmap_for_the_grafana_sidecar(render: Render) -> None:
    cm = one(render(), "ConfigMap", "dashboards")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = {p.name: p.read_text() for p in (CHART / "dashboards").glob("*.json")}
    assert set(cm["data"]) == set(files)
    for name, text in files.items():
        assert hashlib.sha256(cm["data"][name].encode()).digest() == hashlib.sha256(text.rstrip("\n").encode()).digest()
    moved = one(render(CHART / "ci" / "monitoring-values.yaml"), "ConfigMap", "dashboards")
    assert moved["metadata"]["namespace"] == "monitoring"


def test_servicemonitor_selects_every_metrics_service(render: Render) -> None:
    docs = render(CHART / "ci" / "monitoring-values.yaml")
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = sm["spec"]["selector"]
    (expr,) = selector["matchExpressions"]
    ports = {e["port"] for e in sm["spec"]["endpoints"]}
    services = by_kind(docs, "Service")
    assert len(services) == 3
    for svc in services:
        labels = svc["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in selector["matchLabels"].items())
        assert labels["app.kubernetes.io/component"] in expr["values"]
        assert ports <= {p["name"] for p in svc["spec"]["ports"]}, svc["metadata"]["name"]


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_install_dry_run_renders_notes(helm_bin: str, values: Path) -> None:
    """`helm install --dry-run` goes further than `helm template`: it also renders NOTES.txt."""
    proc = run_helm(helm_bin, "install", "kelvin", str(CHART), "-n", NAMESPACE, "--dry-run=client", "-f", str(values))
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "helm uninstall kelvin -n kelvin-system" in notes
    values_doc = yaml.safe_load(values.read_text()) or {}
    if values_doc.get("scheduler", {}).get("enabled", True):
        assert "schedulerName: kelvin-scheduler" in notes
