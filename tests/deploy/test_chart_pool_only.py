"""Pool-only pods under the chart: the operator's shared-GPU switch follows what the device plugin serves and what
kube-scheduler sends to the extender, and a ValidatingAdmissionPolicy keeps the pool-only rule while the operator is
down (its CEL is evaluated here with cel-python against the operator's own pool_only())."""

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
from kelvin_operator.webhooks import mutate, pool_only

pytestmark = pytest.mark.helm

VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
WITH_VAP = (PROMETHEUS_OPERATOR_API, VAP_API)
SHARED_ON = "devicePlugin.enabled=true"


def _switch(docs: list[Doc]) -> str:
    env = {e["name"]: e.get("value") for e in pod_spec(one(docs, "Deployment", "operator"))["containers"][0]["env"]}
    return str(env["KELVIN_OPERATOR_WEBHOOK__SHARED_GPU_RESOURCE"])


def _helm(helm_bin: str, *sets: str) -> tuple[int, str]:
    args = ["template", "kelvin", str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(helm_bin, *args, check=False)
    return proc.returncode, proc.stderr


# -- item: the shared-GPU switch ----------------------------------------------------------------------------------


def test_shared_gpu_switch_needs_the_device_plugin_to_serve_the_resource(render: Render) -> None:
    assert _switch(render()) == "false"
    assert _switch(render(None, SHARED_ON)) == "true"
    # deployed, but serving whole GPUs only: no node advertises kelvin.dev/shared-gpu, so the operator must not add it
    assert _switch(render(None, SHARED_ON, "devicePlugin.resourceNames={nvidia.com/gpu}")) == "false"
    # serving the name but not deployed
    assert _switch(render(None, "devicePlugin.resourceNames={kelvin.dev/shared-gpu}")) == "false"


def test_switch_on_without_the_scheduler_managing_shared_gpus_is_refused(helm_bin: str) -> None:
    only_gpus = "scheduler.extender.managedResources[0].name=nvidia.com/gpu"  # --set: a one-item list
    rc, err = _helm(helm_bin, SHARED_ON, only_gpus)
    assert rc != 0
    assert "scheduler.extender.managedResources must list kelvin.dev/shared-gpu" in err
    assert "devicePlugin.enabled=true" in err
    # the same managedResources are fine while the switch is off
    assert _helm(helm_bin, only_gpus)[0] == 0
    assert _helm(helm_bin, SHARED_ON, "devicePlugin.resourceNames={nvidia.com/gpu}", only_gpus)[0] == 0
    # and without the scheduler there is no scheduler configuration to check
    assert _helm(helm_bin, SHARED_ON, only_gpus, "scheduler.enabled=false")[0] == 0


# -- item: operator.webhook.sharedGpuResource is the chart's --------------------------------------------------------


@pytest.mark.parametrize("key", ["sharedGpuResource", "shared_gpu_resource"])
@pytest.mark.parametrize("value", ["true", "false"])
def test_policy_file_cannot_set_the_shared_gpu_switch(helm_bin: str, key: str, value: str) -> None:
    """The chart always sets KELVIN_OPERATOR_WEBHOOK__SHARED_GPU_RESOURCE, which beats the policy file: a policy value
    would be silently ignored, so the chart refuses it."""
    rc, err = _helm(helm_bin, f"policy.operator.webhook.{key}={value}")
    assert rc != 0
    assert "policy.operator.webhook.sharedGpuResource is set by the chart" in err
    assert _helm(helm_bin, "policy.operator.webhook.frameworkEnv=false")[0] == 0  # other webhook keys stay allowed


# -- item: the ValidatingAdmissionPolicy ----------------------------------------------------------------------------


def test_admission_policy_renders_only_where_the_api_is_served(render: Render) -> None:
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    assert not any(by_kind(render(), k) for k in kinds)  # helm template knows no cluster: no API, no policy
    docs = render(None, api_versions=WITH_VAP)
    policy, binding = one(docs, kinds[0]), one(docs, kinds[1])
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    for doc in (policy, binding):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    # the same scope as the webhooks: pods CREATE outside kube-system, kelvin's namespace and the excluded ones
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["CREATE"] and rule["resources"] == ["pods"]
    webhook = one(docs, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert policy["spec"]["matchConstraints"]["namespaceSelector"] == webhook["namespaceSelector"]
    for off in ("operator.admissionPolicy.enabled=false", "operator.enabled=false"):
        assert not any(by_kind(render(None, off, api_versions=WITH_VAP), k) for k in kinds), off


def _pod(annotations: dict[str, str] | None = None, **spec: list[dict[str, Any]]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ml"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [{"name": "c"}], **spec}}


def _res(**parts: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": "c", "image": "x", "resources": parts}]


POOL = {"kelvin.dev/gpu-memory": "20Gi"}
SHARE = {"kelvin.dev/gpu-share": "500"}
SLOT = {"kelvin.dev/shared-gpu": "1"}
SAMPLES: list[tuple[str, dict[str, Any]]] = [
    ("plain pod", _pod()),
    ("other annotations", _pod({"prometheus.io/scrape": "true"})),
    ("checkpoint annotation only", _pod({"kelvin.dev/checkpoint": "true"})),
    ("pool, no resources", _pod(POOL)),
    ("share, no resources", _pod({"kelvin.dev/gpu-share": "500"})),
    ("pool, empty resources", _pod(POOL, containers=[{"name": "c", "resources": {}}])),
    ("pool, cpu only", _pod(POOL, containers=_res(requests={"cpu": "1"}, limits={"memory": "1Gi"}))),
    ("pool, other vendor's GPU", _pod(POOL, containers=_res(limits={"amd.com/gpu": "1"}))),
    ("pool, whole GPU limit", _pod(POOL, containers=_res(limits={"nvidia.com/gpu": "1"}))),
    ("pool, whole GPU request", _pod(POOL, containers=_res(requests={"nvidia.com/gpu": "1"}))),
    ("pool, shared slot", _pod(POOL, containers=_res(requests={"kelvin.dev/shared-gpu": "1"}))),
    ("share, slot in the second container", _pod(SHARE, containers=[{"name": "a"}, *_res(limits=SLOT)])),
    ("pool, GPU in an init container", _pod(POOL, initContainers=_res(limits={"nvidia.com/gpu": "1"}))),
    ("pool, init container without GPU", _pod(POOL, initContainers=_res(limits={"cpu": "1"}))),
]


def _policy(docs: list[Doc]) -> Doc:
    return one(docs, "ValidatingAdmissionPolicy")


def _denies(policy: Doc, pod: dict[str, Any]) -> bool:
    """The API server's verdict: every matchCondition true and some validation false. An evaluation error (not a
    bool) fails the test: with failurePolicy Fail it would deny every matching pod."""
    run = cel(pod)
    if not all(run(c["expression"]) for c in policy["spec"].get("matchConditions", [])):
        return False
    return not all(run(v["expression"]) for v in policy["spec"]["validations"])


@pytest.mark.parametrize(("what", "pod"), SAMPLES, ids=[s[0] for s in SAMPLES])
def test_admission_policy_mirrors_the_operators_pool_only_rule(render: Render, what: str, pod: dict[str, Any]) -> None:
    policy = _policy(render(None, api_versions=WITH_VAP))
    assert _denies(policy, pod) is pool_only(pod), what


def test_the_known_verdicts() -> None:
    """The samples do cover both verdicts (guards the mirror test against a pool_only() that says the same always)."""
    verdicts = {what: pool_only(pod) for what, pod in SAMPLES}
    assert verdicts["pool, no resources"] and verdicts["pool, init container without GPU"]
    assert not verdicts["pool, GPU in an init container"] and not verdicts["checkpoint annotation only"]


def test_admission_policy_passes_what_the_mutating_webhook_fixed(render: Render) -> None:
    """Admission runs the mutating webhooks before validation: with the switch on the operator adds
    kelvin.dev/shared-gpu to a pool-only pod, which the policy then admits; the same pod unmutated (operator down) is
    denied with a message saying the webhook did not run."""
    policy = _policy(render(None, SHARED_ON, api_versions=WITH_VAP))
    pod = _pod(POOL, containers=[{"name": "main", "image": "x"}])
    assert _denies(policy, pod)
    containers = mutate(pod, snapshot=None, mps_label="kelvin.dev/mps", framework_env=True, shared_gpu_resource=True)
    assert containers is not None
    assert not _denies(policy, {**pod, "spec": {**pod["spec"], "containers": containers}})
    (v,) = policy["spec"]["validations"]
    assert "kelvin's mutating webhook adds kelvin.dev/shared-gpu: 1 to such pods but did not run" in v["message"]
    assert "is the kelvin operator up?" in v["message"]


def test_admission_policy_message_names_the_fix(render: Render) -> None:
    (v,) = _policy(render(None, api_versions=WITH_VAP))["spec"]["validations"]
    assert v["reason"] == "Invalid"
    assert v["message"].startswith("the pod sets kelvin.dev/gpu-memory or kelvin.dev/gpu-share but no container")
    assert "request nvidia.com/gpu: 1" in v["message"] and "devicePlugin.enabled=true" in v["message"]
    assert "\n" not in v["message"]  # the API server refuses a multi-line message
    # device plugin on but not serving shared slots: the operator adds nothing, so the advice is the switch-off one
    docs = render(None, SHARED_ON, "devicePlugin.resourceNames={nvidia.com/gpu}", api_versions=WITH_VAP)
    (off,) = _policy(docs)["spec"]["validations"]
    assert off["message"] == v["message"]


def test_notes_describe_the_prometheus_peer_by_both_selectors(helm_bin: str) -> None:
    """NOTES.txt: Prometheus is admitted from pods matching podSelector in namespaces matching namespaceSelector."""
    args = ["install", "kelvin", str(CHART), "-n", NAMESPACE, "--dry-run=client", "--set", "networkPolicy.enabled=true"]
    notes = " ".join(run_helm(helm_bin, *args).stdout.split())
    assert "pods matching networkPolicy.prometheus.podSelector in namespaces matching" in notes
    assert "networkPolicy.prometheus.namespaceSelector, both" in notes
