"""Admission with the chart's stricter options: kelvin's device plugin on (so the mutating webhook gives a pool-only
pod a ``kelvin.dev/shared-gpu`` slot) and the webhooks' ``failurePolicy: Fail``.

The chart is rendered with those values (release ``e2e-admission-strict``); its webhook configurations and admission
policy are registered on the cluster pointed at a local ``kelvin operator`` on 127.0.0.1, as in test_admission.py,
and the operator runs with the rendered Deployment's settings. Assertions are on what the API server stores or
answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.api import ApiError, wait_for
from tests.e2e.cluster import LoopbackCluster, Process
from tests.e2e.test_admission import (
    NO_SCHEDULER,
    Admission,
    _env,
    _message,
    _refused,
    pool_pod,
    registered_admission,
    webhook_operator_process,
)

RELEASE = "e2e-admission-strict"
SHARED_GPU = "kelvin.dev/shared-gpu"
VALUES = {"devicePlugin": {"enabled": True}, "operator": {"webhook": {"failurePolicy": "Fail"}}}


def _gpu_pod(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": NO_SCHEDULER,
            "containers": [{"name": "main", "image": "busybox:e2e", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "terminationGracePeriodSeconds": 0,
        },
    }


@pytest.fixture(scope="module")
def strict(
    cluster: LoopbackCluster, kelvin_installed: None, helm_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Admission]:
    workdir = tmp_path_factory.mktemp("admission-strict")
    values = workdir / "values.yaml"
    values.write_text(yaml.safe_dump(VALUES))
    with registered_admission(cluster, helm_bin, workdir, RELEASE, [values]) as admission:
        yield admission

    # the configurations are deleted: wait until the API server stops calling them (failurePolicy Fail would refuse
    # the GPU pods of the scenarios that follow while its informer still holds them)
    def admitted() -> bool:
        try:
            cluster.api.call("POST", "/api/v1/namespaces/default/pods", params={"dryRun": "All"}, json=_gpu_pod("p"))
        except ApiError:
            return False
        return True

    wait_for("the strict webhook configurations gone from the API server", admitted, 30, 0.5)


@pytest.fixture(scope="class")
def strict_operator(
    cluster: LoopbackCluster, strict: Admission, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Process]:
    workdir: Path = tmp_path_factory.mktemp("strict-operator")
    with webhook_operator_process(cluster, strict, workdir, strict.operator_env) as operator:
        yield operator


def test_strict_render_is_what_the_api_server_keeps(strict: Admission) -> None:
    """The rendered operator serves the shared-GPU slot, and both webhooks are registered with failurePolicy Fail."""
    assert strict.operator_env["KELVIN_OPERATOR_WEBHOOK__SHARED_GPU_RESOURCE"] == "true", strict.operator_env
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        policies = [w["failurePolicy"] for w in strict.webhooks[kind]["webhooks"]]
        assert policies == ["Fail"], (kind, policies)


class TestSharedGpuSlot:
    """The operator runs with the rendered settings (one process for the class)."""

    def test_pool_only_pod_gets_one_shared_gpu_slot(
        self, cluster: LoopbackCluster, strict_operator: Process, namespace: str
    ) -> None:
        """A pod with ``kelvin.dev/gpu-memory: 20Gi`` and no GPU resource is stored with ``kelvin.dev/shared-gpu: 1``
        requested and limited in its main container (only there) and the pool's variables in every container: the
        device plugin's slot makes kube-scheduler call kelvin for it."""
        cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", pool_pod("pool-only", "20Gi", gpus=None))
        stored = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods/pool-only")
        main, side = stored["spec"]["containers"]
        assert main["resources"] == {"limits": {SHARED_GPU: "1"}, "requests": {SHARED_GPU: "1"}}, main["resources"]
        assert SHARED_GPU not in str(side.get("resources", {})), side
        for container in ("main", "side"):
            env = {e["name"]: e.get("value") for e in _env(stored, container)}
            assert env["KELVIN_GPU_MEMORY_LIMIT_BYTES"] == str(20 * 1024**3), (container, env)

    def test_pod_with_a_whole_gpu_gets_no_slot(
        self, cluster: LoopbackCluster, strict_operator: Process, namespace: str
    ) -> None:
        cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", pool_pod("pool-gpu", "20Gi", gpus=1))
        stored = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods/pool-gpu")
        resources = stored["spec"]["containers"][0]["resources"]
        # the API server defaults requests from limits for an extended resource
        assert resources == {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}, resources


def test_failure_policy_fail_refuses_gpu_pods_while_the_operator_is_down(
    cluster: LoopbackCluster, strict: Admission, namespace: str
) -> None:
    """No operator listens: a GPU pod is refused (the API server cannot call the webhook, failurePolicy Fail), while
    a pod that is none of kelvin's business is created (the webhooks' matchConditions never call them for it)."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    error = _refused(cluster, namespace, _gpu_pod("gpu"))
    message = _message(error)
    assert error.status == 500, error
    assert 'failed calling webhook "gpu-env.pods.kelvin.dev"' in message, message
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain"},
        "spec": {"schedulerName": NO_SCHEDULER, "containers": [{"name": "main", "image": "busybox:e2e"}]},
    }
    cluster.api.create(pods, plain)
    assert cluster.api.get(f"{pods}/plain")["metadata"]["name"] == "plain"
