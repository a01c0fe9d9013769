"""One planning cycle over gated gang members: wait for the gang's size, plan all or nothing, patches that record
the plan (counted as assigned by the extender's pod listing) and lift the gate."""

from __future__ import annotations

from typing import Any

from scheduler_plugin.gang import TopologyAsk, build_domains
from scheduler_plugin.gang.cycle import gangs_of, gated_member, plan_gang, stale_members
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model import build_arrays
from scheduler_plugin.telemetry.assignments import assignments_from_pods
from tests.fleet_helpers import NOW
from tests.gang.gang_helpers import POLICY, planner, rack


def member(i: int, size: int = 4, topology: str = "required=rack") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"w-{i}",
            "namespace": "ml",
            "uid": f"u{i}",
            "annotations": {
                ann.GANG: "llama",
                ann.GANG_SIZE: str(size),
                ann.GANG_INDEX: str(i),
                ann.GANG_TOPOLOGY: topology,
            },
        },
        "spec": {
            "schedulingGates": [{"name": "other.dev/gate"}, {"name": ann.GANG_SCHEDULING_GATE}],
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 8}}}],
        },
    }


def cycle(pods: list[dict[str, Any]], nodes: list[Any]) -> Any:
    fleet = build_arrays(nodes)
    domains = build_domains(fleet.names, [nd.labels for nd in nodes], POLICY)
    members = [m for p in pods if (m := gated_member(p, POLICY)) is not None]
    (gang,) = gangs_of(members).values()
    by_key = {f"ml/{p['metadata']['name']}": p for p in pods}
    p = planner()
    return plan_gang(gang, by_key, gang[0].ref.size, p, fleet, domains, p.fw.context(fleet, NOW)), fleet


def test_a_gang_waits_until_its_size_exists() -> None:
    d, _ = cycle([member(0), member(1)], rack("a", 4))
    assert d.waiting and not d.patches and "2 of 4 members" in d.reason


def test_a_planned_gang_lifts_only_kelvins_gate_and_its_capacity_counts_as_assigned() -> None:
    pods = [member(i) for i in range(4)]
    d, _ = cycle(pods, [*rack("big", 8), *rack("a", 4)])
    assert d.planned and len(d.patches) == 4 and "rack a" in d.reason
    for p in pods:
        patch = d.patches[f"ml/{p['metadata']['name']}"]
        assert patch["spec"]["schedulingGates"] == [{"name": "other.dev/gate"}]
        a = patch["metadata"]["annotations"]
        assert a[ann.GANG_PLANNED_NODE].startswith("a-") and a[ann.GANG_PLANNED_GPUS] == "0,1,2,3,4,5,6,7"
        merged = {**p, "metadata": {**p["metadata"], "annotations": {**p["metadata"]["annotations"], **a}}}
        found = assignments_from_pods([merged])  # the extender's pod listing counts the planned GPUs as taken
        (taken,) = found[a[ann.GANG_PLANNED_NODE]]
        assert taken.gpu_indices == tuple(range(8)) and taken.pod_key == f"ml/{p['metadata']['name']}"
        assert taken.pod_uid is None  # not bound yet: the extender's bind must not take it for a done bind
        bound = {**merged, "spec": {**merged["spec"], "nodeName": "x"}}
        assert assignments_from_pods([bound]) == {}  # bound: the binder's gpu-assigned annotations count instead


def test_a_gang_that_cannot_fit_gets_a_reason_and_no_patch() -> None:
    d, _ = cycle([member(i) for i in range(4)], [*rack("a", 3), *rack("b", 3)])
    assert not d.planned and not d.patches and not d.waiting
    assert "needs 4 nodes with 8 free GPUs in one rack" in d.reason and d.unresolvable


def test_ungated_or_unreadable_pods_are_not_members() -> None:
    p = member(0)
    p["spec"]["schedulingGates"] = []
    assert gated_member(p, POLICY) is None
    bad = member(0)
    bad["metadata"]["annotations"][ann.GANG_SIZE] = "many"
    assert gated_member(bad, POLICY) is None


def test_a_plan_on_a_node_gone_or_hot_is_stale() -> None:
    nodes = rack("a", 2)
    fleet = build_arrays(nodes)
    planned = [
        {"metadata": {"name": n, "namespace": "ml", "annotations": {ann.GANG_PLANNED_NODE: node}}, "spec": {}}
        for n, node in (("p0", "a-n0"), ("p1", "a-n1"), ("p2", "gone"))
    ]
    bound = {"metadata": {"name": "p3", "annotations": {ann.GANG_PLANNED_NODE: "gone"}}, "spec": {"nodeName": "x"}}
    assert stale_members([*planned, bound], fleet, [False, True]) == ["ml/p1", "ml/p2"]
    assert TopologyAsk("rack", True).describe() == "required=rack"
