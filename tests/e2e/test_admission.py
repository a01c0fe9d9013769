"""Admission: kelvin's webhooks called by the real API server over TLS, and the chart's ValidatingAdmissionPolicy
evaluated by the API server itself.

The operator's webhook server runs as a local ``kelvin operator`` process on the operator ServiceAccount's token,
listening on 127.0.0.1 with a serving certificate of a CA made here (tests/e2e/pki.py). The webhook configurations
are the chart's own (``helm template``), each ``clientConfig`` pointed at that process (``url:`` and the CA bundle:
a Service's ClusterIP is not reachable here); the ValidatingAdmissionPolicy and its binding are the chart's as
rendered where the cluster serves that API. Every assertion is on what the API server answers or stores.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import ssl
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.api import ApiError, wait_for
from tests.e2e.cluster import LoopbackCluster, Process, free_port, spawn
from tests.e2e.fleet import fleet_file
from tests.e2e.install import helm_template
from tests.e2e.pki import CertificateAuthority, CertPair
from tests.e2e.test_operator_events import installed_operator_env

NAMESPACE = "kelvin-system"
RELEASE = "e2e-admission"
VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
WEBHOOK_KINDS = {
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
}
POLICY_KINDS = {
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
}
GIB = 1024**3
#: No scheduler by this name: the scenario's pods stay Pending, so kelvin's simulated fleet records no placement.
NO_SCHEDULER = "e2e-admission-none"


@dataclass
class Admission:
    """The chart's admission objects registered on the cluster, the webhooks pointed at 127.0.0.1:``port``."""

    port: int
    ca: Path
    serving: CertPair
    webhooks: dict[str, dict[str, Any]]  # kind -> object as registered
    policy_name: str
    operator_env: dict[str, str]
    """The rendered operator Deployment's literal environment variables."""


def _kelvin() -> str:
    found = shutil.which("kelvin", path=str(Path(sys.executable).parent)) or shutil.which("kelvin")
    if found is None:
        raise RuntimeError("the kelvin command is not installed (pip install -e .)")
    return found


def _trusting(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def _chart_objects(helm_bin: str, out: Path, release: str, values: Sequence[Path] = ()) -> list[dict[str, Any]]:
    manifest = helm_template(helm_bin, release, NAMESPACE, out, values=values, api_versions=[VAP_API])
    return [d for d in yaml.safe_load_all(manifest.read_text()) if d]


def _served(cluster: LoopbackCluster, resource: str) -> bool:
    return any(r["name"] == resource for r in cluster.api.get(ADMISSION)["resources"])


@contextlib.contextmanager
def registered_admission(
    cluster: LoopbackCluster, helm_bin: str, workdir: Path, release: str, values: Sequence[Path] = ()
) -> Iterator[Admission]:
    """The chart's webhook configurations (``release``, ``values``) and admission policy registered on the cluster,
    the webhooks pointed at a fresh 127.0.0.1 port with a CA made here; removed again at the end."""
    ca = CertificateAuthority(workdir, "kelvin-e2e-webhook-ca")
    serving = ca.issue("webhook", "127.0.0.1", hosts=("127.0.0.1",), server=True)
    port = free_port()
    ca_bundle = base64.b64encode(ca.pair.cert.read_bytes()).decode()
    # kube-apiserver 1.36 serves ValidatingAdmissionPolicy (GA in 1.30): `helm install` would render it here
    assert _served(cluster, "validatingadmissionpolicies"), f"{cluster.bins.version} serves no {VAP_API}"
    objects = _chart_objects(helm_bin, workdir / "chart.yaml", release, values)
    registered: list[str] = []
    webhooks: dict[str, dict[str, Any]] = {}
    try:
        for obj in objects:
            kind = obj["kind"]
            if kind in WEBHOOK_KINDS:
                for hook in obj["webhooks"]:
                    path = hook["clientConfig"]["service"]["path"]
                    hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
                collection = f"{ADMISSION}/{WEBHOOK_KINDS[kind]}"
            elif kind in POLICY_KINDS:
                collection = f"{ADMISSION}/{POLICY_KINDS[kind]}"
            else:
                continue
            cluster.api.create(collection, obj)
            registered.append(f"{collection}/{obj['metadata']['name']}")
            if kind in WEBHOOK_KINDS:
                webhooks[kind] = cluster.api.get(registered[-1])
        assert set(webhooks) == set(WEBHOOK_KINDS), f"the chart renders {sorted(webhooks)}"
        (policy,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
        (deployment,) = [
            o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-operator")
        ]
        (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
        env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        yield Admission(port, ca.pair.cert, serving, webhooks, policy["metadata"]["name"], env)
    finally:
        for path in reversed(registered):
            cluster.api.delete(path)


@pytest.fixture(scope="module")
def admission(
    cluster: LoopbackCluster, kelvin_installed: None, helm_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Admission]:
    with registered_admission(cluster, helm_bin, tmp_path_factory.mktemp("admission"), RELEASE) as registered:
        yield registered


@contextlib.contextmanager
def webhook_operator_process(
    cluster: LoopbackCluster, admission: Admission, workdir: Path, settings: dict[str, str]
) -> Iterator[Process]:
    """``kelvin operator`` with ``settings`` (a Deployment's KELVIN_OPERATOR_* values), except: its webhook on
    127.0.0.1 with the certificate made here, telemetry from the fake fleet (simulated), standalone, dry run, one cycle
    an hour (these scenarios are about admission; nothing they start may taint the shared fake nodes)."""
    policy = workdir / "policy.yaml"
    cm = cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/kelvin-policy")
    policy.write_text(cm["data"]["policy.yaml"])
    fleet = workdir / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(fleet_file()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KELVIN_") and k != "KUBECONFIG"}
    env.update({k: v for k, v in settings.items() if k.startswith("KELVIN_OPERATOR_")})
    env.update(
        {
            "KELVIN_POLICY_FILE": str(policy),
            "KELVIN_SOURCE": "simulated",
            "KELVIN_FLEET_FILE": str(fleet),
            "KELVIN_REFRESH_INTERVAL_S": "1",
            "KELVIN_KUBECONFIG": str(cluster.token_kubeconfig(NAMESPACE, "kelvin-operator")),
            "KELVIN_OPERATOR_WEBHOOK__ADDR": "127.0.0.1",
            "KELVIN_OPERATOR_WEBHOOK__PORT": str(admission.port),
            "KELVIN_OPERATOR_WEBHOOK__HOST": "127.0.0.1",
            "KELVIN_OPERATOR_WEBHOOK__CERTFILE": str(admission.serving.cert),
            "KELVIN_OPERATOR_WEBHOOK__PKEYFILE": str(admission.serving.key),
            "KELVIN_OPERATOR_METRICS_ADDR": "127.0.0.1",
            "KELVIN_OPERATOR_METRICS_PORT": str(free_port()),
            "KELVIN_OPERATOR_STANDALONE": "true",
            "KELVIN_OPERATOR_DRY_RUN": "true",
        }
    )
    argv = [_kelvin(), "operator", f"--liveness=http://127.0.0.1:{free_port()}/healthz", "--interval=3600"]
    operator = spawn(f"kelvin-operator-webhook-{admission.port}", argv, cluster.logs, env=env)
    try:
        # the webhook server answers over TLS with the certificate the configurations trust (400: not a review)
        with httpx.Client(verify=_trusting(admission.ca), timeout=5) as client:

            def serving() -> bool:
                if not operator.alive():
                    raise RuntimeError(f"kelvin operator exited ({operator.popen.returncode}):\n{operator.tail()}")
                try:
                    return (
                        client.post(f"https://127.0.0.1:{admission.port}/gpu-memory", content=b"{}").status_code == 400
                    )
                except httpx.TransportError:
                    return False

            wait_for("kelvin operator's webhook server on 127.0.0.1", serving, 60, 0.5)

        # the API server's webhook configurations are in effect (its informer): a dry-run create is mutated
        def mutated() -> bool:
            probe = pool_pod("probe", "20Gi")
            body = cluster.api.call("POST", "/api/v1/namespaces/default/pods", params={"dryRun": "All"}, json=probe)
            return any(e["name"] == "KELVIN_GPU_MEMORY_LIMIT_BYTES" for e in _env(body, "main"))

        wait_for("the API server calling kelvin's mutating webhook", mutated, 30, 0.5)
        yield operator
    finally:
        # ~6 s on SIGTERM here (kopf's cleanup, then the webhook server's shutdown): no SIGKILL at 5 s
        operator.stop(timeout=20)


@pytest.fixture(scope="class")
def webhook_operator(
    cluster: LoopbackCluster, admission: Admission, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Process]:
    """The operator with the installed Deployment's settings (the defaults: no shared-GPU slot)."""
    installed = installed_operator_env(cluster)
    assert installed.get("KELVIN_OPERATOR_WEBHOOK__SHARED_GPU_RESOURCE") == "false", installed
    with webhook_operator_process(cluster, admission, tmp_path_factory.mktemp("webhook-operator"), installed) as op:
        yield op


def pool_pod(name: str, gpu_memory: str, *, gpus: int | None = 1) -> dict[str, Any]:
    """A pod with a memory pool on an MPS node pool; ``gpus=None``: pool-only (no GPU resource)."""
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus is not None else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"kelvin.dev/gpu-memory": gpu_memory}},
        "spec": {
            "schedulerName": NO_SCHEDULER,
            "nodeSelector": {"kelvin.dev/mps": "true"},
            "containers": [
                {"name": "main", "image": "busybox:e2e", "command": ["sleep", "infinity"], "resources": resources},
                # a sidecar that sets one of the variables itself: it keeps its value
                {"name": "side", "image": "busybox:e2e", "command": ["sleep", "infinity"],
                 "env": [{"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "false"}]},
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }  # fmt: skip


def _env(pod: dict[str, Any], container: str) -> list[dict[str, Any]]:
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == container]
    return list(c.get("env") or [])


def _refused(cluster: LoopbackCluster, namespace: str, pod: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as refused:
        cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    name = pod["metadata"]["name"]
    assert cluster.api.get_or_none(f"/api/v1/namespaces/{namespace}/pods/{name}") is None, f"{name} was stored"
    return refused.value


def _message(error: ApiError) -> str:
    return str(httpx.Response(error.status, content=error.body.encode()).json()["message"])


def test_webhook_configurations_are_the_charts(admission: Admission) -> None:
    """What the API server keeps: the chart's webhooks (names, rules, scope, matchConditions, failurePolicy Ignore),
    only the clientConfig pointed at 127.0.0.1."""
    mutating = admission.webhooks["MutatingWebhookConfiguration"]["webhooks"]
    validating = admission.webhooks["ValidatingWebhookConfiguration"]["webhooks"]
    assert [w["name"] for w in mutating] == ["gpu-env.pods.kelvin.dev"]
    assert [w["name"] for w in validating] == ["gpu-memory.pods.kelvin.dev"]
    for hook in (*mutating, *validating):
        assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None", hook
        assert hook["rules"][0]["operations"] == ["CREATE"] and hook["rules"][0]["resources"] == ["pods"]
        assert hook["matchConditions"], hook
        excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"]
        assert {"kube-system", NAMESPACE} <= set(excluded), excluded
        assert hook["clientConfig"]["url"].startswith(f"https://127.0.0.1:{admission.port}/"), hook["clientConfig"]


class TestWebhooksCalledByTheApiServer:
    """The operator runs (one process for the class, stopped after it)."""

    def test_pool_pod_is_mutated_by_the_webhook(
        self, cluster: LoopbackCluster, webhook_operator: Process, namespace: str
    ) -> None:
        """A pod with ``kelvin.dev/gpu-memory: 20Gi`` and one GPU, on an MPS pool, comes back from the API server with
        the variables docs/operator.md promises in every container; a variable the pod sets itself is kept."""
        created = cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", pool_pod("pool", "20Gi"))
        stored = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods/pool")
        assert stored["metadata"]["uid"] == created["metadata"]["uid"]
        pool = str(20 * GIB)
        main = {e["name"]: e.get("value") for e in _env(stored, "main")}
        assert main == {
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
            "KELVIN_GPU_MEMORY_LIMIT_BYTES": pool,
            "TF_FORCE_GPU_ALLOW_GROWTH": "true",
            "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            # one GPU size in the fleet (H100-SXM-80GB): 20 of 80 GiB
            "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.250",
        }, main
        side = _env(stored, "side")
        assert side[0] == {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "false"}, side
        assert [e["name"] for e in side].count("TF_FORCE_GPU_ALLOW_GROWTH") == 1, side
        assert {e["name"]: e["value"] for e in side}["KELVIN_GPU_MEMORY_LIMIT_BYTES"] == pool, side
        # the GPU request is the pod's own: no shared-GPU slot without kelvin's device plugin
        limits = stored["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {"nvidia.com/gpu": "1"}, limits

    @pytest.mark.parametrize(
        ("gpu_memory", "says"),
        [
            ("lots", "invalid GPU request: kelvin.dev/gpu-memory='lots': not a memory quantity"),
            (
                "100Gi",
                "kelvin.dev/gpu-memory=100.0 GiB is larger than the largest GPU in the cluster (H100-SXM-80GB, 80.0",
            ),
        ],
        ids=["malformed", "larger-than-any-gpu"],
    )
    def test_bad_pool_refused_at_create(
        self, cluster: LoopbackCluster, webhook_operator: Process, namespace: str, gpu_memory: str, says: str
    ) -> None:
        """Refused at create, the webhook's message in the API error (HTTP 400: the review's status code)."""
        error = _refused(cluster, namespace, pool_pod("bad", gpu_memory))
        message = _message(error)
        assert error.status == 400, error
        assert message.startswith('admission webhook "gpu-memory.pods.kelvin.dev" denied the request: '), message
        assert says in message, message


def test_admission_policy_refuses_pool_only_pod_with_the_operator_down(
    cluster: LoopbackCluster, admission: Admission, namespace: str
) -> None:
    """No operator listens (its webhooks are failurePolicy Ignore): the API server itself refuses a pool-only pod with
    the chart's ValidatingAdmissionPolicy, while a pod the webhook alone would refuse is admitted unchecked."""
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"https://127.0.0.1:{admission.port}/", verify=_trusting(admission.ca), timeout=2)
    pods = f"/api/v1/namespaces/{namespace}/pods"

    def denied() -> str | None:  # the policy is in effect once the API server has compiled it (dry run: no pod)
        try:
            cluster.api.call("POST", pods, params={"dryRun": "All"}, json=pool_pod("probe", "20Gi", gpus=None))
        except ApiError as exc:
            return exc.body if admission.policy_name in exc.body else None
        return None

    wait_for(f"ValidatingAdmissionPolicy {admission.policy_name} in effect", denied, 30, 0.5)
    error = _refused(cluster, namespace, pool_pod("pool-only", "20Gi", gpus=None))
    message = _message(error)
    assert error.status == 422, error
    assert f"ValidatingAdmissionPolicy '{admission.policy_name}'" in message, message
    assert "no container requests a GPU resource (nvidia.com/gpu or kelvin.dev/shared-gpu)" in message, message
    # failurePolicy Ignore: unreachable webhooks admit the pod, unmutated and unchecked
    cluster.api.create(pods, pool_pod("unchecked", "lots"))
    stored = cluster.api.get(f"{pods}/unchecked")
    assert _env(stored, "main") == [], stored["spec"]["containers"][0]
