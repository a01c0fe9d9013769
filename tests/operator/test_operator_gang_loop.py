"""The operator's gang loop: a whole gang planned into one rack, patched (plan annotations, gate lifted) and
assumed; a gang that cannot fit holds nothing and gets one Warning Event per reason; dry run writes nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kelvin_operator.gang_loop import GangLoop
from kelvin_operator.k8s import ObjectRef
from kelvin_operator.settings import OperatorConfig

from scheduler_plugin.gang import GangPolicy
from scheduler_plugin.kubeapi import KubeError
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.snapshot import Snapshot
from tests.fleet_helpers import NOW, dgx
from tests.gang.gang_helpers import rack

GANG = GangPolicy.model_validate({"levels": [{"name": "rack", "label": "kelvin.dev/rack"}]})


class FakeKube:
    def __init__(self, jobs: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.patches: list[tuple[str, str, Mapping[str, Any]]] = []
        self.events: list[tuple[str, str, str, bool]] = []
        self.jobs = dict(jobs or {})
        self.job_reads: list[str] = []

    async def get_job(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.job_reads.append(f"{namespace}/{name}")
        if f"{namespace}/{name}" not in self.jobs:
            raise KubeError(404, f'jobs.batch "{name}" not found')
        return self.jobs[f"{namespace}/{name}"]

    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        self.patches.append((namespace, name, patch))

    async def event(self, ref: ObjectRef, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append((ref.name, reason, message, warning))


def member(i: int, gang: str = "llama", size: int = 4) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{gang}-{i}",
            "namespace": "ml",
            "annotations": {
                ann.GANG: gang,
                ann.GANG_SIZE: str(size),
                ann.GANG_INDEX: str(i),
                ann.GANG_TOPOLOGY: "required=rack",
            },
        },
        "spec": {
            "schedulingGates": [{"name": ann.GANG_SCHEDULING_GATE}],
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 8}}}],
        },
    }


def loop(jobs: Mapping[str, Mapping[str, Any]] | None = None, **cfg: Any) -> tuple[GangLoop, FakeKube]:
    kube = FakeKube(jobs)
    return GangLoop(OperatorConfig(standalone=True, metrics_port=0, gang=GANG, **cfg), kube), kube


async def test_a_gang_is_planned_in_one_rack_and_its_gates_lifted() -> None:
    snap = Snapshot(nodes=(*rack("big", 8), *rack("a", 4)), taken_at=NOW)
    gl, kube = loop()
    d = await gl.run([member(i) for i in range(4)], snap, {}, NOW)
    assert d is not None and d.planned
    assert sorted(n for _, n, _ in kube.patches) == [f"llama-{i}" for i in range(4)]
    nodes = {p["metadata"]["annotations"][ann.GANG_PLANNED_NODE] for _, _, p in kube.patches}
    assert len(nodes) == 4 and all(n.startswith("a-") for n in nodes)
    assert all(p["spec"]["schedulingGates"] == [] for _, _, p in kube.patches)
    assert kube.events[-1][1] == "GangPlanned"
    # the plan is assumed: a second gang planned before the listing shows the first does not take rack a
    d2 = await gl.run([member(i, "other") for i in range(4)], snap, {}, NOW)
    assert d2 is not None and d2.plan is not None and all(n.startswith("big-") for n in d2.plan.nodes)


async def test_a_gang_that_cannot_fit_holds_nothing_and_is_told_once() -> None:
    snap = Snapshot(nodes=tuple(rack("a", 3)), taken_at=NOW)
    gl, kube = loop()
    for _ in range(3):
        d = await gl.run([member(i) for i in range(4)], snap, {}, NOW)
        assert d is not None and not d.planned
    assert kube.patches == []
    assert len(kube.events) == 1
    name, reason, message, warning = kube.events[0]
    assert (name, reason, warning) == ("llama-0", "GangNotPlaced", True)
    assert "needs 4 nodes with 8 free GPUs in one rack" in message and "can never be placed" in message


async def test_an_incomplete_gang_waits_and_dry_run_writes_nothing() -> None:
    snap = Snapshot(nodes=tuple(rack("a", 4)), taken_at=NOW)
    gl, kube = loop()
    d = await gl.run([member(0), member(1)], snap, {}, NOW)
    assert d is not None and d.waiting and not kube.events and not kube.patches
    gl, kube = loop(dry_run=True)
    d = await gl.run([member(i) for i in range(4)], snap, {}, NOW)
    assert d is not None and d.planned and kube.patches == [] and kube.events[0][1] == "GangPlanned"


def test_a_planning_pass_is_due_at_most_once_per_interval() -> None:
    gl, _ = loop()
    assert gl.due(100.0) and not gl.due(102.0) and gl.due(105.0)


def job_pod(i: int, job: str = "train") -> dict[str, Any]:
    """A pod of an Indexed Job as the Job controller creates it: no kelvin annotation, its owner the Job."""
    return {
        "metadata": {
            "name": f"{job}-{i}-x",
            "namespace": "ml",
            "labels": {"batch.kubernetes.io/job-name": job, "batch.kubernetes.io/job-completion-index": str(i)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": "j", "controller": True}],
        },
        "spec": {
            "schedulingGates": [{"name": ann.GANG_SCHEDULING_GATE}],
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 8}}}],
        },
    }


async def test_an_indexed_jobs_gang_size_is_its_parallelism_read_from_the_job() -> None:
    snap = Snapshot(nodes=tuple(rack("a", 4)), taken_at=NOW)
    gl, kube = loop(jobs={"ml/train": {"spec": {"parallelism": 3, "completions": 3}}})
    d = await gl.run([job_pod(0), job_pod(1)], snap, {}, NOW)
    assert d is not None and d.waiting and "2 of 3 members" in d.reason and kube.job_reads == ["ml/train"]
    d = await gl.run([job_pod(i) for i in range(3)], snap, {}, NOW)
    assert d is not None and d.planned and len(kube.patches) == 3


async def test_a_job_that_cannot_be_read_keeps_the_gang_gated_with_one_warning() -> None:
    snap = Snapshot(nodes=tuple(rack("a", 4)), taken_at=NOW)
    gl, kube = loop()
    for _ in range(2):
        d = await gl.run([job_pod(i) for i in range(3)], snap, {}, NOW)
        assert d is not None and d.waiting and not d.planned
    assert kube.patches == []
    ((name, reason, message, warning),) = kube.events
    assert (name, reason, warning) == ("train-0-x", "GangSizeUnknown", True)
    assert "its Job ml/train is not found" in message and "kelvin.dev/gang-size" in message


def planned(i: int, node: str, *, bound: bool = False) -> dict[str, Any]:
    p = member(i)
    p["spec"]["schedulingGates"] = []
    p["metadata"]["annotations"].update({ann.GANG_PLANNED_NODE: node, ann.GANG_PLANNED_GPUS: "0,1,2,3,4,5,6,7"})
    if bound:
        p["spec"]["nodeName"] = node
    return p


async def test_a_stale_plan_is_replanned_with_an_event_and_a_metric() -> None:
    nodes = [*rack("a", 4), *rack("b", 4)]
    nodes[1] = replace(dgx("a-n1", temp=84), labels=nodes[1].labels)  # hot: past the 83 °C threshold
    snap = Snapshot(nodes=tuple(nodes), taken_at=NOW)
    gl, kube = loop()
    d = await gl.replan([planned(i, f"a-n{i}") for i in range(4)], snap, {}, NOW)
    assert d is not None and d.planned
    assert sorted(p["metadata"]["annotations"][ann.GANG_PLANNED_NODE] for _, _, p in kube.patches) == [
        f"b-n{i}" for i in range(4)
    ]
    ((name, reason, message, warning),) = kube.events
    assert (name, reason, warning) == ("llama-1", "GangReplanned", False)
    assert "llama-1: its planned node a-n1 is hot" in message
    assert gl.metrics.registry.get_sample_value("kelvin_operator_gang_replans_total", {"outcome": "replanned"}) == 1
    # once re-planned, nothing is stale: no second pass writes
    fresh = [planned(i, f"b-n{i}") for i in range(4)]
    assert await gl.replan(fresh, snap, {}, NOW) is None and len(kube.patches) == 4


async def test_a_stale_plan_that_cannot_be_replanned_waits_with_a_warning() -> None:
    nodes = rack("a", 4)
    nodes[1] = replace(dgx("a-n1", temp=84), labels=nodes[1].labels)
    snap = Snapshot(nodes=tuple(nodes), taken_at=NOW)
    gl, kube = loop()
    for _ in range(2):
        d = await gl.replan([planned(i, f"a-n{i}") for i in range(4)], snap, {}, NOW)
        assert d is not None and not d.planned
    assert kube.patches == [] and [e[1] for e in kube.events] == ["GangNotPlaced"]
    assert gl.metrics.registry.get_sample_value("kelvin_operator_gang_replans_total", {"outcome": "waiting"}) == 2


async def test_a_dry_run_replan_writes_nothing_and_is_told_once() -> None:
    nodes = [*rack("a", 4), *rack("b", 4)]
    nodes[1] = replace(dgx("a-n1", temp=84), labels=nodes[1].labels)
    snap = Snapshot(nodes=tuple(nodes), taken_at=NOW)
    gl, kube = loop(dry_run=True)
    for _ in range(3):  # nothing written: the plan is stale again on every pass
        d = await gl.replan([planned(i, f"a-n{i}") for i in range(4)], snap, {}, NOW)
        assert d is not None and d.planned
    assert kube.patches == [] and [e[1] for e in kube.events] == ["GangReplanned"]


async def test_a_replan_writes_the_members_whose_old_plan_still_holds_first() -> None:
    # a-n1 turned hot: llama-1's plan is stale (the extender refuses it), the other three could still bind on their
    # old plans in rack a while the re-plan into rack b is written: they are written first, the stale one last
    nodes = [*rack("a", 4), *rack("b", 4)]
    nodes[1] = replace(dgx("a-n1", temp=84), labels=nodes[1].labels)
    gl, kube = loop()
    d = await gl.replan(
        [planned(i, f"a-n{i}") for i in (1, 0, 2, 3)], Snapshot(nodes=tuple(nodes), taken_at=NOW), {}, NOW
    )
    assert d is not None and d.planned and set(d.stale) == {"ml/llama-1"}
    assert [name for _, name, _ in kube.patches][-1] == "llama-1", kube.patches
