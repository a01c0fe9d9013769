"""Starting :mod:`tests.e2e.fakenodes` (the API side of a kubelet for many fake GPU nodes) beside a loopback cluster,
for fleets beyond the session's four nodes: the burst scenario (tests/e2e/test_burst.py) and the throughput
benchmark (bench/e2e_throughput.py)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence

from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster, Process, spawn
from tests.e2e.kubebin import ROOT

FAKE_NODE_LABEL = "kelvin.dev/e2e-fake-node"


def ready_nodes(cluster: LoopbackCluster, names: Sequence[str]) -> int:
    """How many of ``names`` are Ready and untainted by the node lifecycle controller (one list, not one GET each)."""
    wanted = set(names)
    count = 0
    for node in cluster.api.get("/api/v1/nodes", labelSelector=f"{FAKE_NODE_LABEL}=true")["items"]:
        if node["metadata"]["name"] not in wanted:
            continue
        conditions = node.get("status", {}).get("conditions", [])
        lifecycle = [t for t in node["spec"].get("taints", []) if t["key"].startswith("node.kubernetes.io/")]
        count += any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) and not lifecycle
    return count


@contextlib.contextmanager
def fake_nodes(
    cluster: LoopbackCluster, names: Sequence[str], *, gpus: int = 8, name: str = "fakenodes"
) -> Iterator[Process]:
    """The agent for ``names`` (its log ``<name>.log``), once every node is Ready; stopped by PID on exit."""
    p = cluster.pki
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    argv = [sys.executable, "-m", "tests.e2e.fakenodes", f"--server={cluster.server}", f"--ca={p.ca.cert}",
            f"--cert={p.admin.cert}", f"--key={p.admin.key}", f"--nodes={','.join(names)}", f"--gpus={gpus}",
            f"--kubelet-version={cluster.bins.version}"]  # fmt: skip
    agent = spawn(name, argv, cluster.logs, env=env)
    try:

        def all_ready() -> bool:
            if not agent.alive():
                raise RuntimeError(f"{name} exited ({agent.popen.returncode}):\n{agent.tail()}")
            return ready_nodes(cluster, names) == len(names)

        # registering 1,000 nodes takes minutes on a loaded 2-core box (3 requests a node, 8 in flight)
        wait_for(f"{len(names)} fake GPU nodes Ready", all_ready, 60 + len(names) / 2, 1.0)
        yield agent
    finally:
        agent.stop()
