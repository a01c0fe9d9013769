"""A gang member planned by the operator: the extender's filter passes only its planned node (a reason on every
other, none when the planned node turned hot), and bind gives it the planned GPUs the snapshot holds for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from ext_helpers import args, gpu_node, make_extender, pod
from test_extender_bind_idempotent import ScriptedBinder, binding

from scheduler_plugin.extender.gang_explain import describe
from scheduler_plugin.extender.service import Extender
from scheduler_plugin.gang import GangPolicy
from scheduler_plugin.model import GpuAssignment
from scheduler_plugin.model import annotations as ann

NODES = ("gpu-node-1", "gpu-node-2")


def planned(node: str) -> dict[str, Any]:
    return pod("w-0", gpus=4, annotations={ann.GANG_PLANNED_NODE: node, ann.GANG_PLANNED_GPUS: "4,5,6,7"})


@pytest.fixture
async def started() -> AsyncIterator[Any]:
    exts: list[Extender] = []

    async def start(ext: Extender) -> Extender:
        await ext.cache.start()
        exts.append(ext)
        return ext

    yield start
    for e in exts:
        await e.cache.stop()


async def test_filter_passes_only_the_planned_node(started: Any) -> None:
    ext = await started(make_extender([gpu_node("gpu-node-1"), gpu_node("gpu-node-2")])[0])
    r = ext.filter(args(planned("gpu-node-1"), NODES))
    assert r["NodeNames"] == ["gpu-node-1"]
    assert r["FailedNodes"] == {"gpu-node-2": "gang member: kelvin's gang planner placed it on node gpu-node-1"}
    # an ordinary pod still sees both
    assert set(ext.filter(args(pod("plain", gpus=4), NODES))["NodeNames"]) == set(NODES)


async def test_a_planned_node_that_turned_hot_passes_nowhere(started: Any) -> None:
    ext = await started(make_extender([gpu_node("gpu-node-1", hot=[0]), gpu_node("gpu-node-2")])[0])
    r = ext.filter(args(planned("gpu-node-1"), NODES))
    assert r["NodeNames"] == []
    assert r["FailedNodes"] == dict.fromkeys(
        NODES, "gang member: its planned node gpu-node-1 is hot; the operator re-plans the gang"
    )
    gone = ext.filter(args(planned("gpu-node-9"), NODES))
    assert gone["NodeNames"] == [] and "its planned node gpu-node-9 is gone" in gone["FailedNodes"]["gpu-node-1"]


def poorly_cooled(name: str) -> Any:
    """Cool now (45 °C, not hot), but predicted past its slowdown under a pod's load: 0.15 °C/W (a well cooled GPU:
    0.03) from 60 W to the 400 W its busy GPU draws. Its thermal quality is 0, below ``gang.minThermalQuality``."""
    nd = gpu_node(name, busy=[0])
    gpus = tuple(
        replace(g, power_watts=400.0 if g.index == 0 else 60.0, thermal_resistance_c_per_w=0.15) for g in nd.gpus
    )
    return replace(nd, gpus=gpus)


async def test_a_planned_node_predicted_hot_under_load_passes_nowhere(started: Any) -> None:
    """The operator's stale-plan pass re-plans a member whose node is predicted hot; until it does, the member must
    not bind there: the extender runs the same check (gang.plan_check) and refuses it every node."""
    ext = await started(make_extender([poorly_cooled("gpu-node-1"), gpu_node("gpu-node-2")])[0])
    assert not ext.filter(args(pod("plain", gpus=4), NODES))["FailedNodes"].get("gpu-node-1", "").startswith("gang")
    r = ext.filter(args(planned("gpu-node-1"), NODES))
    assert r["NodeNames"] == []
    why = "gang member: its planned node gpu-node-1 is predicted hot under load; the operator re-plans the gang"
    assert r["FailedNodes"] == dict.fromkeys(NODES, why)
    assert ext.filter(args(planned("gpu-node-2"), NODES))["NodeNames"] == ["gpu-node-2"]


async def test_a_planned_member_whose_gpus_another_pod_holds_passes_nowhere(started: Any) -> None:
    """GPU 5 of the planned GPUs 4-7 is held by a pod kelvin did not place on the plan: the member would not fit;
    a gang plan on them (the member's own, or another member's while a re-plan is written) is not a taker."""
    intruder = GpuAssignment(pod_key="other/intruder", gpu_indices=(5,))
    own_plan = GpuAssignment(pod_key="default/w-0", gpu_indices=(4, 5, 6, 7), gang_plan=True)
    mate_plan = GpuAssignment(pod_key="default/w-1", gpu_indices=(6,), gang_plan=True)
    taken = replace(gpu_node("gpu-node-1"), assignments=(own_plan, intruder))
    ext = await started(make_extender([taken, gpu_node("gpu-node-2")])[0])
    r = ext.filter(args(planned("gpu-node-1"), NODES))
    assert r["NodeNames"] == []
    assert r["FailedNodes"]["gpu-node-2"] == (
        "gang member: its planned GPUs 4,5,6,7 on gpu-node-1 are taken by other/intruder; "
        "the operator re-plans the gang"
    )
    free = replace(gpu_node("gpu-node-1"), assignments=(own_plan, mate_plan))
    ext = await started(make_extender([free, gpu_node("gpu-node-2")])[0])
    assert ext.filter(args(planned("gpu-node-1"), NODES))["NodeNames"] == ["gpu-node-1"]


async def test_bind_uses_the_planned_gpus(started: Any) -> None:
    # the pod listing shows the plan as the pod's assignment, without its UID (telemetry.assignments)
    plan = GpuAssignment(pod_key="default/w-0", gpu_indices=(4, 5, 6, 7))
    node = replace(gpu_node("gpu-node-1"), assignments=(plan,))
    binder = ScriptedBinder()
    ext = await started(make_extender([node, gpu_node("gpu-node-2")], binder=binder)[0])
    ext.filter(args(planned("gpu-node-1"), NODES))
    assert await ext.bind(binding("w-0", "gpu-node-1")) == {"Error": ""}
    assert binder.calls == [("w-0", "gpu-node-1", (4, 5, 6, 7))]


def member_planned(name: str, gpus: str) -> dict[str, Any]:
    return pod(name, gpus=4, annotations={ann.GANG_PLANNED_NODE: "gpu-node-1", ann.GANG_PLANNED_GPUS: gpus})


async def test_bind_uses_the_plan_on_the_pod_before_the_pod_listing_shows_it(started: Any) -> None:
    """Two members planned on one node (GPUs 0-3 and 4-7) reach bind before the pod listing (refreshed every few
    seconds) shows their plans: each gets its own planned GPUs, whichever binds first, not a fresh pick (the first
    would take GPUs 0-3, the second's plan)."""
    binder = ScriptedBinder()
    ext = await started(make_extender([gpu_node("gpu-node-1"), gpu_node("gpu-node-2")], binder=binder)[0])
    for name, gpus in (("w-1", "0,1,2,3"), ("w-0", "4,5,6,7")):
        assert ext.filter(args(member_planned(name, gpus), NODES))["NodeNames"] == ["gpu-node-1"]
    assert await ext.bind(binding("w-0", "gpu-node-1")) == {"Error": ""}
    assert await ext.bind(binding("w-1", "gpu-node-1")) == {"Error": ""}
    assert binder.calls == [("w-0", "gpu-node-1", (4, 5, 6, 7)), ("w-1", "gpu-node-1", (0, 1, 2, 3))]


async def test_bind_refuses_a_plan_whose_gpus_another_bind_took_before_the_listing_showed_it(started: Any) -> None:
    """An ordinary pod bound on GPU 5 (assumed in the ledger, not listed yet) after the member's filter: the member's
    planned GPUs 4-7 are no longer free, so its bind fails with the reason instead of landing on other GPUs."""
    binder = ScriptedBinder()
    ext = await started(make_extender([gpu_node("gpu-node-1"), gpu_node("gpu-node-2")], binder=binder)[0])
    assert ext.filter(args(planned("gpu-node-1"), NODES))["NodeNames"] == ["gpu-node-1"]
    ext.ledger.assume("gpu-node-1", GpuAssignment(pod_key="other/intruder", gpu_indices=(5,)), ext.clock())
    reply = await ext.bind(binding("w-0", "gpu-node-1"))
    assert reply["Error"] == (
        "pod default/w-0 (gang member): its planned GPUs 4,5,6,7 on gpu-node-1 are taken by other/intruder; "
        "the operator re-plans the gang"
    )
    assert binder.calls == []


async def test_bind_does_not_use_a_plan_the_pod_no_longer_carries(started: Any) -> None:
    """Filter saw the member planned on GPUs 4-7; the plan is gone from the pod at its next filter (same UID): bind
    picks afresh instead of using the remembered plan."""
    binder = ScriptedBinder()
    ext = await started(make_extender([gpu_node("gpu-node-1"), gpu_node("gpu-node-2")], binder=binder)[0])
    assert ext.filter(args(planned("gpu-node-1"), NODES))["NodeNames"] == ["gpu-node-1"]
    assert set(ext.filter(args(pod("w-0", gpus=4), NODES))["NodeNames"]) == set(NODES)
    assert await ext.bind(binding("w-0", "gpu-node-1")) == {"Error": ""}
    assert binder.calls == [("w-0", "gpu-node-1", (0, 1, 2, 3))]


# -- /explain for a gang member ----------------------------------------------------------------------------------

RACKS = {"gpu-node-1": "r1", "gpu-node-2": "r1", "gpu-node-3": "r2"}


def racked(name: str, busy: tuple[int, ...] = ()) -> Any:
    return replace(gpu_node(name, busy=busy), labels={"kelvin.dev/rack": RACKS[name]})


def with_racks(ext: Extender) -> Extender:
    """The extender's policy with ``gang.levels: [rack]`` (what ``gang:`` in its policy file gives)."""
    gang = GangPolicy.model_validate({"levels": [{"name": "rack", "label": "kelvin.dev/rack"}]})
    ext.policy = ext.policy.model_copy(update={"gang": gang})
    return ext


def member(index: int, gpus: int = 8, more: dict[str, str] | None = None) -> dict[str, Any]:
    annotations = {ann.GANG: "llama", ann.GANG_SIZE: "2", ann.GANG_INDEX: str(index), **(more or {})}
    return pod(f"llama-{index}", gpus=gpus, annotations=annotations)


async def test_explain_plans_a_gated_member_s_gang_and_says_where_each_member_goes(started: Any) -> None:
    """Two members of 8 GPUs, required=rack: only rack r1 has two free nodes (gpu-node-3 is alone in r2)."""
    nodes = [racked("gpu-node-1"), racked("gpu-node-2"), racked("gpu-node-3")]
    ext = with_racks(await started(make_extender(nodes)[0]))
    out = ext.explain(member(1, more={ann.GANG_TOPOLOGY: "required=rack"}), "gpu-node-3")
    gang = out["gang"]
    assert (gang["gang"], gang["kind"], gang["size"], gang["rank"]) == ("default/kelvin:llama", "kelvin", 2, 1)
    assert gang["topology"] == "required=rack"
    plan = gang["plan"]
    assert plan["planned"] and (plan["level"], plan["domain"]) == ("rack", "r1"), plan
    assert [m["rank"] for m in plan["members"]] == [0, 1]
    assert {m["node"] for m in plan["members"]} == {"gpu-node-1", "gpu-node-2"}
    assert all(sorted(m["gpus"]) == list(range(8)) for m in plan["members"])
    assert plan["this_member"]["this_node"] is False and plan["this_member"]["node"] in ("gpu-node-1", "gpu-node-2")
    text = "\n".join(describe(gang))
    assert "not planned yet; planned now: rack r1" in text and "rank 1: gpu-node-" in text, text
    # explain charged nothing: an 8-GPU pod still fits on both r1 nodes
    assert ext.explain(pod("plain", gpus=8), "gpu-node-1")["fits"]
    assert ext.explain(pod("plain", gpus=8), "gpu-node-2")["fits"]


async def test_explain_says_why_a_gang_cannot_fit(started: Any) -> None:
    nodes = [racked("gpu-node-1"), racked("gpu-node-2", busy=(0,)), racked("gpu-node-3")]
    ext = with_racks(await started(make_extender(nodes)[0]))
    gang = ext.explain(member(0, more={ann.GANG_TOPOLOGY: "required=rack"}), "gpu-node-1")["gang"]
    assert gang["plan"]["planned"] is False and gang["plan"]["unresolvable"] is False
    assert "needs 2 nodes with 8 free GPUs in one rack; the best rack" in gang["plan"]["reason"], gang
    assert "cannot be placed now: needs 2 nodes" in "\n".join(describe(gang))


async def test_explain_of_a_planned_member_shows_its_plan(started: Any) -> None:
    ext = await started(make_extender([gpu_node("gpu-node-1"), gpu_node("gpu-node-2")])[0])
    p = member(0, 4, {ann.GANG_PLANNED_NODE: "gpu-node-2", ann.GANG_PLANNED_GPUS: "4,5,6,7"})
    gang = ext.explain(p, "gpu-node-1")["gang"]
    assert gang["planned"] == {"node": "gpu-node-2", "gpus": [4, 5, 6, 7], "this_node": False}
    assert "planned by the operator: node gpu-node-2, not this one, GPUs 4,5,6,7" in "\n".join(describe(gang))


async def test_explain_of_a_pod_of_no_gang_has_no_gang_part_and_bad_gang_input_is_named(started: Any) -> None:
    ext = await started(make_extender([gpu_node("gpu-node-1"), gpu_node("gpu-node-2")])[0])
    assert "gang" not in ext.explain(pod("plain", gpus=1), "gpu-node-1")
    bad = ext.explain(member(0, more={ann.GANG_SIZE: "zero"}), "gpu-node-1")["gang"]
    assert "kelvin.dev/gang-size='zero'" in bad["error"], bad
    # a planned member whose topology ask this extender's policy does not know: the error, and the plan still
    unknown = {ann.GANG_TOPOLOGY: "required=rack", ann.GANG_PLANNED_NODE: "gpu-node-1", ann.GANG_PLANNED_GPUS: "0,1"}
    gang = ext.explain(member(0, 2, unknown), "gpu-node-1")["gang"]
    assert "level 'rack' is not defined" in gang["error"], gang
    assert gang["planned"] == {"node": "gpu-node-1", "gpus": [0, 1], "this_node": True}
    text = "\n".join(describe(gang))
    assert "gang: invalid: " in text and "planned by the operator: this node, GPUs 0,1" in text, text


async def test_explain_says_when_the_snapshot_has_no_labels_for_a_level(started: Any) -> None:
    """A Prometheus or scrape snapshot has no Node labels: the forecast says which levels it cannot see, and a
    required=rack gang is "not known here", not "can never be placed" (the operator plans with the Node labels)."""
    ext = with_racks(await started(make_extender([gpu_node("gpu-node-1"), gpu_node("gpu-node-2")])[0]))
    gang = ext.explain(member(0, more={ann.GANG_TOPOLOGY: "required=rack"}), "gpu-node-1")["gang"]
    unknown = gang["levels_unknown"]
    assert unknown["levels"] == ["rack"] and unknown["labels"] == ["kelvin.dev/rack"]
    assert "operator plans with the Node objects' labels" in unknown["why"]
    plan = gang["plan"]
    assert plan["planned"] is False and plan["unresolvable"] is False and plan["levels_known"] is False
    assert plan["reason"].startswith("required=rack: not known here"), plan
    text = "\n".join(describe(gang))
    assert "levels unknown here: no node in the extender's snapshot" in text and "cannot be forecast" in text, text
    # preferred: forecast with every node its own rack, and flagged as such
    gang = ext.explain(member(0, more={ann.GANG_TOPOLOGY: "preferred=rack"}), "gpu-node-1")["gang"]
    assert gang["plan"]["planned"] is True and gang["levels_unknown"]["levels"] == ["rack"]
    # labelled nodes: nothing unknown
    racked_ext = with_racks(await started(make_extender([racked("gpu-node-1"), racked("gpu-node-2")])[0]))
    gang = racked_ext.explain(member(0, more={ann.GANG_TOPOLOGY: "required=rack"}), "gpu-node-1")["gang"]
    assert "levels_unknown" not in gang and gang["plan"]["planned"] is True
