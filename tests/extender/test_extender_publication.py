"""Across pods of an unchanged mix, the extender's fragmentation score computes only the nodes written since the
last pod of the shape: the learned workload it scores against is published in steps (the same object), so the
per-node score memo keeps every other node's score. Before, the learned workload was a new object after every pod
and every prioritize computed every candidate."""

from __future__ import annotations

import json
import time

import pytest
from ext_helpers import args, make_extender, pod
from fastapi.testclient import TestClient

from scheduler_plugin.extender.app import create_app
from scheduler_plugin.simulator.simulated_fleet import FleetSpec, SimulatedFleetSource
from tests.memo_helpers import count_score_computations

NODES = 30


def test_prioritize_computes_only_the_written_nodes_across_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    src = SimulatedFleetSource(FleetSpec.uniform(NODES, 8, seed=0, initial_load=0.0))
    ext, _, _ = make_extender(source=src, clock=time.time)
    computed = count_score_computations(monkeypatch)
    names = [f"gpu-node-{i}" for i in range(1, NODES + 1)]
    per_pod: list[int] = []
    with TestClient(create_app(ext)) as c:
        for i in range(90):  # one shape throughout: the first 60 learn it (the default mix forgotten)
            p = pod(f"p{i}", gpus=1)
            passed = c.post("/filter", content=args(p, names)).json()["NodeNames"]
            computed.clear()
            hosts = c.post("/prioritize", content=args(p, passed)).json()
            per_pod.append(sum(computed))
            best = max(hosts, key=lambda h: h["Score"])["Host"]
            body = {"PodName": f"p{i}", "PodNamespace": "default", "PodUID": f"uid-p{i}", "Node": best}
            assert c.post("/bind", content=json.dumps(body).encode()).json() == {"Error": ""}
    late = per_pod[60:]
    # the node the last pod was bound to alone, except when the workload was republished (the L1 moved)
    assert sum(n <= 1 for n in late) >= 20, late
    assert sum(late) < NODES * len(late) / 3, late
