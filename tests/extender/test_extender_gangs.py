"""A gang member planned by the operator: the extender's filter passes only its planned node (a reason on every
other, none when the planned node turned hot), and bind gives it the planned GPUs the snapshot holds for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from ext_helpers import args, gpu_node, make_extender, pod
from test_extender_bind_idempotent import ScriptedBinder, binding

from scheduler_plugin.extender.service import Extender
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
    assert all("is hot now; the operator re-plans the gang" in why for why in r["FailedNodes"].values())
    gone = ext.filter(args(planned("gpu-node-9"), NODES))
    assert gone["NodeNames"] == [] and "no longer sees" in gone["FailedNodes"]["gpu-node-1"]


async def test_bind_uses_the_planned_gpus(started: Any) -> None:
    # the pod listing shows the plan as the pod's assignment, without its UID (telemetry.assignments)
    plan = GpuAssignment(pod_key="default/w-0", gpu_indices=(4, 5, 6, 7))
    node = replace(gpu_node("gpu-node-1"), assignments=(plan,))
    binder = ScriptedBinder()
    ext = await started(make_extender([node, gpu_node("gpu-node-2")], binder=binder)[0])
    ext.filter(args(planned("gpu-node-1"), NODES))
    assert await ext.bind(binding("w-0", "gpu-node-1")) == {"Error": ""}
    assert binder.calls == [("w-0", "gpu-node-1", (4, 5, 6, 7))]
