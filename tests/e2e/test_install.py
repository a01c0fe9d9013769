"""Install: kelvin's manifests as docs/install.md gives them, and the chart's renders (defaults; every option on),
applied server-side with strict field validation to the real API server, which must accept and keep every object."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.cluster import LoopbackCluster
from tests.e2e.install import ALL_OPTIONS_VALUES, Step, helm_template
from tests.e2e.kubebin import ROOT

CHART_CRDS = ROOT / "helm" / "kelvin" / "crds"


def _applied_files(steps: list[Step]) -> list[str]:
    return [
        a[i + 1] for a in (s.argv for s in steps) if a[:2] == ["kubectl", "apply"] for i, x in enumerate(a) if x == "-f"
    ]


def test_manifests_install_as_documented_on_a_fresh_cluster(
    cluster: LoopbackCluster, manifests_install: list[Step]
) -> None:
    """Issue 20, defect 6: one `kubectl apply --server-side -f manifests/kelvin.yaml` failed on a fresh cluster
    (`no matches for kind "ClusterKopfPeering" ... ensure CRDs are installed first`). The documented steps must
    install everything the first time."""
    for step in manifests_install:
        assert step.returncode == 0, f"{step.command} exited {step.returncode}:\n{step.output}"
    files = _applied_files(manifests_install)
    assert "manifests/kelvin.yaml" in files, files
    # every object of the applied files is on the server
    for f in files:
        cluster.kubectl("get", "-f", str(ROOT / f), "-o", "name")
    peering = cluster.api.get("/apis/kopf.dev/v1/clusterkopfpeerings/kelvin-operator")
    assert peering["metadata"]["name"] == "kelvin-operator"
    for name in ("kelvin-scheduler", "kelvin-operator"):
        cluster.api.get(f"/apis/apps/v1/namespaces/kelvin-system/deployments/{name}")
    # hack/webhook-cert.sh's work: the webhook Secret, and its CA in the webhooks' caBundle
    secret = cluster.api.get("/api/v1/namespaces/kelvin-system/secrets/kelvin-webhook-tls")
    assert {"tls.crt", "tls.key", "ca.crt"} <= set(secret["data"]), sorted(secret["data"])
    hooks = cluster.api.get("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/kelvin-webhook")
    assert all(w["clientConfig"].get("caBundle") for w in hooks["webhooks"]), hooks["webhooks"]


@pytest.mark.parametrize("render", ["defaults", "all-options"])
def test_chart_render_applies_server_side_strict(
    render: str, cluster: LoopbackCluster, kelvin_installed: None, helm_bin: str, tmp_path: Path
) -> None:
    namespace = f"e2e-chart-{render}"
    release = f"e2e-{render}"
    values = [ALL_OPTIONS_VALUES] if render == "all-options" else []
    # what `helm install` would discover on this cluster (helm template knows no cluster): the ValidatingAdmissionPolicy
    # API, and for the options the Prometheus Operator's
    api_versions = ["admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"]
    if render == "all-options":
        api_versions.append("monitoring.coreos.com/v1")
    manifest = helm_template(helm_bin, release, namespace, tmp_path / f"{render}.yaml", values, api_versions)
    cluster.kubectl("create", "namespace", namespace)
    # the CRDs first and established: kelvin's own (the chart's crds/), and for every option the upstream ones
    crd_dirs = [CHART_CRDS] + ([cluster.bins.bin_dir.parent / "crds"] if render == "all-options" else [])
    for d in crd_dirs:
        cluster.kubectl("apply", "--server-side", "--validate=strict", "-f", str(d))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(d))
    try:
        applied = cluster.kubectl(
            "apply", "--server-side", "--validate=strict", "--field-manager=kelvin-e2e", "-f", str(manifest),
            check=False,
        )  # fmt: skip
        assert applied.returncode == 0, applied.stderr
        shown = cluster.kubectl("get", "-f", str(manifest), "-o", "name").stdout.split()
        kinds = {name.split("/")[0] for name in shown}
        assert len(shown) == applied.stdout.count("serverside-applied"), applied.stdout
        assert {"deployment.apps", "daemonset.apps", "mutatingwebhookconfiguration.admissionregistration.k8s.io",
                "clusterkopfpeering.kopf.dev",
                "validatingadmissionpolicy.admissionregistration.k8s.io"} <= kinds, kinds  # fmt: skip
        if render == "all-options":
            assert {"servicemonitor.monitoring.coreos.com", "prometheusrule.monitoring.coreos.com",
                    "certificate.cert-manager.io", "issuer.cert-manager.io",
                    "networkpolicy.networking.k8s.io"} <= kinds, kinds  # fmt: skip
            assert any(n.startswith("daemonset.apps/") and "device-plugin" in n for n in shown), shown
    finally:
        # the release's webhooks and cluster-scoped objects go with it; the namespace's deletion is not waited for
        cluster.kubectl("delete", "-f", str(manifest), "--wait=false", "--ignore-not-found", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
