"""Who is a gang: kelvin's annotations, JobSet, LeaderWorkerSet and Indexed Job pods; bad input names the field."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.gang import GangError, GangPolicy, TopologyAsk, read_gang
from scheduler_plugin.gang.levels import TopologyLevel
from scheduler_plugin.gang.readers import READERS, size_of_job
from scheduler_plugin.model import annotations as ann

POLICY = GangPolicy(levels=(TopologyLevel(name="rack", label="kelvin.dev/rack"),))


def pod(annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None, ns: str = "ml") -> Any:
    return {"metadata": {"name": "p", "namespace": ns, "annotations": annotations or {}, "labels": labels or {}}}


def test_kelvin_annotations_make_a_gang_with_its_size_rank_and_topology() -> None:
    ref = read_gang(
        pod({ann.GANG: "llama", ann.GANG_SIZE: "4", ann.GANG_INDEX: "2", ann.GANG_TOPOLOGY: "required=rack"}), POLICY
    )
    assert ref is not None
    assert (ref.key, ref.kind, ref.size, ref.index) == ("ml/kelvin:llama", "kelvin", 4, 2)
    assert ref.topology == TopologyAsk("rack", required=True)


def test_a_pod_without_gang_labels_is_not_a_gang() -> None:
    assert read_gang(pod(labels={"app": "web"}), POLICY) is None
    # a NonIndexed Job's pods are interchangeable
    assert read_gang(pod(labels={"batch.kubernetes.io/job-name": "j"}), POLICY) is None


def test_jobset_pods_are_one_gang_per_restart_attempt_ranked_by_global_index() -> None:
    labels = {
        "jobset.sigs.k8s.io/jobset-name": "train",
        "jobset.sigs.k8s.io/global-replicas": "4",
        "jobset.sigs.k8s.io/job-global-index": "3",
        "jobset.sigs.k8s.io/restart-attempt": "1",
        "batch.kubernetes.io/job-completion-index": "0",
    }
    ref = read_gang(pod(labels=labels), POLICY)
    assert ref is not None and ref.kind == "jobset" and ref.size == 4 and ref.key == "ml/jobset:train@1"
    other = read_gang(pod(labels={**labels, "jobset.sigs.k8s.io/job-global-index": "1"}), POLICY)
    assert other is not None and other.key == ref.key and other.index is not None and ref.index is not None
    assert other.index < ref.index


def test_leaderworkerset_group_is_one_gang_leader_first() -> None:
    labels = {"leaderworkerset.sigs.k8s.io/name": "vllm", "leaderworkerset.sigs.k8s.io/group-index": "2"}
    leader = read_gang(
        pod({"leaderworkerset.sigs.k8s.io/size": "3"}, {**labels, "leaderworkerset.sigs.k8s.io/worker-index": "0"}),
        POLICY,
    )
    worker = read_gang(
        pod({"leaderworkerset.sigs.k8s.io/size": "3"}, {**labels, "leaderworkerset.sigs.k8s.io/worker-index": "2"}),
        POLICY,
    )
    assert leader is not None and worker is not None
    assert leader.key == worker.key == "ml/leaderworkerset:vllm-2" and leader.size == 3
    assert (leader.index, worker.index) == (0, 2)


def test_indexed_job_size_comes_from_its_parallelism() -> None:
    ref = read_gang(
        pod({"batch.kubernetes.io/job-completion-index": "1"}, {"batch.kubernetes.io/job-name": "j"}), POLICY
    )
    assert ref is not None and ref.kind == "indexed-job" and ref.size is None and ref.index == 1
    assert size_of_job({"spec": {"parallelism": 4, "completions": 8}}) == 4
    assert size_of_job({"spec": {"parallelism": 4, "completions": 2}}) == 2
    assert size_of_job({"spec": {"parallelism": 0}}) is None


def test_kelvin_annotations_win_over_a_jobset() -> None:
    ref = read_gang(pod({ann.GANG: "g", ann.GANG_SIZE: "2"}, {"jobset.sigs.k8s.io/jobset-name": "t"}), POLICY)
    assert ref is not None and ref.kind == "kelvin" and ref.size == 2


def test_members_of_a_name_in_two_namespaces_are_two_gangs() -> None:
    a = read_gang(pod({ann.GANG: "g", ann.GANG_SIZE: "2"}, ns="a"), POLICY)
    b = read_gang(pod({ann.GANG: "g", ann.GANG_SIZE: "2"}, ns="b"), POLICY)
    assert a is not None and b is not None and a.key != b.key


def test_the_reader_registry_is_pluggable() -> None:
    def workload(ns: str, labels: Any, annots: Any) -> tuple[str, str, int | None] | None:
        name = labels.get("example.dev/workload")
        return None if name is None else ("workload", name, 5)

    ref = read_gang(pod(labels={"example.dev/workload": "w"}), POLICY, {"workload": workload, **READERS})
    assert ref is not None and ref.kind == "workload" and ref.size == 5


@pytest.mark.parametrize(
    ("annotations", "field", "words"),
    [
        ({ann.GANG: "g", ann.GANG_SIZE: "zero"}, ann.GANG_SIZE, "integer from 1"),
        ({ann.GANG: "g", ann.GANG_SIZE: "0"}, ann.GANG_SIZE, "integer from 1"),
        ({ann.GANG: "g", ann.GANG_SIZE: "-3"}, ann.GANG_SIZE, "integer from 1"),
        ({ann.GANG: "g"}, ann.GANG, ann.GANG_SIZE),
        ({ann.GANG_SIZE: "4"}, ann.GANG_SIZE, ann.GANG),
        ({ann.GANG: "g", ann.GANG_SIZE: "4", ann.GANG_TOPOLOGY: "required=row"}, ann.GANG_TOPOLOGY, "node, rack"),
        ({ann.GANG: "g", ann.GANG_SIZE: "4", ann.GANG_TOPOLOGY: "rack"}, ann.GANG_TOPOLOGY, "required=<level>"),
        ({ann.GANG_TOPOLOGY: "preferred=rack"}, ann.GANG_TOPOLOGY, ann.GANG),
    ],
)
def test_bad_gang_annotations_name_the_annotation_and_the_fix(
    annotations: dict[str, str], field: str, words: str
) -> None:
    with pytest.raises(GangError) as exc:
        read_gang(pod(annotations), POLICY)
    assert exc.value.field == field
    assert words in str(exc.value)
