"""The operator's Events about Nodes reach the API server, posted with the installed operator's settings and its own
ServiceAccount token (issue 20, defect 7: with the chart's KELVIN_OPERATOR_EVENTS_NAMESPACE=kelvin-system every one
was refused, 422 ``involvedObject.namespace: Invalid value: "": does not match event.namespace``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from kelvin_operator.k8s import ObjectRef
from kelvin_operator.runtime import operator_kube
from kelvin_operator.settings import ENV_PREFIX, OperatorConfig

from scheduler_plugin.kubeapi import KubeClient, KubeConfig
from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster

NAMESPACE = "kelvin-system"


def installed_operator_env(cluster: LoopbackCluster) -> dict[str, str]:
    """The KELVIN_OPERATOR_* settings of the installed operator Deployment (literal values only)."""
    deployment = cluster.api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/kelvin-operator")
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
    return {
        e["name"]: e["value"] for e in container.get("env", []) if e["name"].startswith(ENV_PREFIX) and "value" in e
    }


@pytest.fixture
def operator_env(cluster: LoopbackCluster, kelvin_installed: None) -> Iterator[dict[str, str]]:
    env = installed_operator_env(cluster)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    with mock.patch.dict(os.environ, {**clean, **env}, clear=True):
        yield env


def node_events(cluster: LoopbackCluster, node: str, reason: str, message: str) -> list[dict[str, Any]]:
    """The Events ``reason`` about ``node`` that say ``message`` (other modules' operators post real ones about the
    shared fleet's nodes, e.g. the gang module's heated node)."""
    listing = cluster.api.get("/api/v1/events", fieldSelector=f"involvedObject.name={node},reason={reason}")
    return [e for e in listing["items"] if e.get("message") == message]


@pytest.mark.parametrize("reason", ["KelvinNodeHot", "KelvinNodeCooled", "KelvinDryRunTaint"])
def test_events_about_nodes_are_recorded(
    cluster: LoopbackCluster, gpu_nodes: tuple[str, ...], operator_env: dict[str, str], reason: str
) -> None:
    cfg = OperatorConfig()
    kubeconfig = cluster.token_kubeconfig(NAMESPACE, "kelvin-operator")
    node_name = gpu_nodes[0]
    node = cluster.api.get(f"/api/v1/nodes/{node_name}")
    ref = ObjectRef(kind="Node", name=node_name, uid=node["metadata"]["uid"])

    async def post() -> None:
        client = KubeClient(KubeConfig.from_kubeconfig(kubeconfig))
        try:
            await operator_kube(cfg, client).event(ref, reason, f"e2e: {reason}", warning=reason == "KelvinNodeHot")
        finally:
            await client.close()

    asyncio.run(post())
    (event,) = wait_for(
        f"Event {reason} about Node {node_name}", lambda: node_events(cluster, node_name, reason, f"e2e: {reason}"), 10
    )
    assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"]["uid"] == ref.uid
    # where kubelet and kube-controller-manager put Events about Nodes, the only namespace the API server accepts
    assert event["metadata"]["namespace"] == "default"
    assert event["message"] == f"e2e: {reason}"
