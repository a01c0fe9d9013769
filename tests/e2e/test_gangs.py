"""Gangs on the real control plane (docs/jobs.md, "In a cluster"): the chart's webhooks with ``webhook.gangGates``
on gate every member, ``kelvin operator`` plans the whole gang (annotations, gate lifted), kube-scheduler with
kelvin's extender binds each member to its planned node and GPUs. What the API server shows of the pods afterwards.

Two scenarios heat a node of the shared fleet through its fake exporter (the suite's telemetry, reset after each):
a planned node turning hot before the members bind (the gang is re-planned in the other rack), and a running gang
whose member's node turns hot (every member checkpointed, then the whole gang evicted through the Eviction API).

The shared fake fleet (tests/e2e/fleet.py) is labelled into two racks of two 8-GPU nodes for the module
(:data:`RACKS`, the policy's ``gang.levels``), and unlabelled again at the end. The preemption scenario's tainted
node carries no rack label: at the rack level it is its own domain of 8 GPUs, too small for every gang here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler_plugin.model.times import format_time
from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster, Process
from tests.e2e.kelvin_scheduler import KelvinScheduler
from tests.e2e.opharness import GpuState, start_operator
from tests.e2e.pods import assigned, gpu_pod
from tests.e2e.telemetry import Telemetry
from tests.e2e.test_admission import registered_admission

NAMESPACE = "kelvin-system"
RACK_LABEL = "kelvin.dev/rack"
#: rack -> its nodes (the shared fleet: three NVSwitch nodes and the PCIe-only one, 8 GPUs each)
RACKS = {"rack-a": ("e2e-nvs-1", "e2e-nvs-2"), "rack-b": ("e2e-nvs-3", "e2e-pcie-1")}
RACK_OF = {node: rack for rack, nodes in RACKS.items() for node in nodes}
GATE = "kelvin.dev/gang"
PLANNED_NODE = "kelvin.dev/gang-planned-node"
PLANNED_GPUS = "kelvin.dev/gang-planned-gpus"
LWS = "leaderworkerset.sigs.k8s.io/"


@contextlib.contextmanager
def racks_labelled(cluster: LoopbackCluster) -> Iterator[None]:
    for node, rack in RACK_OF.items():
        cluster.api.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {RACK_LABEL: rack}}})
    try:
        yield
    finally:
        for node in RACK_OF:
            cluster.api.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {RACK_LABEL: None}}})


def _policy(cluster: LoopbackCluster, path: Path) -> Path:
    """The installed policy with the racks as the gang level (the policy file's ``gang:``)."""
    cm = cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/kelvin-policy")
    policy = yaml.safe_load(cm["data"]["policy.yaml"]) or {}
    policy["gang"] = {**(policy.get("gang") or {}), "levels": [{"name": "rack", "label": RACK_LABEL}]}
    path.write_text(yaml.safe_dump(policy))
    return path


@contextlib.contextmanager
def extender_policy(ks: KelvinScheduler, policy: Path) -> Iterator[None]:
    """The extender restarted on ``policy`` (one policy ConfigMap serves the extender and the operator in the chart,
    so both know the gang levels), and on its own policy again at the end."""
    before = ks.extender_env["KELVIN_POLICY_FILE"]
    ks.extender_env["KELVIN_POLICY_FILE"] = str(policy)
    ks.restart_extender()
    try:
        yield
    finally:
        ks.extender_env["KELVIN_POLICY_FILE"] = before
        ks.restart_extender()


@pytest.fixture(scope="module")
def gang_operator(
    cluster: LoopbackCluster,
    kelvin_scheduler: KelvinScheduler,
    telemetry: Telemetry,
    helm_bin: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Process]:
    """The chart's webhooks registered (release ``e2e-gangs``), and one ``kelvin operator`` serving them with
    ``webhook.gangGates`` on (this module's install only), not in dry run, reading the suite's telemetry (the same
    Prometheus as the extender); the operator's and the extender's policy with the racks as the gang level."""
    workdir = tmp_path_factory.mktemp("gangs")
    (workdir / "admission").mkdir()
    policy = _policy(cluster, workdir / "gang-policy.yaml")
    with (
        racks_labelled(cluster),
        extender_policy(kelvin_scheduler, policy),
        registered_admission(cluster, helm_bin, workdir / "admission", "e2e-gangs") as adm,
    ):
        settings = {
            "KELVIN_POLICY_FILE": str(policy),
            "KELVIN_OPERATOR_DRY_RUN": "false",
            "KELVIN_OPERATOR_WEBHOOK__ENABLED": "true",
            "KELVIN_OPERATOR_WEBHOOK__GANG_GATES": "true",
            "KELVIN_OPERATOR_WEBHOOK__ADDR": "127.0.0.1",
            "KELVIN_OPERATOR_WEBHOOK__PORT": str(adm.port),
            "KELVIN_OPERATOR_WEBHOOK__HOST": "127.0.0.1",
            "KELVIN_OPERATOR_WEBHOOK__CERTFILE": str(adm.serving.cert),
            "KELVIN_OPERATOR_WEBHOOK__PKEYFILE": str(adm.serving.key),
            # the straggler scenario evicts its bare pods (nothing recreates them; the test checks the eviction)
            "KELVIN_OPERATOR_PROTECTION__ALLOW_BARE_PODS": "true",
        }
        replica = start_operator(cluster, GpuState(telemetry), workdir / "operator", "gangs", settings=settings)
        try:
            # the API server calls the webhook, and it gates a gang member (a dry-run create: no pod is made)
            probe = member("probe", "probe", 1, 0, 1)

            def gated() -> bool:
                replica.check_alive()
                body = cluster.api.call("POST", "/api/v1/namespaces/default/pods", params={"dryRun": "All"}, json=probe)
                return any(g.get("name") == GATE for g in body["spec"].get("schedulingGates") or [])

            wait_for("the mutating webhook gating gang members", gated, 60, 0.5)
            yield replica.process
        finally:
            replica.stop()


def member(
    name: str,
    gang: str,
    size: int,
    index: int,
    gpus: int,
    topology: str | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    annotations = {"kelvin.dev/gang": gang, "kelvin.dev/gang-size": str(size), "kelvin.dev/gang-index": str(index)}
    if topology is not None:
        annotations["kelvin.dev/gang-topology"] = topology
    return gpu_pod(name, gpus, {**annotations, **(extra or {})})


def _pods(cluster: LoopbackCluster, namespace: str) -> dict[str, dict[str, Any]]:
    items = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    return {p["metadata"]["name"]: dict(p) for p in items}


def all_bound(
    cluster: LoopbackCluster, namespace: str, names: list[str], ks: KelvinScheduler, op: Process
) -> dict[str, dict[str, Any]]:
    def probe() -> dict[str, dict[str, Any]] | None:
        ks.check_alive()
        if not op.alive():
            raise RuntimeError(f"kelvin operator exited:\n{op.tail()}")
        pods = _pods(cluster, namespace)
        return pods if all(pods.get(n, {}).get("spec", {}).get("nodeName") for n in names) else None

    return wait_for(f"gang {names} bound", probe, 90)


def released(cluster: LoopbackCluster, namespace: str) -> None:
    """Delete the namespace's pods and wait until they are gone, so the next scenario finds the fleet free."""
    for name in _pods(cluster, namespace):
        cluster.api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", json={"gracePeriodSeconds": 0})
    wait_for(f"pods of {namespace} deleted", lambda: not _pods(cluster, namespace), 60)


def _no_gpu_twice(pods: list[dict[str, Any]]) -> None:
    seen: set[tuple[str, int]] = set()
    for p in pods:
        for gpu in assigned(p):
            slot = (p["spec"]["nodeName"], gpu)
            assert slot not in seen, f"GPU {slot} given twice"
            seen.add(slot)


def test_gang_of_four_is_bound_in_one_rack_on_its_planned_gpus(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, gang_operator: Process, namespace: str
) -> None:
    """4 members x 4 GPUs, ``required=rack``: each rack (16 GPUs) holds it; the whole gang lands in one, each member
    on the node and GPUs the operator planned, consecutive ranks on the same node (two per node)."""
    names = [f"train-{i}" for i in range(4)]
    for i, name in enumerate(names):
        cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", member(name, "train", 4, i, 4, "required=rack"))
    pods = all_bound(cluster, namespace, names, kelvin_scheduler, gang_operator)
    try:
        placed = [pods[n] for n in names]
        for p in placed:
            annotations = p["metadata"]["annotations"]
            assert not any(g["name"] == GATE for g in p["spec"].get("schedulingGates") or []), p["spec"]
            assert annotations[PLANNED_NODE] == p["spec"]["nodeName"], annotations
            assert sorted(assigned(p)) == sorted(int(g) for g in annotations[PLANNED_GPUS].split(",")), annotations
            assert len(assigned(p)) == 4
        nodes = [p["spec"]["nodeName"] for p in placed]
        assert len({RACK_OF[n] for n in nodes}) == 1, nodes
        _no_gpu_twice(placed)
        # rank order: members fill the rack's nodes one after the other
        assert nodes[0] == nodes[1] and nodes[2] == nodes[3] and nodes[0] != nodes[2], nodes
        # kelvin explain (POST /explain) of a member shows the operator's plan for it
        gang = kelvin_scheduler.explain(placed[2], nodes[2])["gang"]
        assert gang["gang"] == f"{namespace}/kelvin:train" and (gang["size"], gang["rank"]) == (4, 2), gang
        assert gang["planned"]["node"] == nodes[2] and gang["planned"]["this_node"] is True, gang
        assert sorted(gang["planned"]["gpus"]) == sorted(assigned(placed[2])), gang
        planned = _one_event(cluster, namespace, "GangPlanned")  # planned once, not once per node's timer
        assert f"gang {namespace}/kelvin:train: 4 members planned in rack" in planned["message"], planned
    finally:
        released(cluster, namespace)


def _events(cluster: LoopbackCluster, namespace: str, reason: str) -> list[dict[str, Any]]:
    return list(cluster.api.get(f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"reason={reason}")["items"])


def _one_event(cluster: LoopbackCluster, namespace: str, reason: str) -> dict[str, Any]:
    """The one Event of ``reason`` in ``namespace``. The operator posts it after it writes the plan's patches, so a
    test that saw the patches waits for it (bounded) rather than reading at once; then exactly one must exist."""
    wait_for(f"a {reason} Event", lambda: _events(cluster, namespace, reason), 30)
    (event,) = _events(cluster, namespace, reason)
    return event


def test_gang_that_cannot_fit_holds_nothing_and_gets_a_warning(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, gang_operator: Process, namespace: str
) -> None:
    """4 members x 8 GPUs, ``required=rack``: no rack has more than two nodes. The members stay gated, none is
    bound or planned, a ``GangNotPlaced`` Warning says why; the GPUs stay free (a plain 8-GPU pod binds)."""
    names = [f"big-{i}" for i in range(4)]
    for i, name in enumerate(names):
        cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", member(name, "big", 4, i, 8, "required=rack"))
    try:
        warning = wait_for("a GangNotPlaced Event", lambda: _events(cluster, namespace, "GangNotPlaced"), 60)[0]
        assert warning["type"] == "Warning", warning
        message = warning["message"]
        assert f"gang {namespace}/kelvin:big can never be placed" in message, message
        assert "8 free GPUs in one rack" in message and "at most 2 even when empty" in message, message
        pods = _pods(cluster, namespace)
        for name in names:
            p = pods[name]
            assert not p["spec"].get("nodeName"), p["spec"]
            assert any(g["name"] == GATE for g in p["spec"].get("schedulingGates") or []), p["spec"]
            assert PLANNED_NODE not in (p["metadata"].get("annotations") or {}), p["metadata"]
        # the gang holds no GPU: a plain pod of 8 GPUs still finds a node
        cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", gpu_pod("plain-8", 8))
        pods = all_bound(cluster, namespace, ["plain-8"], kelvin_scheduler, gang_operator)
        assert all(not pods[n]["spec"].get("nodeName") for n in names)
    finally:
        released(cluster, namespace)


def lws_pod(name: str, group: str, size: int, worker: int, gpus: int) -> dict[str, Any]:
    """A pod as the LeaderWorkerSet controller creates it: the group's labels, its size as an annotation."""
    pod = gpu_pod(name, gpus, {f"{LWS}size": str(size)})
    pod["metadata"]["labels"] = {
        f"{LWS}name": group,
        f"{LWS}group-index": "0",
        f"{LWS}worker-index": str(worker),
    }
    return pod


def test_leaderworkerset_group_is_placed_together_in_one_rack(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, gang_operator: Process, namespace: str
) -> None:
    """A leader and a worker of 8 GPUs each, no kelvin annotation: the LWS labels make them a gang
    (``preferred=node`` by default, so the innermost level that holds it: a rack); both in one rack."""
    names = ["vllm-0", "vllm-0-1"]  # LWS names the leader <lws>-<group>, a worker <lws>-<group>-<worker>
    for worker, name in enumerate(names):
        cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", lws_pod(name, "vllm", 2, worker, 8))
    pods = all_bound(cluster, namespace, names, kelvin_scheduler, gang_operator)
    try:
        placed = [pods[n] for n in names]
        nodes = [p["spec"]["nodeName"] for p in placed]
        assert RACK_OF[nodes[0]] == RACK_OF[nodes[1]] and nodes[0] != nodes[1], nodes
        for p in placed:
            assert p["metadata"]["annotations"][PLANNED_NODE] == p["spec"]["nodeName"]
            assert sorted(assigned(p)) == list(range(8))
        planned = _one_event(cluster, namespace, "GangPlanned")
        assert f"gang {namespace}/leaderworkerset:vllm-0: 2 members planned in rack" in planned["message"], planned
    finally:
        released(cluster, namespace)


HOLD = "e2e.kelvin.dev/hold"  # a scheduling gate of the test's own: planned members stay unbound until it goes
HOT_C = 90  # past the hot threshold (83 °C) and the slowdown margin
THERMAL_TAINT = "kelvin.dev/thermal"


@contextlib.contextmanager
def heated(cluster: LoopbackCluster, telemetry: Telemetry, node: str) -> Iterator[GpuState]:
    """GPU 0 of ``node`` at :data:`HOT_C` (scraped), cooled again at the end and its thermal taint gone (the operator
    lifts it once the node stays cool for its hold time), so the next scenario finds the fleet as it was."""
    gpus = GpuState(telemetry)
    gpus.temperature(node, 0, HOT_C)
    try:
        yield gpus
    finally:
        gpus.reset()

        def untainted() -> bool:
            taints = cluster.api.get(f"/api/v1/nodes/{node}")["spec"].get("taints") or []
            return not any(t.get("key") == THERMAL_TAINT for t in taints)

        wait_for(f"the thermal taint of {node} lifted", untainted, 90, 0.5)


def _planned(pods: dict[str, dict[str, Any]], names: list[str]) -> dict[str, str] | None:
    found: dict[str, str] = {}
    for n in names:
        node = (pods.get(n, {}).get("metadata", {}).get("annotations") or {}).get(PLANNED_NODE)
        if not node:
            return None
        found[n] = str(node)
    return found


def test_a_planned_node_turning_hot_before_binding_is_replanned_never_half_bound(
    cluster: LoopbackCluster,
    kelvin_scheduler: KelvinScheduler,
    gang_operator: Process,
    telemetry: Telemetry,
    namespace: str,
) -> None:
    """2 members x 8 GPUs, ``required=rack``, held unbound by a gate of the test's own after kelvin plans them (and
    lifts only its own gate). One planned node turns hot: its rack has one cool node left, so the operator re-plans
    the whole gang into the other rack (``GangReplanned`` naming the hot node). Once the test's gate goes, every
    member binds on its new plan, all in one rack, none on the hot node."""
    names = ["replan-0", "replan-1"]
    for i, name in enumerate(names):
        body = member(name, "replan", 2, i, 8, "required=rack")
        body["spec"]["schedulingGates"] = [{"name": HOLD}]
        cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", body)
    try:
        first = wait_for("the gang planned", lambda: _planned(_pods(cluster, namespace), names), 60)
        pods = _pods(cluster, namespace)
        for n in names:  # kelvin's gate lifted, the test's kept: nothing is bound yet
            assert [g["name"] for g in pods[n]["spec"].get("schedulingGates") or []] == [HOLD], pods[n]["spec"]
            assert not pods[n]["spec"].get("nodeName")
        (old_rack,) = {RACK_OF[n] for n in first.values()}
        hot = first[names[0]]
        with heated(cluster, telemetry, hot):

            def replanned() -> list[dict[str, Any]]:
                if not gang_operator.alive():
                    pytest.fail(f"kelvin operator exited:\n{gang_operator.tail()}")
                return _events(cluster, namespace, "GangReplanned")

            # the operator patches the members one after the other and posts GangReplanned once all are written:
            # the plans are read after the Event, never halfway through the rewrite
            wait_for("a GangReplanned Event", replanned, 60)
            second = _planned(_pods(cluster, namespace), names)
            assert second is not None and hot not in second.values(), (first, second)
            assert {RACK_OF[n] for n in second.values()} == {next(r for r in RACKS if r != old_rack)}, second
            event = _one_event(cluster, namespace, "GangReplanned")
            assert f"its planned node {hot} is hot" in event["message"], event
            assert f"gang {namespace}/kelvin:replan re-planned" in event["message"], event
            for n in names:  # release the test's gate: the members bind on the new plan
                cluster.api.merge_patch(f"/api/v1/namespaces/{namespace}/pods/{n}", {"spec": {"schedulingGates": []}})
            pods = all_bound(cluster, namespace, names, kelvin_scheduler, gang_operator)
            nodes = {n: pods[n]["spec"]["nodeName"] for n in names}
            assert nodes == second, (nodes, second)
            assert hot not in nodes.values() and len({RACK_OF[v] for v in nodes.values()}) == 1, nodes
            _no_gpu_twice([pods[n] for n in names])
    finally:
        released(cluster, namespace)


def test_a_running_gang_with_a_member_on_a_node_turning_hot_is_checkpointed_and_evicted_whole(
    cluster: LoopbackCluster,
    kelvin_scheduler: KelvinScheduler,
    gang_operator: Process,
    telemetry: Telemetry,
    namespace: str,
) -> None:
    """2 members x 8 GPUs bound in one rack, both asking for the checkpoint handshake. GPU 0 of member 0's node turns
    hot: the operator asks *every* member to checkpoint (its peer on the cool node too), evicts none of them before
    both have answered, then evicts the whole gang through the Eviction API (``KelvinEvicted`` on each, one
    ``GangEvicted``), never the straggler alone."""
    names = ["strag-0", "strag-1"]
    for i, name in enumerate(names):
        body = member(name, "strag", 2, i, 8, "required=rack", extra={"kelvin.dev/checkpoint": "true"})
        cluster.api.create(f"/api/v1/namespaces/{namespace}/pods", body)
    pods = all_bound(cluster, namespace, names, kelvin_scheduler, gang_operator)
    uids = {n: pods[n]["metadata"]["uid"] for n in names}
    hot = pods[names[0]]["spec"]["nodeName"]
    try:
        with heated(cluster, telemetry, hot):

            def asked() -> dict[str, dict[str, Any]] | None:
                if not gang_operator.alive():
                    pytest.fail(f"kelvin operator exited:\n{gang_operator.tail()}")
                now = _pods(cluster, namespace)
                got = [(now.get(n, {}).get("metadata", {}).get("annotations") or {}) for n in names]
                return now if all("kelvin.dev/checkpoint-requested" in a for a in got) else None

            now = wait_for("a checkpoint asked of every member", asked, 90)
            # nobody has answered: the gang is still whole, none of it evicted
            assert all(now[n]["metadata"]["uid"] == uids[n] and not now[n]["metadata"].get("deletionTimestamp")
                       for n in names), now  # fmt: skip
            assert not _events(cluster, namespace, "KelvinEvicted")
            done = format_time(time.time() + 1)
            for n in names:  # both workloads answer, as examples/checkpoint_training_loop.py does
                cluster.api.merge_patch(
                    f"/api/v1/namespaces/{namespace}/pods/{n}",
                    {"metadata": {"annotations": {"kelvin.dev/checkpoint-done": done}}},
                )

            def evicted() -> list[dict[str, Any]] | None:
                found = _events(cluster, namespace, "KelvinEvicted")
                return found if {e["involvedObject"]["name"] for e in found} == set(names) else None

            events = wait_for("every member evicted", evicted, 90)
            assert all("gang's checkpoint handshake" in e["message"] for e in events), events
            gang_event = _one_event(cluster, namespace, "GangEvicted")
            assert f"gang {namespace}/kelvin:strag moved as a whole (2 members)" in gang_event["message"], gang_event
            assert "2 of 2 members evicted" in gang_event["message"], gang_event

            def asks() -> set[str]:
                return {e["involvedObject"]["name"] for e in _events(cluster, namespace, "CheckpointRequested")}

            wait_for("a CheckpointRequested Event per member", lambda: asks() == set(names), 30)

            def gone() -> bool:
                left = _pods(cluster, namespace)
                return all(
                    n not in left
                    or left[n]["metadata"]["uid"] != uids[n]
                    or left[n]["metadata"].get("deletionTimestamp")
                    for n in names
                )

            wait_for("the evicted members terminating", gone, 60)
    finally:
        released(cluster, namespace)
