"""One planning cycle over gated gang members: wait for the gang's size, plan all or nothing, patches that record
the plan (counted as assigned by the extender's pod listing) and lift the gate."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from scheduler_plugin.gang import TopologyAsk, build_domains
from scheduler_plugin.gang.cycle import (
    gangs_of,
    gated_member,
    placed_member,
    plan_gang,
    replan_gang,
    stale_members,
    stale_plans,
)
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model import build_arrays
from scheduler_plugin.model.snapshot import Snapshot
from scheduler_plugin.telemetry.assignments import assignments_from_pods, merge_assignments
from tests.fleet_helpers import NOW, dgx, whole
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


# --- stale plans re-planned (replan_gang) ------------------------------------------------------------------------


def _placed(i: int, node: str, gpus: str = "0,1,2,3,4,5,6,7", bound: bool = False) -> dict[str, Any]:
    """Member ``i`` past its gate: planned on ``node`` (and bound there with ``bound``)."""
    p = member(i)
    p["spec"]["schedulingGates"] = [{"name": "other.dev/gate"}]
    p["metadata"]["annotations"].update({ann.GANG_PLANNED_NODE: node, ann.GANG_PLANNED_GPUS: gpus})
    if bound:
        p["spec"]["nodeName"] = node
        p["metadata"]["annotations"][ann.GPU_ASSIGNED] = gpus
    return p


def _snapshot(nodes: list[Any], pods: list[dict[str, Any]]) -> Snapshot:
    """The fleet as the pod listing shows it: every planned or bound member's GPUs taken."""
    return Snapshot(nodes=tuple(merge_assignments(nodes, assignments_from_pods(pods))), taken_at=NOW)


def _replan(pods: list[dict[str, Any]], nodes: list[Any]) -> Any:
    return replan_gang(pods, planner(), _snapshot(nodes, pods), lambda nd: nd.labels, NOW)


def _hot(nodes: list[Any], name: str) -> list[Any]:
    """``nodes`` with node ``name`` at 84 °C (past the hot threshold), its labels kept."""
    return [replace(dgx(nd.name, temp=84), labels=nd.labels) if nd.name == name else nd for nd in nodes]


def test_a_plan_whose_node_turned_hot_before_binding_is_replanned_as_a_whole() -> None:
    # rack a has five nodes: the gang was planned on n0-n3; n2 turns hot. The whole gang is planned again, and its
    # own stale plan does not count against it: it stays in rack a (n0, n1, n3, n4), the tightest rack that fits
    pods = [_placed(i, f"a-n{i}") for i in range(4)]
    nodes = _hot([*rack("a", 5), *rack("b", 8)], "a-n2")
    d = _replan(pods, nodes)
    assert d is not None and d.planned and set(d.stale) == {"ml/w-2"}
    assert "ml/w-2: its planned node a-n2 is hot" in d.reason and "re-planned" in d.reason
    planned = {k: p["metadata"]["annotations"][ann.GANG_PLANNED_NODE] for k, p in d.patches.items()}
    assert set(planned) == {f"ml/w-{i}" for i in range(4)}
    assert sorted(planned.values()) == ["a-n0", "a-n1", "a-n3", "a-n4"]
    assert all(set(p) == {"metadata"} for p in d.patches.values())  # the gate is gone: only the annotations change


def test_a_gang_with_no_stale_plan_is_left_alone() -> None:
    pods = [_placed(i, f"a-n{i}") for i in range(4)]
    assert _replan(pods, rack("a", 4)) is None
    assert _replan([_placed(i, f"a-n{i}", bound=True) for i in range(4)], _hot(rack("a", 4), "a-n2")) is None


def test_unbound_members_are_replanned_next_to_the_bound_ones_never_half_bound() -> None:
    # w-0 and w-1 are bound in rack a; w-2's planned node turned hot. Only w-2 and w-3 are planned again, in rack a
    # (a-n3 and a-n4), though rack b is empty: the gang stays in one rack (required=rack)
    pods = [_placed(0, "a-n0", bound=True), _placed(1, "a-n1", bound=True), _placed(2, "a-n2"), _placed(3, "a-n3")]
    d = _replan(pods, _hot([*rack("a", 5), *rack("b", 4)], "a-n2"))
    assert d is not None and d.planned and "2 bound member(s) kept" in d.reason
    planned = {k: p["metadata"]["annotations"][ann.GANG_PLANNED_NODE] for k, p in d.patches.items()}
    assert planned == {"ml/w-2": "a-n3", "ml/w-3": "a-n4"} or planned == {"ml/w-2": "a-n4", "ml/w-3": "a-n3"}


def test_unbound_members_that_no_longer_fit_next_to_the_bound_ones_wait_and_nothing_is_written() -> None:
    pods = [_placed(0, "a-n0", bound=True), _placed(1, "a-n1", bound=True), _placed(2, "a-n2"), _placed(3, "a-n3")]
    d = _replan(pods, _hot([*rack("a", 4), *rack("b", 4)], "a-n2"))
    assert d is not None and not d.planned and not d.patches
    assert "cannot be re-planned next to its bound members now" in d.reason and "a-n2 is hot" in d.reason


def test_a_plan_is_stale_when_its_node_is_gone_predicted_hot_or_its_gpus_taken() -> None:
    nodes = [*rack("a", 3)]
    nodes[1] = replace(nodes[1], assignments=(whole("intruder", 3),))
    snap = Snapshot(nodes=tuple(nodes), taken_at=NOW)
    pods = [_placed(0, "a-n0"), _placed(1, "a-n1"), _placed(2, "a-n2"), _placed(3, "gone"), _placed(4, "a-n0", "0")]
    members = [m for p in pods if (m := placed_member(p, POLICY)) is not None]
    why = stale_plans(members, snap, [False, False, False], [False, False, True])
    assert why == {
        "ml/w-1": "ml/w-1: its planned GPUs 0,1,2,3,4,5,6,7 on a-n1 are taken by default/intruder",
        "ml/w-2": "ml/w-2: its planned node a-n2 is predicted hot under load",
        "ml/w-3": "ml/w-3: its planned node gone is gone",
    }  # w-0 and w-4 share a-n0's GPU 0: both are the gang's own, not taken


def test_a_plan_is_not_stale_for_other_gang_plans_on_its_gpus_but_is_for_a_bound_pod() -> None:
    # while a re-plan's annotations are being written, the pod listing may show a mate's new plan on this member's
    # old GPUs: plans are the planner's to resolve, never a taker. A bound pod there is one (the extender's filter
    # runs the same check: gang.plan_check)
    pods = [_placed(0, "a-n0"), _placed(1, "a-n1", "0,1,2,3,4,5,6,7", bound=True)]
    nodes = rack("a", 2)
    mate = replace(whole("mate-plan", 0, 1), gang_plan=True)
    nodes[0] = replace(nodes[0], assignments=(mate,))
    members = [m for p in pods if (m := placed_member(p, POLICY)) is not None]
    snap = _snapshot(nodes, pods)
    assert stale_plans(members, snap, [False, False], [False, False]) == {}
    nodes[0] = replace(nodes[0], assignments=(whole("bound-elsewhere", 1),))
    snap = _snapshot(nodes, pods)
    assert stale_plans(members, snap, [False, False], [False, False]) == {
        "ml/w-0": "ml/w-0: its planned GPUs 0,1,2,3,4,5,6,7 on a-n0 are taken by default/bound-elsewhere"
    }


def test_a_member_planned_outside_the_rack_its_bound_members_took_is_replanned_next_to_them() -> None:
    # a re-plan moved the gang to rack b, written member by member: w-0 bound on its old plan (a-n0) before its new
    # plan landed, w-1's new plan (b-n1) holds by itself. Planned there it would split the required=rack gang: it is
    # stale and planned again in rack a, next to w-0
    pods = [_placed(0, "a-n0", bound=True), _placed(1, "b-n1")]
    for p in pods:
        p["metadata"]["annotations"][ann.GANG_SIZE] = "2"
    d = _replan(pods, [*rack("a", 3), *rack("b", 3)])
    assert d is not None and d.planned and set(d.stale) == {"ml/w-1"}, d
    assert "ml/w-1: its planned node b-n1 is outside the rack of its bound members" in d.reason, d.reason
    planned = {k: p["metadata"]["annotations"][ann.GANG_PLANNED_NODE] for k, p in d.patches.items()}
    assert set(planned) == {"ml/w-1"} and planned["ml/w-1"].startswith("a-"), planned
    # preferred=rack: a split is allowed, nothing is stale
    for p in pods:
        p["metadata"]["annotations"][ann.GANG_TOPOLOGY] = "preferred=rack"
    assert _replan(pods, [*rack("a", 3), *rack("b", 3)]) is None
