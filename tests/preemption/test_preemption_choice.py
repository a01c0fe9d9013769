"""Victim choice of GPU-aware preemption (scheduler_plugin/preemption): NVLink islands, pool shares, gangs, PDBs,
priorities, evictable false, checkpoints, and the bounded search beyond the exact one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler_plugin.model import GIB, GpuAssignment, GpuRequest
from scheduler_plugin.model.eviction import EvictionFacts
from scheduler_plugin.policies import Framework, PolicyConfig
from scheduler_plugin.preemption import Candidate, Choice, choose_victims
from scheduler_plugin.preemption.victims import gang_costs
from tests.fleet_helpers import NOW, dgx, fleet, gpu, node, request

HIGH = 1000
LOW = 10
ISLAND_A = (0, 1, 2, 3)
ISLAND_B = (4, 5, 6, 7)


def islands_node(name: str = "n1") -> object:
    """8 GPUs in two 4-GPU NVLink islands (0-3, 4-7), no link between the islands."""
    gpus = [
        gpu(i, switch=f"sw{i // 2}", numa=i // 4, nvlink=[j for j in (ISLAND_A if i < 4 else ISLAND_B) if j != i])
        for i in range(8)
    ]
    return node(name, gpus)


def pod_on(
    name: str,
    *gpus: int,
    priority: int = LOW,
    started_ago: float = 600.0,
    checkpoint_ago: float | None = None,
    evictable: bool = True,
    gang: str | None = None,
    milli: int | None = 1000,
    mem_gib: float | None = None,
) -> GpuAssignment:
    facts = EvictionFacts(
        evictable=evictable,
        gang=gang,
        started_at=NOW - started_ago,
        checkpoint_at=None if checkpoint_ago is None else NOW - checkpoint_ago,
    )
    return GpuAssignment(
        pod_key=f"default/{name}",
        gpu_indices=tuple(gpus),
        milli=milli,
        memory_bytes=None if mem_gib is None else int(mem_gib * GIB),
        pod_uid=f"uid-{name}",
        priority=priority,
        eviction=facts,
    )


def framework() -> Framework:
    return Framework.from_config(PolicyConfig())


def choose(
    assignments: list[GpuAssignment],
    req: GpuRequest,
    *,
    base: object | None = None,
    pdb: frozenset[str] = frozenset(),
    exact_max: int = 12,
) -> Choice | None:
    nd = replace(base if base is not None else islands_node(), assignments=tuple(assignments))  # type: ignore[type-var]
    f = fleet(nd)
    cands = [Candidate.of(a, NOW, pdb_violation=a.pod_key in pdb) for a in assignments]
    return choose_victims(framework(), f, 0, req, cands, NOW, gangs=gang_costs(assignments, NOW), exact_max=exact_max)


def high(count: int = 1, **kw: object) -> GpuRequest:
    return replace(request(count, pod="hi", uid="uid-hi", **kw), priority=HIGH)  # type: ignore[arg-type]


def gpus_of(choice: Choice) -> set[int]:
    return {g for c in choice.victims for g in c.assignment.gpu_indices}


def full_node(**per_gpu: dict[str, object]) -> list[GpuAssignment]:
    return [pod_on(f"p{i}", i, **per_gpu.get(str(i), {})) for i in range(8)]  # type: ignore[arg-type]


def test_nvlink_required_evicts_exactly_one_island() -> None:
    ch = choose(full_node(), high(4, topology="nvlink-required"))
    assert ch is not None and ch.exact
    assert len(ch.victims) == 4
    assert gpus_of(ch) in (set(ISLAND_A), set(ISLAND_B))
    assert ch.gpus is not None and set(ch.gpus) == gpus_of(ch)


def test_the_island_with_fresher_checkpoints_is_cheaper() -> None:
    cheap = {str(i): {"checkpoint_ago": 30.0} for i in ISLAND_B}
    ch = choose(full_node(**cheap), high(4, topology="nvlink-required"))
    assert ch is not None and gpus_of(ch) == set(ISLAND_B)
    # and the other way round: pods that started recently lose little too
    recent = {str(i): {"started_ago": 20.0} for i in ISLAND_A}
    ch = choose(full_node(**recent), high(4, topology="nvlink-required"))
    assert ch is not None and gpus_of(ch) == set(ISLAND_A)


def test_lowest_priority_pods_spread_over_both_islands_are_not_enough() -> None:
    """kube-scheduler would evict the four lowest-priority pods (GPUs 0, 2, 4, 6); kelvin evicts one island."""
    prio = {str(i): {"priority": 1 if i % 2 == 0 else 5} for i in range(8)}
    ch = choose(full_node(**prio), high(4, topology="nvlink-required"))
    assert ch is not None and gpus_of(ch) in (set(ISLAND_A), set(ISLAND_B))


def test_pdb_violations_count_before_progress() -> None:
    fresh_a = {str(i): {"checkpoint_ago": 5.0} for i in ISLAND_A}
    ch = choose(
        full_node(**fresh_a),
        high(4, topology="nvlink-required"),
        pdb=frozenset(f"default/p{i}" for i in ISLAND_A),
    )
    assert ch is not None and gpus_of(ch) == set(ISLAND_B) and ch.pdb_violations == 0
    ch = choose(full_node(), high(4, topology="nvlink-required"), pdb=frozenset(f"default/p{i}" for i in range(8)))
    assert ch is not None and ch.pdb_violations == 4


def test_never_a_pod_of_equal_or_higher_priority() -> None:
    ch = choose(full_node(**{"0": {"priority": HIGH}}), high(4, topology="nvlink-required"))
    assert ch is not None and gpus_of(ch) == set(ISLAND_B)
    assert all(c.priority < HIGH for c in ch.victims)
    both = full_node(**{"0": {"priority": HIGH}, "5": {"priority": HIGH + 1}})
    assert choose(both, high(4, topology="nvlink-required")) is None


def test_evictable_false_is_never_a_victim() -> None:
    ch = choose(full_node(**{"2": {"evictable": False}}), high(4, topology="nvlink-required"))
    assert ch is not None and gpus_of(ch) == set(ISLAND_B)
    assert (
        choose(full_node(**{"2": {"evictable": False}, "7": {"evictable": False}}), high(4, topology="nvlink-required"))
        is None
    )


def test_a_pool_share_needs_one_gpu_only() -> None:
    """GPU 0: two 30 GiB pools (20 GiB free); GPU 1: a 50 GiB pool (30 GiB free); GPUs 2-7 taken by higher-priority
    pods. A 40 GiB pool needs one eviction on one GPU; the pool that started most recently loses least."""
    pods = [
        pod_on("a", 0, milli=None, mem_gib=30, started_ago=900),
        pod_on("b", 0, milli=None, mem_gib=30, started_ago=60),
        pod_on("c", 1, milli=None, mem_gib=50, started_ago=600),
        *(pod_on(f"w{i}", i, priority=HIGH) for i in range(2, 8)),
    ]
    ch = choose(pods, high(1, memory="40Gi"))
    assert ch is not None
    assert [c.pod_key for c in ch.victims] == ["default/b"]
    assert ch.gpus == (0,)


def test_gang_members_go_together_and_cost_the_whole_gang() -> None:
    # g1 holds GPUs 0 and 1 here and has a third member elsewhere: evicting it stops 3 pods; two singles stop 2
    pods = [pod_on("g1-a", 0, gang="g1"), pod_on("g1-b", 1, gang="g1")]
    pods += [pod_on(f"s{i}", i) for i in range(2, 8)]
    elsewhere = pod_on("g1-c", 0, gang="g1")
    nd = replace(dgx("n1"), assignments=tuple(pods))
    cands = [Candidate.of(a, NOW) for a in pods]
    ch = choose_victims(framework(), fleet(nd), 0, high(2), cands, NOW, gangs=gang_costs([*pods, elsewhere], NOW))
    assert ch is not None and len(ch.victims) == 2 and not any(c.gang for c in ch.victims)
    # singles protected: the gang is evicted as one unit (both members, never one alone), even for one GPU
    pods = [pod_on("g1-a", 0, gang="g1"), pod_on("g1-b", 1, gang="g1")]
    pods += [pod_on(f"s{i}", i, priority=HIGH) for i in range(2, 8)]
    nd = replace(dgx("n1"), assignments=tuple(pods))
    cands = [Candidate.of(a, NOW) for a in pods]
    ch = choose_victims(framework(), fleet(nd), 0, high(1), cands, NOW, gangs=gang_costs([*pods, elsewhere], NOW))
    assert ch is not None
    assert sorted(c.pod_key for c in ch.victims) == ["default/g1-a", "default/g1-b"]
    assert ch.units[0].victims == 3


def test_a_gang_with_a_protected_member_elsewhere_is_protected() -> None:
    pods = [pod_on("g1-a", 0, gang="g1"), *(pod_on(f"s{i}", i, priority=HIGH) for i in range(1, 8))]
    elsewhere = pod_on("g1-c", 0, gang="g1", evictable=False)
    nd = replace(dgx("n1"), assignments=tuple(pods))
    cands = [Candidate.of(a, NOW) for a in pods]
    assert (
        choose_victims(framework(), fleet(nd), 0, high(1), cands, NOW, gangs=gang_costs([*pods, elsewhere], NOW))
        is None
    )


def test_fits_without_victims() -> None:
    ch = choose(full_node()[:4], high(4, topology="nvlink-required"))
    assert ch is not None and ch.units == () and ch.gpus is not None and set(ch.gpus) == set(ISLAND_B)


def test_no_set_frees_a_placement() -> None:
    # 8 GPUs, the pod asks 9: no eviction helps
    assert choose(full_node(), high(9)) is None
    # a model the node does not have
    assert choose(full_node(), high(1, models="H100")) is None


@pytest.mark.parametrize("exact_max", [12, 4])
def test_many_pool_shares_bounded_search(exact_max: int) -> None:
    """16 pool pods, two per GPU (each 40 GiB of 80): more units than the exact search takes at exact_max=4 (and at
    12). A whole GPU needs both pods of one GPU evicted; the search finds such a pair, the two cheapest pods."""
    pods = [
        pod_on(f"q{g}-{k}", g, milli=None, mem_gib=40, started_ago=100.0 + 50 * g + k) for g in range(8) for k in (0, 1)
    ]
    ch = choose(pods, high(1), base=dgx("n1"), exact_max=exact_max)
    assert ch is not None and not ch.exact
    assert len(ch.victims) == 2 and len(gpus_of(ch)) == 1
    assert gpus_of(ch) == {0}  # GPU 0's pods started last: they lose least


def test_the_set_frees_what_kube_schedulers_count_needs() -> None:
    """GPU 0: two 40 GiB pools; GPU 1: a whole-GPU pod that started 10 s ago (the least progress); GPUs 2-7 taken by
    higher-priority pods. For a 60 GiB pool, evicting the whole-GPU pod is enough for kelvin's filters, but it frees
    no shared-GPU slot: when kube-scheduler's own victims free one (its count of kelvin.dev/shared-gpu is full), the
    set must free one too, or the pod would not pass kube-scheduler's fit and it would preempt again."""
    pods = [
        pod_on("a", 0, milli=None, mem_gib=40, started_ago=600),
        pod_on("b", 0, milli=None, mem_gib=40, started_ago=900),
        pod_on("whole", 1, started_ago=10),
        *(pod_on(f"w{i}", i, priority=HIGH) for i in range(2, 8)),
    ]
    nd = replace(islands_node(), assignments=tuple(pods))  # type: ignore[type-var]
    cands = [Candidate.of(a, NOW) for a in pods]
    req = high(1, memory="60Gi")
    alone = choose_victims(framework(), fleet(nd), 0, req, cands, NOW)
    assert alone is not None and [c.pod_key for c in alone.victims] == ["default/whole"]
    ch = choose_victims(framework(), fleet(nd), 0, req, cands, NOW, must_free=(0, 1))
    assert ch is not None
    # the cheapest set freeing a slot: the whole-GPU pod and the pool with less progress (both pools cost more)
    assert sorted(c.pod_key for c in ch.victims) == ["default/a", "default/whole"]
    # nothing frees two whole GPUs by kube-scheduler's count here (the pools hold slots, not nvidia.com/gpu)
    assert choose_victims(framework(), fleet(nd), 0, req, cands, NOW, must_free=(2, 0)) is None
