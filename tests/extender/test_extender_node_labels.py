"""explain's gang forecast with the Node objects' labels (extender/node_labels.py): the extender lists the Nodes'
level labels (pages, a failed list keeping the previous one, a stale list not used) and plans the forecast over the
domains the operator sees, instead of saying ``levels_unknown`` for a snapshot without labels."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from ext_helpers import gpu_node, make_extender
from test_extender_gangs import member, with_racks

from scheduler_plugin.extender.gang_explain import describe
from scheduler_plugin.extender.node_labels import NodeLabelLister, labels_of_nodes
from scheduler_plugin.extender.service import Extender
from scheduler_plugin.kubeapi import KubeError
from scheduler_plugin.model import annotations as ann
from tests.extender.paged_api import Clock, PagedApi

RACK = "kelvin.dev/rack"


def node_obj(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}}}


class FakeApi(PagedApi):
    """Answers the list of Nodes in pages of ``page`` (or fails with ``error``)."""

    def __init__(self, items: list[dict[str, Any]], page: int = 2) -> None:
        super().__init__("/api/v1/nodes", items, page)


NODES = [
    node_obj("gpu-node-1", **{RACK: "r1"}),
    node_obj("gpu-node-2", **{RACK: "r1"}),
    node_obj("gpu-node-3", **{RACK: "r2"}),
]


def lister(api: FakeApi) -> tuple[NodeLabelLister, Clock]:
    clock = Clock()
    return NodeLabelLister(api, [RACK], clock=clock), clock  # type: ignore[arg-type]


async def test_the_lister_keeps_only_the_level_labels_over_pages_and_the_last_good_list() -> None:
    api = FakeApi([*NODES, {"metadata": {}}, "junk"])  # type: ignore[list-item]
    nl, clock = lister(api)
    assert nl.labels() is None  # never listed
    assert await nl.refresh() and api.calls == 3
    assert nl.labels() == {"gpu-node-1": {RACK: "r1"}, "gpu-node-2": {RACK: "r1"}, "gpu-node-3": {RACK: "r2"}}
    api.error = KubeError(503, "GET /api/v1/nodes: unavailable")
    assert not await nl.refresh() and nl.error is not None
    assert nl.labels() is not None  # the previous list is kept
    clock.t += 301
    assert nl.labels() is None  # too old to trust


def test_labels_of_nodes_ignores_non_string_values() -> None:
    items = [{"metadata": {"name": "n", "labels": {RACK: 3, "other": "x"}}}]
    assert labels_of_nodes(items, [RACK]) == {"n": {}}


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


async def test_explain_forecasts_a_gang_over_the_node_objects_racks(started: Any) -> None:
    """The snapshot has no labels (a Prometheus or scrape source): with the Nodes listed, a required=rack gang of
    two 8-GPU members is forecast in rack r1 (gpu-node-3 is alone in r2), not "not known here"."""
    nodes = [gpu_node("gpu-node-1"), gpu_node("gpu-node-2"), gpu_node("gpu-node-3")]
    ext = with_racks(await started(make_extender(nodes)[0]))
    nl, _ = lister(FakeApi(NODES))
    await nl.refresh()
    ext.node_labels = nl
    gang = ext.explain(member(1, more={ann.GANG_TOPOLOGY: "required=rack"}), "gpu-node-3")["gang"]
    assert "levels_unknown" not in gang and gang["levels_from"] == "the Node objects' labels"
    plan = gang["plan"]
    assert plan["planned"] and (plan["level"], plan["domain"]) == ("rack", "r1"), plan
    assert {m["node"] for m in plan["members"]} == {"gpu-node-1", "gpu-node-2"}
    assert "not planned yet; planned now: rack r1" in "\n".join(describe(gang))
    # no Node carries the level's label: the operator's planner refuses required=rack too, so the forecast says
    # it can never be placed (not "cannot be forecast")
    nl2, _ = lister(FakeApi([node_obj(n["metadata"]["name"]) for n in NODES]))
    await nl2.refresh()
    ext.node_labels = nl2
    gang = ext.explain(member(1, more={ann.GANG_TOPOLOGY: "required=rack"}), "gpu-node-3")["gang"]
    assert "levels_unknown" not in gang
    assert gang["plan"]["planned"] is False and gang["plan"]["unresolvable"] is True
    assert "no node carries the level's label" in gang["plan"]["reason"], gang
    # the list went stale: back to the snapshot's labels, and the levels it cannot see are said
    ext.node_labels = NodeLabelLister(FakeApi(NODES), [RACK])  # type: ignore[arg-type]
    gang = ext.explain(member(1, more={ann.GANG_TOPOLOGY: "required=rack"}), "gpu-node-3")["gang"]
    assert gang["levels_unknown"]["levels"] == ["rack"] and gang["plan"]["levels_known"] is False


def test_the_extender_lists_node_labels_only_with_an_api_and_gang_levels() -> None:
    from scheduler_plugin.extender.app import build_extender
    from scheduler_plugin.policies.policy_file import PolicyConfig
    from scheduler_plugin.settings import Settings

    settings = Settings(source="prometheus", kube_server="http://127.0.0.1:9")
    racks = PolicyConfig.from_mapping({"gang": {"levels": [{"name": "rack", "label": RACK}]}})
    ext = build_extender(settings, policy=racks)
    assert ext.node_labels is not None and ext.node_labels.keys == {RACK}
    asyncio.run(ext.binder.close())
    plain = build_extender(settings, policy=PolicyConfig())
    assert plain.node_labels is None  # no levels: every node is its own domain, nothing to list
    asyncio.run(plain.binder.close())
    assert make_extender([gpu_node("gpu-node-1")])[0].node_labels is None  # no Kubernetes API
