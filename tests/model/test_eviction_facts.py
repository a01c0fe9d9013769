"""What preemption reads of a pod (model/eviction.py), and that the listing of assignments carries it."""

from __future__ import annotations

from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.eviction import EvictionFacts, eviction_facts
from scheduler_plugin.model.times import parse_time
from scheduler_plugin.telemetry.assignments import assignment_of_pod


def bound(annotations: dict[str, str], status: dict[str, object] | None = None) -> dict[str, object]:
    return {
        "metadata": {
            "name": "w",
            "namespace": "low",
            "uid": "uid-w",
            "annotations": {ann.GPU_ASSIGNED: "0,1", ann.GPU_ASSIGNED_NODE: "n1", **annotations},
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
        "status": status or {"phase": "Running"},
    }


def test_facts_from_annotations() -> None:
    f = eviction_facts(
        bound(
            {
                ann.EVICTABLE: "False",
                ann.GANG: " train-7 ",
                ann.GPU_ASSIGNED_AT: "2026-12-01T04:00:00.5Z",
                ann.CHECKPOINT_DONE: "2026-12-01T05:00:00Z",
            }
        )
    )
    assert f == EvictionFacts(
        evictable=False,
        gang="train-7",
        started_at=parse_time("2026-12-01T04:00:00.5Z"),
        checkpoint_at=parse_time("2026-12-01T05:00:00Z"),
    )
    assert f.progress_since() == f.checkpoint_at


def test_defaults_and_bad_values_count_as_absent() -> None:
    f = eviction_facts(bound({ann.CHECKPOINT_DONE: "yesterday", ann.GANG: " "}, {"startTime": "2026-12-01T03:00:00Z"}))
    assert f.evictable and f.gang is None and f.checkpoint_at is None
    assert f.progress_since() == parse_time("2026-12-01T03:00:00Z")  # no bind time: the pod's start
    # a checkpoint older than the start does not count
    old = EvictionFacts(started_at=100.0, checkpoint_at=50.0)
    assert old.progress_since() == 100.0
    assert EvictionFacts().progress_since() is None


def test_the_listing_carries_the_facts() -> None:
    got = assignment_of_pod(bound({ann.GANG: "g", ann.EVICTABLE: "false"}))
    assert got is not None
    node, a = got
    assert node == "n1" and a.gpu_indices == (0, 1)
    assert a.eviction is not None and a.eviction.gang == "g" and not a.eviction.evictable


def test_labels_are_read_for_pod_disruption_budgets() -> None:
    pod = {"metadata": {"labels": {"app": "train", "tier": "spot", "bad": 3}}}
    f = eviction_facts(pod)
    assert f.labels == (("app", "train"), ("tier", "spot"))  # sorted; a value that is not a string is left out
    assert f.label_map == {"app": "train", "tier": "spot"}
    assert eviction_facts({"metadata": {}}).labels == ()
