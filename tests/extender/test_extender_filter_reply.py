"""The filter reply built with C-level passes (service._rejected): every name in FailedNodes or
FailedAndUnresolvableNodes with its filter's reason, in request order, the kinds counted; and the prioritize that
follows the filter (the names it passed, reused) answers as a fresh decode would."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import orjson
import pytest
from ext_helpers import gpu_node, make_extender, pod

from scheduler_plugin.extender import wire
from scheduler_plugin.extender.service import Extender
from scheduler_plugin.model import GpuNode, parse_pod
from scheduler_plugin.policies.base import RejectionKind


def fleet() -> list[GpuNode]:
    """90 nodes: a third full (resolvable: FailedNodes), a third with a GPU at 91 C (hot: unresolvable), a third
    free."""
    out = []
    for i in range(90):
        if i % 3 == 0:
            out.append(gpu_node(f"n-{i}", busy=range(8)))
        elif i % 3 == 1:
            out.append(gpu_node(f"n-{i}", hot=[i % 8]))
        else:
            out.append(gpu_node(f"n-{i}"))
    return out


def reference(ext: Extender, names: list[str], p: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The reply's two maps worded name by name, as the filter did before."""
    snap = ext.cache.snapshot.arrays
    req = parse_pod(p)
    known = [n for n in names if n in snap.index]
    rows = np.array([snap.index[n] for n in known], dtype=np.int64)
    outcome = ext.framework.filter(req, snap, rows, ext.framework.context(snap, ext.clock()))
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    for n in names:
        if n not in snap.index:
            unresolvable[n] = "kelvin has no GPU telemetry for this node (not in the snapshot)"
        elif (rej := outcome.rejected.get(snap.index[n])) is not None:
            (unresolvable if rej.unresolvable else failed)[n] = rej.reason
    # the unknown names come after the filters' own unresolvable ones
    unknown = {n: r for n, r in unresolvable.items() if n not in snap.index}
    return failed, {n: r for n, r in unresolvable.items() if n in snap.index} | unknown


@pytest.mark.parametrize("hot", [True, False])
def test_every_rejected_name_has_its_reason_in_request_order(hot: bool) -> None:
    nodes = [n for i, n in enumerate(fleet()) if hot or i % 3 != 1]
    ext, _, _ = make_extender(nodes)
    asyncio.run(ext.cache.refresh_once())
    names = [n.name for n in nodes][::-1]
    names[5:5] = ["ghost-1", "ghost-2"]  # not in the snapshot
    p = pod("p1", gpus=2)

    def counted() -> dict[RejectionKind, float]:
        return {
            k: ext.metrics.registry.get_sample_value("kelvin_extender_rejections_total", {"reason": k}) or 0.0
            for k in RejectionKind
        }

    before = counted()
    reply = ext.filter(json.dumps({"Pod": p, "Nodes": None, "NodeNames": names}).encode())
    failed, unresolvable = reference(ext, names, p)
    assert list(reply["FailedNodes"].items()) == list(failed.items()) and failed
    assert list(reply["FailedAndUnresolvableNodes"].items()) == list(unresolvable.items())
    assert reply["NodeNames"] == [n for n in names if n not in failed and n not in unresolvable]
    after = counted()
    assert sum(after.values()) - sum(before.values()) == len(failed) + len(unresolvable)
    assert after[RejectionKind.UNKNOWN_NODE] - before[RejectionKind.UNKNOWN_NODE] == 2
    assert (len(unresolvable) > 2) is hot  # the hot nodes: unresolvable, among the resolvable full ones
    prio = wire.dumps(ext.prioritize(orjson.dumps({"Pod": p, "Nodes": None, "NodeNames": reply["NodeNames"]})))
    fresh, _, _ = make_extender(nodes)
    asyncio.run(fresh.cache.refresh_once())
    again = wire.dumps(
        fresh.prioritize(json.dumps({"Pod": p, "Nodes": None, "NodeNames": reply["NodeNames"]}).encode())
    )
    assert orjson.loads(prio) == orjson.loads(again)
