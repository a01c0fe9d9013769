"""The operator's gang loop: a whole gang planned into one rack, patched (plan annotations, gate lifted) and
assumed; a gang that cannot fit holds nothing and gets one Warning Event per reason; dry run writes nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kelvin_operator.gang_loop import GangLoop
from kelvin_operator.k8s import ObjectRef
from kelvin_operator.settings import OperatorConfig

from scheduler_plugin.gang import GangPolicy
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.snapshot import Snapshot
from tests.fleet_helpers import NOW
from tests.gang.gang_helpers import rack

GANG = GangPolicy.model_validate({"levels": [{"name": "rack", "label": "kelvin.dev/rack"}]})


class FakeKube:
    def __init__(self) -> None:
        self.patches: list[tuple[str, str, Mapping[str, Any]]] = []
        self.events: list[tuple[str, str, str, bool]] = []

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


def loop(**cfg: Any) -> tuple[GangLoop, FakeKube]:
    kube = FakeKube()
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
