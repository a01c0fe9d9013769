"""Preemption through the real kube-scheduler: a node of two 4-GPU NVLink islands (``fleet.ISLANDS_NODE``: GPUs 0-3
and 4-7) full of low-priority 1-GPU pods, then a high-priority 4-GPU ``kelvin.dev/topology: nvlink-required`` pod
pinned there.

The node is filled so that kube-scheduler's own (count-based) victims are known in advance: it evicts the pods that
started last (after priority, its rule is the reverse start order), and the four pods that started last hold GPUs 0,
1, 4 and 5, two on each island. With kelvin's preempt verb (the chart's default), kube-scheduler evicts the pods of
one island instead and the preemptor binds there; with the verb removed (a second kube-scheduler on the same
extender), kube-scheduler evicts those four and the preemptor still does not fit: four evictions for nothing.

Then what kelvin weighs beyond the islands, on the same full node (issue 18): island B's pods checkpointed just now,
so that, all else equal, kelvin would evict them; a PodDisruptionBudget with no disruption left over island B's
pods (kelvin lists it itself: kube-scheduler only counts its own victims, two on each island), or one of island B's
pods a member of a gang whose other member runs on another node (evicting it stops both): kelvin evicts island A.

Memory pools on the same node (its fake kubelet advertises ``kelvin.dev/shared-gpu`` slots,
``fleet.ISLANDS_SHARED_SLOTS``): two 30 GiB pools a GPU taking the node's CPUs, a high-priority 60 GiB pool that needs
two pools' CPUs. kube-scheduler's count evicts the two pools started last, on two GPUs (neither then has 60 GiB free);
kelvin evicts the two pools of one GPU and the preemptor binds there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from scheduler_plugin.extender.pdb_lister import REFRESH_S as PDB_REFRESH_S
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.times import format_time
from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster
from tests.e2e.fleet import GPU_NODES, GPUS_PER_NODE, ISLANDS, ISLANDS_NODE, ISLANDS_SHARED_SLOTS, ISLANDS_TAINT
from tests.e2e.kelvin_scheduler import SCHEDULER_NAME, KelvinScheduler, start_count_preemption
from tests.e2e.pods import assigned, gpu_pod

LOW, HIGH = "kelvin-e2e-low", "kelvin-e2e-high"
COUNT_SCHEDULER = "kelvin-count-preemption"
ISLAND_SIZE = GPUS_PER_NODE // ISLANDS
#: the GPUs of the four pods started last: kube-scheduler's count-based victims, two on each island
LATE_GPUS = (0, 1, 4, 5)


def island(gpu: int) -> int:
    return gpu // ISLAND_SIZE


@pytest.fixture(scope="module")
def priority_classes(cluster: LoopbackCluster) -> Iterator[None]:
    for name, value in ((LOW, 1000), (HIGH, 1_000_000)):
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
            "preemptionPolicy": "PreemptLowerPriority",
            "description": "kelvin e2e preemption scenario",
        }
        cluster.api.call("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", json=body, ok=(201, 409))
    yield
    for name in (LOW, HIGH):
        cluster.api.call("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}", ok=(200, 202, 404))


def _pods_on_node(cluster: LoopbackCluster) -> list[dict[str, Any]]:
    return list(cluster.api.get("/api/v1/pods", fieldSelector=f"spec.nodeName={ISLANDS_NODE}")["items"])


@pytest.fixture
def islands_node(cluster: LoopbackCluster, priority_classes: None, namespace: str) -> Iterator[str]:
    """The islands node with none of this scenario's pods on it, before and after the test."""
    wait_for(f"{ISLANDS_NODE} empty", lambda: not _pods_on_node(cluster) or None, 60)
    yield ISLANDS_NODE
    for p in cluster.api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        cluster.api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{p['metadata']['name']}", ok=(200, 202, 404))
    wait_for(f"{ISLANDS_NODE} empty after the test", lambda: not _pods_on_node(cluster) or None, 60)


def islands_pod(name: str, gpus: int, priority_class: str, scheduler: str, annotations: dict[str, str] | None = None
                ) -> dict[str, Any]:  # fmt: skip
    pod = gpu_pod(name, gpus, annotations)
    spec = pod["spec"]
    spec["schedulerName"] = scheduler
    spec["priorityClassName"] = priority_class
    spec["nodeSelector"] = {"kubernetes.io/hostname": ISLANDS_NODE}
    spec["tolerations"] = [{**ISLANDS_TAINT, "operator": "Equal"}]
    return pod


class Scenario:
    def __init__(self, cluster: LoopbackCluster, namespace: str, scheduler: str, alive: Callable[[], None],
                 ks: KelvinScheduler) -> None:  # fmt: skip
        self.cluster, self.namespace, self.scheduler, self.alive, self.ks = cluster, namespace, scheduler, alive, ks
        self.path = f"/api/v1/namespaces/{namespace}/pods"

    def pod(self, name: str) -> dict[str, Any] | None:
        found = self.cluster.api.get_or_none(f"{self.path}/{name}")
        return dict(found) if found is not None else None

    def running(self, name: str) -> dict[str, Any]:
        """The pod once bound, Running, with its start time (kube-scheduler orders victims by it)."""

        def probe() -> dict[str, Any] | None:
            self.alive()
            p = self.pod(name)
            if p is None or not p["spec"].get("nodeName") or p["status"].get("phase") != "Running":
                return None
            return p if p["status"].get("startTime") else None

        return wait_for(f"pod {self.namespace}/{name} running", probe, 90, 0.5)

    def kelvin_fits(self, gpus: int) -> None:
        """Until kelvin's snapshot has room for ``gpus`` on the node (its pod listing caught up with deletions)."""
        probe = islands_pod("probe", gpus, LOW, self.scheduler)
        wait_for(f"kelvin: {gpus} GPU(s) free on {ISLANDS_NODE}",
                 lambda: self.ks.explain(probe, ISLANDS_NODE)["fits"] or None, 60, 0.5)  # fmt: skip

    def fill(self) -> tuple[dict[int, str], set[str]]:
        """Eight low-priority 1-GPU pods on GPUs 0-7, those on :data:`LATE_GPUS` started last. Returns GPU -> pod
        name and the late pods' names."""
        for i in range(GPUS_PER_NODE):
            self.kelvin_fits(1)
            self.cluster.api.create(self.path, islands_pod(f"low-{i}", 1, LOW, self.scheduler))
            self.running(f"low-{i}")
        first = {assigned(self.running(f"low-{i}"))[0]: f"low-{i}" for i in range(GPUS_PER_NODE)}
        assert sorted(first) == list(range(GPUS_PER_NODE)), first
        for gpu in LATE_GPUS:
            self.cluster.api.delete(f"{self.path}/{first.pop(gpu)}")
        gone = {f"low-{i}" for i in range(GPUS_PER_NODE)} - set(first.values())
        wait_for("replaced pods gone", lambda: all(self.pod(n) is None for n in gone) or None, 60, 0.5)
        time.sleep(1.1)  # start times have a resolution of one second: the late pods start strictly later
        late: list[str] = []
        for j in range(len(LATE_GPUS)):
            self.kelvin_fits(1)
            self.cluster.api.create(self.path, islands_pod(f"late-{j}", 1, LOW, self.scheduler))
            self.running(f"late-{j}")
            late.append(f"late-{j}")
        by_gpu = dict(first)
        for name in late:
            (gpu,) = assigned(self.running(name))
            assert gpu not in by_gpu, (gpu, by_gpu)
            by_gpu[gpu] = name
        assert sorted(by_gpu) == list(range(GPUS_PER_NODE)), by_gpu
        assert {g for g, n in by_gpu.items() if n in late} == set(LATE_GPUS), by_gpu
        started = {n: self.running(n)["status"]["startTime"] for n in by_gpu.values()}
        assert min(started[n] for n in late) > max(t for n, t in started.items() if n not in late), started
        return by_gpu, set(late)

    def create_preemptor(self) -> None:
        body = islands_pod("high", 4, HIGH, self.scheduler, {"kelvin.dev/topology": "nvlink-required"})
        self.cluster.api.create(self.path, body)

    def mark(self, name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> None:
        meta: dict[str, Any] = {}
        if labels:
            meta["labels"] = labels
        if annotations:
            meta["annotations"] = annotations
        self.cluster.api.merge_patch(f"{self.path}/{name}", {"metadata": meta})

    def checkpoint_island_b(self, by_gpu: dict[int, str]) -> None:
        """Island B's pods saved a checkpoint just now: the cheaper island to evict, all else equal."""
        now = format_time(time.time())
        for gpu, name in by_gpu.items():
            if island(gpu) == 1:
                self.mark(name, annotations={ann.CHECKPOINT_DONE: now})

    def deleted(self, by_gpu: dict[int, str]) -> dict[int, str]:
        """GPU -> name of the fill pods that are gone or being deleted."""
        out = {}
        for gpu, name in by_gpu.items():
            p = self.pod(name)
            if p is None or p["metadata"].get("deletionTimestamp"):
                out[gpu] = name
        return out


def test_preempt_verb_evicts_one_island_and_the_preemptor_binds_there(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, namespace: str, islands_node: str
) -> None:
    s = Scenario(cluster, namespace, SCHEDULER_NAME, kelvin_scheduler.check_alive, kelvin_scheduler)
    by_gpu, late = s.fill()
    s.create_preemptor()
    placed = s.running("high")
    assert placed["spec"]["nodeName"] == ISLANDS_NODE
    gpus = assigned(placed)
    (freed,) = {island(g) for g in gpus}
    assert sorted(gpus) == [g for g in range(GPUS_PER_NODE) if island(g) == freed], gpus
    victims = s.deleted(by_gpu)
    # only the pods of that island were evicted (kube-scheduler's own choice, the late pods, spans both islands)
    assert sorted(victims) == sorted(gpus), (victims, by_gpu)
    assert set(victims.values()) != late
    survivors = {g: n for g, n in by_gpu.items() if g not in victims}
    for name in survivors.values():
        p = s.pod(name)
        assert p is not None and not p["metadata"].get("deletionTimestamp"), name


def test_count_based_preemption_evicts_across_islands_and_the_preemptor_still_waits(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, namespace: str, islands_node: str
) -> None:
    """The comparison run: kube-scheduler with the installed configuration minus ``preemptVerb`` (as
    ``scheduler.extender.preempt: false``), on the same extender (filter, prioritize, bind)."""
    second = start_count_preemption(cluster, kelvin_scheduler, COUNT_SCHEDULER)
    try:

        def alive() -> None:
            kelvin_scheduler.check_alive()
            second.check_alive()

        s = Scenario(cluster, namespace, COUNT_SCHEDULER, alive, kelvin_scheduler)
        by_gpu, late = s.fill()
        s.create_preemptor()
        victims = wait_for("count-based victims deleted", lambda: s.deleted(by_gpu) or None, 90, 0.5)
        # kube-scheduler evicts, by count, the pods that started last: two on each island
        wait_for("four victims", lambda: len(s.deleted(by_gpu)) >= len(LATE_GPUS) or None, 30, 0.5)
        victims = s.deleted(by_gpu)
        assert set(victims.values()) == late and sorted(victims) == list(LATE_GPUS), victims
        assert {island(g) for g in victims} == set(range(ISLANDS))
        # four GPUs free, no NVLink island among them: kelvin's filter refuses the node and kube-scheduler finds no
        # more victims (the count fits without any): the preemptor waits, the four evictions were for nothing
        s.kelvin_fits(1)
        verdict = kelvin_scheduler.explain(
            islands_pod("high", 4, HIGH, COUNT_SCHEDULER, {"kelvin.dev/topology": "nvlink-required"}), ISLANDS_NODE
        )
        assert verdict["fits"] is False, verdict
        time.sleep(15)  # kube-scheduler retried the pod on the deletions meanwhile
        alive()
        high = s.pod("high")
        assert high is not None and not high["spec"].get("nodeName"), high
        scheduled = [c for c in high["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        assert scheduled and scheduled[0]["status"] == "False", scheduled
        assert len(s.deleted(by_gpu)) == len(LATE_GPUS), s.deleted(by_gpu)
    finally:
        second.stop()


#: kelvin's records of the pods (its pod listing, every ``refreshIntervalSeconds``) and its list of budgets
#: (every ``pdb_lister.REFRESH_S``) have caught up with the labels, annotations and budgets written, with margin.
CAUGHT_UP_S = PDB_REFRESH_S + 5 + 3


def _preempted_island(s: Scenario, by_gpu: dict[int, str]) -> int:
    placed = s.running("high")
    assert placed["spec"]["nodeName"] == ISLANDS_NODE
    gpus = assigned(placed)
    (freed,) = {island(g) for g in gpus}
    victims = s.deleted(by_gpu)
    assert sorted(victims) == sorted(gpus), (victims, by_gpu)
    return freed


def test_a_budget_kelvin_lists_protects_the_cheaper_island(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, namespace: str, islands_node: str
) -> None:
    s = Scenario(cluster, namespace, SCHEDULER_NAME, kelvin_scheduler.check_alive, kelvin_scheduler)
    by_gpu, _late = s.fill()
    s.checkpoint_island_b(by_gpu)
    for gpu, name in by_gpu.items():
        s.mark(name, labels={"app": "serving" if island(gpu) == 1 else "batch"})
    body = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "serving"},
        "spec": {"minAvailable": ISLAND_SIZE, "selector": {"matchLabels": {"app": "serving"}}},
    }
    path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
    cluster.api.create(path, body)
    try:
        time.sleep(CAUGHT_UP_S)
        s.create_preemptor()
        # kube-scheduler's victims (the late pods) are two per island, so its count says 2 violations on the node
        # whichever island: only kelvin's own list tells island B's pods are the protected ones
        assert _preempted_island(s, by_gpu) == 0
    finally:
        cluster.api.call("DELETE", f"{path}/serving", ok=(200, 202, 404))


def test_a_gang_member_costs_its_whole_gang(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, namespace: str, islands_node: str
) -> None:
    s = Scenario(cluster, namespace, SCHEDULER_NAME, kelvin_scheduler.check_alive, kelvin_scheduler)
    by_gpu, _late = s.fill()
    s.checkpoint_island_b(by_gpu)
    # the gang's other member runs on a node of the shared fleet
    far = gpu_pod("gang-far", 1, {ann.GANG: "spot-job"})
    far["spec"]["priorityClassName"] = LOW
    far["spec"]["nodeSelector"] = {"kubernetes.io/hostname": GPU_NODES[0]}
    cluster.api.create(s.path, far)
    s.running("gang-far")
    s.mark(by_gpu[ISLAND_SIZE], annotations={ann.GANG: "spot-job"})  # the first GPU of island B
    time.sleep(CAUGHT_UP_S)
    s.create_preemptor()
    # island B would stop five pods (its four and the gang's member elsewhere), island A four
    assert _preempted_island(s, by_gpu) == 0
    p = s.pod("gang-far")
    assert p is not None and not p["metadata"].get("deletionTimestamp"), p


# ---- memory-pool shares (issue 18): the preemptor needs one GPU's memory, kube-scheduler counts pods ----------------

#: the fill: two 30 GiB pools on each GPU (80 GB boards: a third does not fit), 8 CPUs each, so that the sixteen pods
#: take the node's 128 CPUs (the fake node's capacity) and kube-scheduler's count must free CPUs for the preemptor
POOL_GI, POOL_CPU = 30, 8
POOLS_PER_GPU = 2
#: the preemptor: a 60 GiB pool (more than one GPU keeps free beside a 30 GiB pool) asking 16 CPUs, two fill pods' worth
PREEMPTOR_GI, PREEMPTOR_CPU = 60, 2 * POOL_CPU
#: the GPUs of the two pools started last: kube-scheduler's count-based victims, one pool on each of two GPUs
LATE_POOL_GPUS = (0, ISLAND_SIZE)


def pool_pod(name: str, memory_gi: int, cpu: int, priority_class: str, scheduler: str) -> dict[str, Any]:
    """A memory-pool pod as a pool asks (docs/annotations.md): one ``kelvin.dev/shared-gpu`` slot, its pool in
    ``kelvin.dev/gpu-memory``; and CPUs."""
    pod = islands_pod(name, 1, priority_class, scheduler, {ann.GPU_MEMORY: f"{memory_gi}Gi"})
    pod["spec"]["containers"][0]["resources"] = {"limits": {ann.SHARED_GPU_RESOURCE: "1", "cpu": str(cpu)}}
    return pod


class PoolScenario(Scenario):
    def kelvin_fits_pool(self, memory_gi: int) -> None:
        """Until kelvin's snapshot has a GPU with ``memory_gi`` free on the node."""
        probe = pool_pod("probe", memory_gi, POOL_CPU, LOW, self.scheduler)
        wait_for(f"kelvin: a {memory_gi} GiB pool fits on {ISLANDS_NODE}",
                 lambda: self.ks.explain(probe, ISLANDS_NODE)["fits"] or None, 60, 0.5)  # fmt: skip

    def create_pool(self, name: str) -> int:
        self.kelvin_fits_pool(POOL_GI)
        self.cluster.api.create(self.path, pool_pod(name, POOL_GI, POOL_CPU, LOW, self.scheduler))
        (gpu,) = assigned(self.running(name))
        return gpu

    def fill_pools(self) -> tuple[dict[str, int], set[str]]:
        """Two 30 GiB pools on each GPU, the two on :data:`LATE_POOL_GPUS` (one each) started last. Returns pod name ->
        GPU and the late pods' names."""
        first = {f"pool-{i}": self.create_pool(f"pool-{i}") for i in range(POOLS_PER_GPU * GPUS_PER_NODE)}
        assert sorted(first.values()) == sorted(list(range(GPUS_PER_NODE)) * POOLS_PER_GPU), first
        gone = [min(n for n, g in first.items() if g == gpu) for gpu in LATE_POOL_GPUS]
        for name in gone:
            self.cluster.api.delete(f"{self.path}/{name}")
            del first[name]
        wait_for("replaced pools gone", lambda: all(self.pod(n) is None for n in gone) or None, 60, 0.5)
        time.sleep(1.1)  # start times have a resolution of one second: the late pods start strictly later
        late = {f"late-{j}": self.create_pool(f"late-{j}") for j in range(len(LATE_POOL_GPUS))}
        # the only room left was one pool on each of those GPUs
        assert sorted(late.values()) == sorted(LATE_POOL_GPUS), late
        by_pod = {**first, **late}
        started = {n: self.running(n)["status"]["startTime"] for n in by_pod}
        assert min(started[n] for n in late) > max(t for n, t in started.items() if n not in late), started
        return by_pod, set(late)

    def create_pool_preemptor(self) -> dict[str, Any]:
        body = pool_pod("high", PREEMPTOR_GI, PREEMPTOR_CPU, HIGH, self.scheduler)
        self.cluster.api.create(self.path, body)
        return body

    def deleted_pods(self, by_pod: dict[str, int]) -> dict[str, int]:
        """Name -> GPU of the fill pods that are gone or being deleted."""
        out = {}
        for name, gpu in by_pod.items():
            p = self.pod(name)
            if p is None or p["metadata"].get("deletionTimestamp"):
                out[name] = gpu
        return out


def test_preempt_verb_frees_one_gpu_for_a_memory_pool(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, namespace: str, islands_node: str
) -> None:
    """kube-scheduler's count would evict the two pools started last, on two GPUs; kelvin evicts the two pools of one
    GPU and the 60 GiB pool binds there."""
    # the islands node alone advertises slots (the shared nodes as before: no kelvin.dev/shared-gpu)
    for name in (ISLANDS_NODE, *GPU_NODES):
        allocatable = cluster.api.get(f"/api/v1/nodes/{name}")["status"]["allocatable"]
        expected = str(ISLANDS_SHARED_SLOTS) if name == ISLANDS_NODE else None
        assert allocatable.get(ann.SHARED_GPU_RESOURCE) == expected, (name, allocatable)
    s = PoolScenario(cluster, namespace, SCHEDULER_NAME, kelvin_scheduler.check_alive, kelvin_scheduler)
    by_pod, late = s.fill_pools()
    s.create_pool_preemptor()
    placed = s.running("high")
    assert placed["spec"]["nodeName"] == ISLANDS_NODE
    (gpu,) = assigned(placed)
    victims = s.deleted_pods(by_pod)
    # exactly the pools of the GPU the preemptor got (kube-scheduler's own choice, the late pools, spans two GPUs)
    assert sorted(victims) == sorted(n for n, g in by_pod.items() if g == gpu), (gpu, victims, by_pod)
    assert set(victims) != late
    for name in set(by_pod) - set(victims):
        p = s.pod(name)
        assert p is not None and not p["metadata"].get("deletionTimestamp"), name


def test_count_based_preemption_evicts_pools_on_two_gpus_and_the_pool_still_waits(
    cluster: LoopbackCluster, kelvin_scheduler: KelvinScheduler, namespace: str, islands_node: str
) -> None:
    """The comparison run, as for the islands: kube-scheduler without ``preemptVerb`` frees the CPUs by evicting the
    two pools that started last, one on each of two GPUs: neither GPU has 60 GiB free afterwards."""
    second = start_count_preemption(cluster, kelvin_scheduler, COUNT_SCHEDULER)
    try:

        def alive() -> None:
            kelvin_scheduler.check_alive()
            second.check_alive()

        s = PoolScenario(cluster, namespace, COUNT_SCHEDULER, alive, kelvin_scheduler)
        by_pod, late = s.fill_pools()
        body = s.create_pool_preemptor()
        wait_for("two victims", lambda: len(s.deleted_pods(by_pod)) >= len(late) or None, 90, 0.5)
        victims = s.deleted_pods(by_pod)
        assert set(victims) == late and sorted(victims.values()) == sorted(LATE_POOL_GPUS), victims
        # a 30 GiB pool free on each of two GPUs, 60 GiB on none: kelvin's filter refuses the node, and kube-scheduler
        # finds no further victims (its count of CPUs and slots fits without any): two evictions for nothing
        s.kelvin_fits_pool(POOL_GI)
        verdict = kelvin_scheduler.explain(body, ISLANDS_NODE)
        assert verdict["fits"] is False, verdict
        time.sleep(15)  # kube-scheduler retried the pod on the deletions meanwhile
        alive()
        high = s.pod("high")
        assert high is not None and not high["spec"].get("nodeName"), high
        scheduled = [c for c in high["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        assert scheduled and scheduled[0]["status"] == "False", scheduled
        assert s.deleted_pods(by_pod) == victims, s.deleted_pods(by_pod)
    finally:
        second.stop()
