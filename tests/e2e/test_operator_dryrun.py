"""Dry run (the operator setting ``dryRun``, the chart's ``operator.dryRun``) on the real control plane: a hot node
gets only Events (``KelvinDryRunTaint``, ``KelvinDryRunEviction`` once per pod), and nothing else is written: no
taint, no eviction, no checkpoint request, not one change to the pods (their resourceVersions), none to the Node
but kopf's finalizer."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster
from tests.e2e.kubebin import ROOT
from tests.e2e.opharness import (
    GpuState,
    bind,
    events,
    fake_nodes,
    nodes_with_telemetry,
    pods_of,
    replica_set,
    start_operator,
)

NODE = "e2e-op-dry-1"
KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


tel = nodes_with_telemetry((NODE,), "dryrun")


def _bound(cluster: LoopbackCluster, ns: str, app: str, gpu: int, **annotations: str) -> dict[str, Any]:
    cluster.api.create(f"/apis/apps/v1/namespaces/{ns}/replicasets", replica_set(app, 1, annotations=annotations))
    (pod,) = wait_for(f"the pod of ReplicaSet {app}", lambda: pods_of(cluster, ns, app), 30)
    return bind(cluster, pod, NODE, gpu)


def test_dry_run_writes_nothing_but_events(
    cluster: LoopbackCluster, tel: GpuState, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    pods = {
        "plain": _bound(cluster, ns, "plain", 0),
        "ckpt": _bound(cluster, ns, "ckpt", 1, **{"kelvin.dev/checkpoint": "true"}),
    }
    node_before = cluster.api.get(f"/api/v1/nodes/{NODE}")
    settings = {"KELVIN_OPERATOR_DRY_RUN": "true", "KELVIN_OPERATOR_LIMITS__MAX_PER_NODE_PER_CYCLE": "2"}
    operator = start_operator(cluster, tel, tmp_path / "op", "op-dry", settings=settings)
    try:
        tel.temperature(NODE, 0, 92)
        tel.temperature(NODE, 1, 94)

        def would_taint() -> list[dict[str, Any]]:
            operator.check_alive()
            return events(cluster, name=NODE, reason="KelvinDryRunTaint")

        (taint,) = wait_for("KelvinDryRunTaint", would_taint, 60, 0.5)
        assert taint["message"].startswith(f"dry run: would taint {NODE}: gpu 0: 92.0 °C"), taint
        for app, pod in pods.items():

            def dry_evicted(name: str = pod["metadata"]["name"]) -> list[dict[str, Any]]:
                return events(cluster, namespace=ns, name=name, reason="KelvinDryRunEviction")

            wait_for(f"KelvinDryRunEviction on {app}", dry_evicted, 30, 0.5)
        time.sleep(8)  # four more cycles, each deciding the same again
        node_after = cluster.api.get(f"/api/v1/nodes/{NODE}")
        # the Node as it was, but for kopf's finalizer (its timers put one on every node they run on, dry run or
        # not: docs/operator.md); no taint, no label, no annotation
        before, after = node_before["metadata"], node_after["metadata"]
        assert after.get("finalizers") == [KOPF_FINALIZER], after.get("finalizers")
        assert (after.get("labels"), after.get("annotations")) == (before.get("labels"), before.get("annotations"))
        assert node_after["spec"] == node_before["spec"], node_after["spec"]
        assert not node_after["spec"].get("taints"), node_after["spec"]
        for app, pod in pods.items():
            now = cluster.api.get(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
            assert now["metadata"]["uid"] == pod["metadata"]["uid"] and not now["metadata"].get("deletionTimestamp")
            # not even the checkpoint request: a dry run never annotates
            assert now["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"], (app, now["metadata"])
            dry = events(cluster, namespace=ns, name=pod["metadata"]["name"], reason="KelvinDryRunEviction")
            assert len(dry) == 1, [e["message"] for e in dry]  # once per episode, not once per cycle
            assert dry[0]["message"].startswith("dry run: would evict (thermal): on hot GPU(s) "), dry
        everything = events(cluster, namespace=ns) + events(cluster, name=NODE)
        written = {e["reason"] for e in everything if e.get("reportingComponent") == "kelvin.dev/operator"}
        assert written == {"KelvinDryRunTaint", "KelvinDryRunEviction"}, written

        # cooled: the dry run says it would lift the taint it never wrote
        tel.temperature(NODE, 0, 40)
        tel.temperature(NODE, 1, 40)
        untaint = wait_for(
            "KelvinDryRunTaint (untaint)",
            lambda: [e for e in would_taint() if e["message"].startswith(f"dry run: would untaint {NODE}")],
            60,
            0.5,
        )
        assert len(untaint) == 1, untaint
        assert not cluster.api.get(f"/api/v1/nodes/{NODE}")["spec"].get("taints")
    finally:
        operator.stop()
        tel.reset()


def _documented_release() -> str:
    """docs/install.md's Uninstall loop that removes kopf's finalizer from the nodes."""
    text = (ROOT / "docs" / "install.md").read_text()
    section = text[text.index("**Release the GPU nodes from kopf's finalizer**") :]
    fence = section.index("```bash\n") + len("```bash\n")
    return section[fence : section.index("```", fence)]


def test_a_deleted_gpu_node_waits_for_an_operator(cluster: LoopbackCluster, tel: GpuState, tmp_path: Path) -> None:
    """kopf's node timers put its finalizer on every GPU node (kopf keeps it by design: a timer must be stopped
    before its object goes). So a GPU Node deleted while no operator runs stays Terminating; the next operator
    releases it at once, and docs/install.md's uninstall step releases it without one."""
    nodes = ("e2e-op-fin-1", "e2e-op-fin-2")
    with fake_nodes(cluster, nodes):
        settings = {"KELVIN_OPERATOR_DRY_RUN": "true"}
        operator = start_operator(cluster, tel, tmp_path / "op1", "op-fin", settings=settings)
        try:

            def finalized() -> bool:
                got = [cluster.api.get(f"/api/v1/nodes/{n}")["metadata"].get("finalizers") or [] for n in nodes]
                return all(KOPF_FINALIZER in f for f in got)

            wait_for("kopf's finalizer on the GPU nodes", finalized, 60, 0.5)
        finally:
            operator.stop()
        first, second = nodes

        def gone(n: str) -> bool:
            return cluster.api.get_or_none(f"/api/v1/nodes/{n}") is None

        def held(n: str) -> None:
            cluster.api.delete(f"/api/v1/nodes/{n}")
            time.sleep(5)
            node = cluster.api.get_or_none(f"/api/v1/nodes/{n}")
            assert node is not None and node["metadata"].get("deletionTimestamp"), node

        held(first)
        operator = start_operator(cluster, tel, tmp_path / "op2", "op-fin", settings=settings)
        try:
            wait_for("the next operator releasing the node", lambda: gone(first), 60, 0.5)
        finally:
            operator.stop()
        held(second)
        # the uninstall step of docs/install.md, as written, releases every node held by kopf's finalizer alone
        env = {
            **os.environ,
            "KUBECONFIG": str(cluster.admin_kubeconfig),
            "PATH": f"{cluster.bins.kubectl.parent}{os.pathsep}{os.environ['PATH']}",
        }
        done = subprocess.run(
            ["bash", "-c", _documented_release()], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done
        wait_for("the documented step releasing the node", lambda: gone(second), 30, 0.5)
