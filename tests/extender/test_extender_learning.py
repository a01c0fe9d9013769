"""The learned workload changes at one step only: the filter verb, once per pod (issue 15, "a real bug first").

Before, the fragmentation score learned each pod it scored: POST /explain changed production state, a pod with a
single feasible node (kube-scheduler skips prioritize then) was never learned, and without a prioritize verb nothing
was learned at all.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from ext_helpers import args, make_extender, pod
from fastapi.testclient import TestClient

from scheduler_plugin.extender.app import create_app
from scheduler_plugin.extender.service import Extender
from scheduler_plugin.policies.fragmentation import FragmentationBase, WorkloadEstimator
from scheduler_plugin.simulator.simulated_fleet import FleetSpec, SimulatedFleetSource


def binding(name: str, node: str, uid: str = "") -> bytes:
    body = {"PodName": name, "PodNamespace": "default", "PodUID": uid or f"uid-{name}", "Node": node}
    return json.dumps(body).encode()


def estimator(ext: Extender) -> WorkloadEstimator:
    frag = next(ws.plugin for ws in ext.framework.scorers if ws.name == "fragmentation")
    assert isinstance(frag, FragmentationBase)
    assert isinstance(ext.framework.picker, FragmentationBase) and ext.framework.picker.estimator is frag.estimator
    return frag.estimator


@pytest.fixture
def sim() -> Iterator[tuple[Extender, TestClient]]:
    """An extender over a simulated fleet of two empty 8-GPU nodes, binding into it."""
    src = SimulatedFleetSource(FleetSpec.uniform(2, 8, seed=0, initial_load=0.0))
    ext, _, _ = make_extender(source=src, clock=time.time)
    with TestClient(create_app(ext)) as c:
        yield ext, c


def test_explain_over_http_leaves_the_learned_workload_alone(sim: tuple[Extender, TestClient]) -> None:
    ext, c = sim
    est = estimator(ext)
    for i in range(3):
        r = c.post("/explain", json={"pod": pod(f"x{i}", gpus=1), "node": "gpu-node-1"})
        assert r.status_code == 200 and r.json()["fits"] is True and r.json()["scores"]
    assert est.observed == 0  # before: 3, one per explained pod


def test_a_pod_with_a_single_feasible_node_is_learned(sim: tuple[Extender, TestClient]) -> None:
    """kube-scheduler skips prioritize when one node passes filter: the pod goes straight to bind."""
    ext, c = sim
    est = estimator(ext)
    passed = c.post("/filter", content=args(pod("only", gpus=2), names=["gpu-node-1"])).json()
    assert passed["NodeNames"] == ["gpu-node-1"]
    assert c.post("/bind", content=binding("only", "gpu-node-1")).json() == {"Error": ""}
    assert est.observed == 1  # before: 0 (only prioritize learned)
    assert 2 in est.workload().count.tolist()


def test_an_extender_without_a_prioritize_verb_learns(sim: tuple[Extender, TestClient]) -> None:
    """A scheduler configured with filterVerb and bindVerb only (no prioritizeVerb) still feeds the workload."""
    ext, c = sim
    est = estimator(ext)
    for i in range(4):
        names = c.post("/filter", content=args(pod(f"p{i}", gpus=1))).json()["NodeNames"]
        assert len(names) == 2
        assert c.post("/bind", content=binding(f"p{i}", names[0])).json() == {"Error": ""}
    assert est.observed == 4  # before: 0


def test_a_retried_pod_is_learned_once(sim: tuple[Extender, TestClient]) -> None:
    """kube-scheduler filters an unschedulable pod again on every retry: the same UID counts once."""
    ext, c = sim
    est = estimator(ext)
    for _ in range(10):
        assert c.post("/filter", content=args(pod("huge", gpus=9))).json()["NodeNames"] == []
    assert est.observed == 1  # learned although it fits nowhere: it is part of the arriving mix
    c.post("/filter", content=args(pod("huge", gpus=9, uid="uid-huge-recreated")))
    assert est.observed == 2  # a new pod of the same name is another pod


def test_the_bind_failure_message_does_not_learn(sim: tuple[Extender, TestClient]) -> None:
    """The failure message of /bind is worded by Framework.explain; neither it nor the pick learns."""
    ext, c = sim
    est = estimator(ext)
    c.post("/filter", content=args(pod("eight", gpus=8), names=["gpu-node-1"]))
    c.post("/filter", content=args(pod("one", gpus=1), names=["gpu-node-1"]))
    assert est.observed == 2
    assert c.post("/bind", content=binding("one", "gpu-node-1")).json() == {"Error": ""}
    late = c.post("/bind", content=binding("eight", "gpu-node-1")).json()["Error"]
    assert "no longer fits node gpu-node-1" in late
    assert est.observed == 2
