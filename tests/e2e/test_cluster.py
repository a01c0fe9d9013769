"""The fixture itself: the control plane answers, the fake GPU nodes behave like kubelets for what kelvin relies on
(Ready, leases, Running pods, graceful deletions finished, evictions through the Eviction API against a PDB), and a
ServiceAccount token kubeconfig carries only that account's rights."""

from __future__ import annotations

import functools
from typing import Any

from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster
from tests.e2e.fleet import GPUS_PER_NODE


def pod(name: str, node_selector: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "containers": [{"name": "main", "image": "busybox:e2e", "command": ["sleep", "infinity"]}],
            "nodeSelector": node_selector or {},
            "terminationGracePeriodSeconds": 30,
        },
    }


def running(cluster: LoopbackCluster, namespace: str, name: str) -> dict[str, Any] | None:
    p = cluster.api.get_or_none(f"/api/v1/namespaces/{namespace}/pods/{name}")
    if p is None or p["status"].get("phase") != "Running":
        return None
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    return p if ready else None


def test_server_version_is_the_pinned_release(cluster: LoopbackCluster) -> None:
    assert cluster.api.get("/version")["gitVersion"] == cluster.bins.version


def test_fake_gpu_nodes_are_ready_with_gpus_and_leases(cluster: LoopbackCluster, gpu_nodes: tuple[str, ...]) -> None:
    for name in gpu_nodes:
        node = cluster.api.get(f"/api/v1/nodes/{name}")
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(GPUS_PER_NODE)
        assert not node["spec"].get("taints"), node["spec"]["taints"]
        lease = cluster.api.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}")
        assert lease["spec"]["holderIdentity"] == name


def test_default_scheduler_binds_and_pod_runs_then_deletion_finishes(
    cluster: LoopbackCluster, gpu_nodes: tuple[str, ...], namespace: str
) -> None:
    cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", pod("plain"))
    bound = wait_for("pod plain Running", lambda: running(cluster, namespace, "plain"), 60)
    assert bound["spec"]["nodeName"] in gpu_nodes
    # graceful deletion (30 s grace) is finished by the fake kubelet at once, as a kubelet does when containers exit
    cluster.api.delete(f"/api/v1/namespaces/{namespace}/pods/plain")
    wait_for(
        "pod plain gone", lambda: cluster.api.get_or_none(f"/api/v1/namespaces/{namespace}/pods/plain") is None, 20
    )


def test_eviction_api_honours_a_pod_disruption_budget(
    cluster: LoopbackCluster, gpu_nodes: tuple[str, ...], namespace: str
) -> None:
    for name in ("guarded-1", "guarded-2"):
        cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", pod(name, labels={"app": "guarded"}))
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    cluster.api.create(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", pdb)
    for name in ("guarded-1", "guarded-2"):
        wait_for(f"{name} Running", functools.partial(running, cluster, namespace, name), 60)

    def allowed() -> bool:
        status = cluster.api.get(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/guarded")["status"]
        return bool(status.get("disruptionsAllowed") == 1 and status.get("currentHealthy") == 2)

    wait_for("PDB guarded: one disruption allowed", allowed, 60)

    def evict(name: str) -> int:
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        return cluster.api.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", json=body
        ).status_code

    assert evict("guarded-1") == 201
    wait_for(
        "evicted pod gone",
        lambda: cluster.api.get_or_none(f"/api/v1/namespaces/{namespace}/pods/guarded-1") is None,
        20,
    )
    # the budget now allows no disruption: the API server refuses the second eviction
    wait_for(
        "PDB guarded: no disruption allowed",
        lambda: (
            cluster.api.get(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/guarded")["status"].get(
                "disruptionsAllowed"
            )
            == 0
        ),
        30,
    )
    assert evict("guarded-2") == 429
    assert running(cluster, namespace, "guarded-2") is not None


def test_token_kubeconfig_has_only_the_service_accounts_rights(cluster: LoopbackCluster, namespace: str) -> None:
    cluster.api.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
    )
    kubeconfig = cluster.token_kubeconfig(namespace, "reader")
    denied = cluster.kubectl("get", "pods", "-n", namespace, kubeconfig=kubeconfig, check=False)
    assert denied.returncode != 0
    assert f"system:serviceaccount:{namespace}:reader" in denied.stderr and "forbidden" in denied.stderr
    cluster.kubectl("create", "rolebinding", "reader", "--clusterrole=view", f"--serviceaccount={namespace}:reader",
                    "-n", namespace)  # fmt: skip
    wait_for(
        "the view role takes effect",
        lambda: cluster.kubectl("get", "pods", "-n", namespace, kubeconfig=kubeconfig, check=False).returncode == 0,
        20,
    )
    assert cluster.kubectl("get", "nodes", kubeconfig=kubeconfig, check=False).returncode != 0
