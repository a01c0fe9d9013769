"""Where the webhook's certificate comes from: Helm (default: a Secret with the key, the CA in every caBundle),
cert-manager, or outside the chart (operator.webhook.tls.external, what manifests/kelvin.yaml is rendered with: no key
material at all, and the install notes say how to make it). NOTES also warn about the device plugin's privileges and
the shared kopf CRDs."""

from __future__ import annotations

import pytest
from deploy_helpers import CHART, NAMESPACE, Doc, Render, by_kind, one, pod_spec, run_helm

EXTERNAL = "operator.webhook.tls.external=true"


def _webhook_configs(docs: list[Doc]) -> list[Doc]:
    return [*by_kind(docs, "MutatingWebhookConfiguration"), *by_kind(docs, "ValidatingWebhookConfiguration")]


def _notes(helm_bin: str, *sets: str) -> str:
    args = ["install", "kelvin", str(CHART), "-n", NAMESPACE, "--dry-run=client"]
    for s in sets:
        args += ["--set", s]
    return " ".join(run_helm(helm_bin, *args).stdout.split("NOTES:", 1)[1].split())


@pytest.mark.helm
def test_by_default_helm_makes_the_secret_and_the_caBundle(render: Render) -> None:
    docs = render()
    secret = one(docs, "Secret", "webhook-tls")
    assert set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    configs = _webhook_configs(docs)
    assert len(configs) == 2
    assert all(w["clientConfig"]["caBundle"] == secret["data"]["ca.crt"] for d in configs for w in d["webhooks"])
    assert "checksum/tls" in one(docs, "Deployment", "operator")["spec"]["template"]["metadata"]["annotations"]


@pytest.mark.helm
def test_external_renders_no_key_material_and_mounts_the_same_secret(render: Render) -> None:
    default, docs = render(), render(None, EXTERNAL)
    assert not by_kind(docs, "Secret")
    assert all("caBundle" not in w["clientConfig"] for d in _webhook_configs(docs) for w in d["webhooks"])
    operator = one(docs, "Deployment", "operator")
    assert "checksum/tls" not in operator["spec"]["template"]["metadata"]["annotations"]
    volumes = {v["name"]: v for v in pod_spec(operator)["volumes"]}
    default_volumes = {v["name"]: v for v in pod_spec(one(default, "Deployment", "operator"))["volumes"]}
    assert volumes["tls"] == default_volumes["tls"]  # the Secret hack/webhook-cert.sh makes, under the chart's name
    assert "PRIVATE KEY" not in str(docs) and "LS0tLS1CRUdJTi" not in str(docs)


@pytest.mark.helm
def test_external_and_cert_manager_together_are_refused(helm_bin: str) -> None:
    proc = run_helm(
        helm_bin, "template", "kelvin", str(CHART), "--set", EXTERNAL,
        "--set", "operator.webhook.tls.certManager.enabled=true", check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "operator.webhook.tls.external and operator.webhook.tls.certManager.enabled are both set" in proc.stderr


@pytest.mark.helm
def test_notes_say_how_to_make_an_external_certificate(helm_bin: str) -> None:
    assert "webhook-cert.sh" not in _notes(helm_bin)
    notes = _notes(helm_bin, EXTERNAL)
    assert "hack/webhook-cert.sh --namespace kelvin-system --fullname kelvin" in notes
    assert "the operator pods wait for the Secret kelvin-webhook-tls" in notes


@pytest.mark.helm
def test_notes_warn_that_the_device_plugin_needs_a_privileged_namespace(helm_bin: str) -> None:
    assert "uid 0" not in _notes(helm_bin)
    notes = _notes(helm_bin, "devicePlugin.enabled=true")
    assert "runs as uid 0" in notes
    assert "kubectl label namespace kelvin-system pod-security.kubernetes.io/enforce=privileged --overwrite" in notes


@pytest.mark.helm
def test_notes_do_not_tell_users_to_delete_the_shared_kopf_crds(helm_bin: str) -> None:
    notes = _notes(helm_bin)
    assert "kubectl delete crd" not in notes
    assert "every kopf-based operator in the cluster shares them" in notes
