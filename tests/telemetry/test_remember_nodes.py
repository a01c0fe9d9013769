"""remember_nodes: what a source keeps of nodes whose telemetry vanishes (exporter stopped)."""

from __future__ import annotations

from dataclasses import replace

from scheduler_plugin.model import GpuNode
from scheduler_plugin.telemetry.source import remember_nodes
from tests.fleet_helpers import gpu, node

NOW = 1_700_000_000.0


def test_a_node_without_a_time_does_not_replace_its_last_observation() -> None:
    """Right after an exporter stops, a source may still build the node from cached static signals alone (no live
    sample: no ``observed_at``). That must not replace the last observation, or the refresh after it, with nothing
    left of the node, forgets it at once instead of keeping it stale for ``forget_after_s``."""
    known: dict[str, GpuNode] = {}
    seen = replace(node("n1", [gpu(0)]), observed_at=NOW)
    assert [n.observed_at for n in remember_nodes(known, {"n1": seen}, NOW, 60)] == [NOW]
    partial = replace(node("n1", [gpu(0)]), observed_at=None)
    kept = remember_nodes(known, {"n1": partial}, NOW + 1, 60)
    assert kept == [seen]  # the last observation, with its time
    assert remember_nodes(known, {}, NOW + 2, 60) == [seen]  # vanished: still kept, stale
    assert remember_nodes(known, {"n1": partial}, NOW + 61, 60) == []  # past forget_after_s: forgotten
    assert remember_nodes(known, {"n1": partial}, NOW + 62, 60) == [partial]  # unknown again: taken as it is


def test_a_node_never_seen_with_a_time_is_taken_and_forgotten_as_before() -> None:
    known: dict[str, GpuNode] = {}
    partial = replace(node("n2", [gpu(0)]), observed_at=None)
    assert remember_nodes(known, {"n2": partial}, NOW, 60) == [partial]
    assert remember_nodes(known, {}, NOW + 1, 60) == []
