"""The preempt verb over HTTP: kube-scheduler's ExtenderPreemptionArgs in both modes (NodeNameToMetaVictims with
nodeCacheCapable true, NodeNameToVictims with full Pod objects), answered with NodeNameToMetaVictims; malformed
bodies are 400s naming the field; unknown nodes and victims are reported and left out."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from ext_helpers import Clock, args, gpu_node, make_extender, pod
from fastapi.testclient import TestClient

from scheduler_plugin.extender.app import create_app
from scheduler_plugin.extender.service import Extender
from scheduler_plugin.model import GpuAssignment, GpuNode
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.eviction import EvictionFacts
from scheduler_plugin.model.times import format_time

T0 = Clock().t
ISLAND_A = frozenset(range(4))
ISLAND_B = frozenset(range(4, 8))


def islands(name: str = "gpu-islands", priorities: dict[int, int] | None = None) -> GpuNode:
    """8 x H100 in two 4-GPU NVLink islands, every GPU held by a 1-GPU pod (priority 10 by default)."""
    base = gpu_node(name)
    gpus = tuple(
        replace(g, nvlink_peers=frozenset(j for j in (ISLAND_A if g.index < 4 else ISLAND_B) if j != g.index))
        for g in base.gpus
    )
    gpus = tuple(replace(g, memory_used_bytes=60 * 2**30) for g in gpus)
    prio = priorities or {}
    assignments = tuple(
        GpuAssignment(
            pod_key=f"low/w{i}",
            gpu_indices=(i,),
            pod_uid=f"uid-w{i}",
            priority=prio.get(i, 10),
            eviction=EvictionFacts(started_at=T0 - 600),
        )
        for i in range(8)
    )
    return replace(base, gpus=gpus, assignments=assignments)


def preemptor(**annotations: str) -> dict[str, Any]:
    p = pod("hi", gpus=4, annotations={ann.TOPOLOGY: "nvlink-required", **annotations})
    p["spec"]["priority"] = 1000
    return p


def meta_args(p: dict[str, Any], victims: dict[str, list[str]], pdb: int = 0) -> bytes:
    return json.dumps(
        {
            "Pod": p,
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {
                n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb} for n, uids in victims.items()
            },
        }
    ).encode()


@pytest.fixture
def ext() -> Extender:
    prio = {i: 1 if i % 2 == 0 else 5 for i in range(8)}  # count-based would evict GPUs 0, 2, 4, 6 first
    return make_extender([islands(priorities=prio), gpu_node("gpu-node-2")])[0]


@pytest.fixture
def client(ext: Extender) -> Iterator[TestClient]:
    with TestClient(create_app(ext)) as c:
        yield c


def victim_gpus(reply: dict[str, Any], node: str = "gpu-islands") -> set[int]:
    uids = [p["UID"] for p in reply["NodeNameToMetaVictims"][node]["Pods"]]
    return {int(u.removeprefix("uid-w")) for u in uids}


@pytest.mark.parametrize("path", ["/preempt", "/scheduler/preempt"])
def test_meta_victims_one_island_instead_of_the_lowest_priorities(client: TestClient, path: str) -> None:
    body = meta_args(preemptor(), {"gpu-islands": ["uid-w0", "uid-w2", "uid-w4", "uid-w6"]})
    r = client.post(path, content=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert set(out) == {"NodeNameToMetaVictims"}
    assert victim_gpus(out) in (set(ISLAND_A), set(ISLAND_B))
    assert out["NodeNameToMetaVictims"]["gpu-islands"]["NumPDBViolations"] == 0


def test_nodes_without_a_feasible_set_are_dropped(ext: Extender, client: TestClient) -> None:
    # a victim of higher priority than the preemptor on each island: no island can be freed
    ext.source.nodes = [islands(priorities={0: 2000, 5: 2000}), gpu_node("gpu-node-2")]  # type: ignore[attr-defined]
    client.portal.call(ext.cache.refresh_once)  # type: ignore[union-attr]
    r = client.post(
        "/preempt", content=meta_args(preemptor(), {"gpu-islands": ["uid-w1", "uid-w2", "uid-w3", "uid-w4"]})
    )
    assert r.status_code == 200
    assert r.json() == {"NodeNameToMetaVictims": {}}


def test_unknown_node_and_uid_are_reported_and_left_out(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    body = meta_args(preemptor(), {"nowhere": ["uid-x"], "gpu-islands": ["uid-w0", "uid-ghost"]})
    with caplog.at_level(logging.INFO, logger="scheduler_plugin.extender.preempt"):
        r = client.post("/preempt", content=body)
    assert r.status_code == 200
    out = r.json()["NodeNameToMetaVictims"]
    assert set(out) == {"gpu-islands"}
    assert "uid-ghost" not in {p["UID"] for p in out["gpu-islands"]["Pods"]}
    assert "node nowhere is not in kelvin's snapshot" in caplog.text
    assert "uid uid-ghost" in caplog.text and "left out" in caplog.text
    metrics = client.get("/metrics").text
    assert 'kelvin_extender_preemption_unknown_total{kind="node"} 1.0' in metrics
    assert 'kelvin_extender_preemption_unknown_total{kind="pod"} 1.0' in metrics
    assert 'kelvin_extender_requests_total{code="200",verb="preempt"} 1.0' in metrics


def test_full_pod_victims_read_their_annotations(client: TestClient) -> None:
    """NodeNameToVictims (nodeCacheCapable false): the Pod objects' kelvin.dev/evictable and checkpoint-done count."""

    def victim(i: int, **annotations: str) -> dict[str, Any]:
        p = pod(f"w{i}", annotations=dict(annotations))
        p["metadata"]["namespace"] = "low"
        p["spec"]["priority"] = 1 if i % 2 == 0 else 5
        return p

    fresh = format_time(T0 - 10)
    pods = [victim(0, **{ann.EVICTABLE: "false"})] + [victim(i, **{ann.CHECKPOINT_DONE: fresh}) for i in (4, 5)]
    body = json.dumps(
        {"Pod": preemptor(), "NodeNameToVictims": {"gpu-islands": {"Pods": pods, "NumPDBViolations": 0}}}
    ).encode()
    r = client.post("/preempt", content=body)
    assert r.status_code == 200, r.text
    assert victim_gpus(r.json()) == set(ISLAND_B)  # island A holds an unevictable pod


def test_a_proposed_victim_without_gpus_is_kept(client: TestClient) -> None:
    cpu_pod = {
        "metadata": {"name": "cpu", "namespace": "low", "uid": "uid-cpu"},
        "spec": {"containers": [{"name": "c"}]},
    }
    body = json.dumps(
        {"Pod": preemptor(), "NodeNameToVictims": {"gpu-islands": {"Pods": [cpu_pod], "NumPDBViolations": 0}}}
    ).encode()
    out = client.post("/preempt", content=body).json()["NodeNameToMetaVictims"]["gpu-islands"]
    uids = [p["UID"] for p in out["Pods"]]
    assert "uid-cpu" in uids and len(uids) == 5


def test_a_gang_member_is_never_preempted_for(client: TestClient) -> None:
    body = meta_args(preemptor(**{ann.GANG: "job-1"}), {"gpu-islands": ["uid-w0"]})
    assert client.post("/preempt", content=body).json() == {"NodeNameToMetaVictims": {}}


def test_an_invalid_preemptor_keeps_no_node(client: TestClient) -> None:
    body = meta_args(preemptor(**{ann.TOPOLOGY: "sideways"}), {"gpu-islands": ["uid-w0"]})
    r = client.post("/preempt", content=body)
    assert r.status_code == 200 and r.json() == {"NodeNameToMetaVictims": {}}


def test_pdb_violations_of_the_proposal_count_on_its_pods(client: TestClient) -> None:
    # kube-scheduler says its victims (island A's pods) violate PDBs: kelvin prefers island B
    body = meta_args(preemptor(), {"gpu-islands": ["uid-w0", "uid-w1", "uid-w2", "uid-w3"]}, pdb=2)
    out = client.post("/preempt", content=body).json()
    assert victim_gpus(out) == set(ISLAND_B)
    assert out["NodeNameToMetaVictims"]["gpu-islands"]["NumPDBViolations"] == 0


P = '"Pod": {"metadata": {"name": "p"}}'


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"", "empty request body"),
        (b"{nope", "not valid JSON"),
        (b"[1]", "must be a JSON object with Pod"),
        (b'{"Pod": 3, "NodeNameToMetaVictims": {}}', "Pod: must be a Pod object"),
        (("{" + P + "}").encode(), "NodeNameToVictims and NodeNameToMetaVictims are both null"),
        (("{" + P + ', "NodeNameToMetaVictims": []}').encode(), "NodeNameToMetaVictims: must be an object"),
        (
            ("{" + P + ', "NodeNameToMetaVictims": {"n1": 4}}').encode(),
            'NodeNameToMetaVictims["n1"]: must be a Victims',
        ),
        (
            ("{" + P + ', "NodeNameToMetaVictims": {"n1": {"Pods": {}}}}').encode(),
            'NodeNameToMetaVictims["n1"].Pods: must be a list',
        ),
        (
            ("{" + P + ', "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": 7}]}}}').encode(),
            'NodeNameToMetaVictims["n1"].Pods[0].UID: must be a non-empty string',
        ),
        (
            ("{" + P + ', "NodeNameToMetaVictims": {"n1": {"Pods": [], "NumPDBViolations": -1}}}').encode(),
            'NodeNameToMetaVictims["n1"].NumPDBViolations: must be a non-negative integer',
        ),
        (
            ("{" + P + ', "NodeNameToVictims": {"n1": {"Pods": [{"metadata": {}}]}}}').encode(),
            'NodeNameToVictims["n1"].Pods[0].metadata.uid',
        ),
    ],
)
def test_malformed_preemption_body_is_400_naming_the_field(client: TestClient, body: bytes, words: str) -> None:
    r = client.post("/preempt", content=body)
    assert r.status_code == 400, r.text
    assert words in r.json()["Error"]


def test_too_many_nodes_is_413() -> None:
    ext = make_extender([islands()], max_node_names=2)[0]
    with TestClient(create_app(ext)) as c:
        body = meta_args(preemptor(), {f"n{i}": ["u"] for i in range(3)})
        r = c.post("/preempt", content=body)
    assert r.status_code == 413 and "max_node_names" in r.json()["Error"]


def test_at_most_max_kept_nodes_are_answered_fewest_proposed_victims_first() -> None:
    from scheduler_plugin.extender.preempt import MAX_KEPT_NODES

    n = MAX_KEPT_NODES + 4
    ext = make_extender([islands(f"isl-{i}") for i in range(n)])[0]
    for i in range(n):  # distinct UIDs per node
        nd = ext.source.nodes[i]  # type: ignore[attr-defined]
        a = tuple(replace(x, pod_uid=f"{nd.name}-{x.pod_uid}") for x in nd.assignments)
        ext.source.nodes[i] = replace(nd, assignments=a)  # type: ignore[attr-defined]
    # the last node proposes one victim, the others four: kube-scheduler prefers it, so it is judged first
    victims = {f"isl-{i}": [f"isl-{i}-uid-w{j}" for j in range(1 if i == n - 1 else 4)] for i in range(n)}
    with TestClient(create_app(ext)) as c:
        c.portal.call(ext.cache.refresh_once)  # type: ignore[union-attr]
        out = c.post("/preempt", content=meta_args(preemptor(), victims)).json()["NodeNameToMetaVictims"]
    assert len(out) == MAX_KEPT_NODES
    assert f"isl-{n - 1}" in out


def test_the_preemptors_filter_is_retried_until_kelvin_sees_its_victims_gone(ext: Extender, client: TestClient) -> None:
    """Seen on the e2e cluster: kube-scheduler deletes the victims and filters the preemptor at once; kelvin's pod
    listing still shows them, and a refusal (FailedNodes) parked the pinned preemptor in the unschedulable queue with
    its node freed. While victims kelvin chose are still in its records, the filter answers an error (retried with
    backoff) instead; other pods, and the preemptor once the victims are gone, are judged as always."""
    hi = preemptor()
    r = client.post("/preempt", content=meta_args(hi, {"gpu-islands": ["uid-w0", "uid-w2", "uid-w4", "uid-w6"]}))
    freed = victim_gpus(r.json())
    # kube-scheduler deleted the victims; kelvin's listing has not caught up
    r = client.post("/filter", content=args(hi, ["gpu-islands"]))
    out = r.json()
    assert r.status_code == 200 and out["NodeNames"] == [] and not out["FailedNodes"], out
    assert "still shows 4 of them" in out["Error"], out
    # another pod is refused as always: it has no preemption pending
    other = pod("other", gpus=4, annotations={ann.TOPOLOGY: "nvlink-required"})
    out = client.post("/filter", content=args(other, ["gpu-islands"])).json()
    assert not out["Error"] and "gpu-islands" in out["FailedNodes"], out
    # the listing catches up: the victims are gone, the preemptor passes
    node = islands()
    kept = tuple(a for a in node.assignments if a.gpu_indices[0] not in freed)
    gpus = tuple(replace(g, memory_used_bytes=2**29) if g.index in freed else g for g in node.gpus)
    ext.source.nodes = [replace(node, gpus=gpus, assignments=kept), gpu_node("gpu-node-2")]  # type: ignore[attr-defined]
    client.portal.call(ext.cache.refresh_once)  # type: ignore[union-attr]
    out = client.post("/filter", content=args(hi, ["gpu-islands"])).json()
    assert out["NodeNames"] == ["gpu-islands"] and not out["Error"], out
    assert len(ext.pending_preemptions) == 0


def test_only_the_cheapest_node_is_answered() -> None:
    """kube-scheduler picks among the answered nodes by its own rules (here: equal priorities, equal counts), blind to
    progress: a costlier node answered could be the one it evicts on. Node "fresh" has an island whose pods
    checkpointed a minute ago; node "old" only pods that never did: only "fresh" is answered."""
    old = islands("old")
    fresh = islands("fresh")
    fresh = replace(
        fresh,
        assignments=tuple(
            replace(
                a,
                pod_uid=f"fresh-{a.pod_uid}",
                eviction=replace(
                    a.eviction or EvictionFacts(), checkpoint_at=T0 - 60 if a.gpu_indices[0] >= 4 else None
                ),
            )
            for a in fresh.assignments
        ),
    )
    ext = make_extender([old, fresh])[0]
    victims = {"old": [f"uid-w{i}" for i in (0, 1, 4, 5)], "fresh": [f"fresh-uid-w{i}" for i in (0, 1, 4, 5)]}
    with TestClient(create_app(ext)) as c:
        out = c.post("/preempt", content=meta_args(preemptor(), victims)).json()["NodeNameToMetaVictims"]
    assert set(out) == {"fresh"}, out
    assert {p["UID"] for p in out["fresh"]["Pods"]} == {f"fresh-uid-w{i}" for i in ISLAND_B}


def test_what_kube_schedulers_count_needs_freed() -> None:
    from scheduler_plugin.extender.preempt import kube_counted
    from scheduler_plugin.preemption import Candidate

    def cand(uid: str, gpus: tuple[int, ...], pool: bool = False) -> Candidate:
        a = GpuAssignment(pod_key=f"low/{uid}", gpu_indices=gpus, pod_uid=uid, milli=None if pool else 1000,
                          memory_bytes=40 * 2**30 if pool else None)  # fmt: skip
        return Candidate.of(a, T0)

    singles = [cand(f"s{i}", (i,)) for i in range(4)]
    big = cand("big", (4, 5, 6, 7))
    pools = [cand("p0", (0,), pool=True), cand("p1", (1,), pool=True)]
    everyone = [*singles, big, *pools]
    full = (0, 0)  # kube-scheduler's count sees no GPU and no slot free on the node
    # four 1-GPU victims for a 4-GPU pod: each was needed, so all four GPUs are
    assert kube_counted([c.uid for c in singles], everyone, False, 4, full) == (4, 0)
    # one 4-GPU victim may have been kept for a need of 1: at least 1
    assert kube_counted(["big"], everyone, False, 1, full) == (1, 0)
    assert kube_counted(["big", "s0"], everyone, False, 5, full) == (5, 0)  # without s0 it did not fit: 5
    # never more than the pod lacks by the count: 3 GPUs free, a 4-GPU pod lacks one
    assert kube_counted([c.uid for c in singles], everyone, False, 4, (3, 0)) == (1, 0)
    # a share preemptor lacks its one slot at most (not the two its victims hold); a victim kelvin has no record of
    # counts nothing
    assert kube_counted(["p0", "p1", "nobody"], everyone, True, 1, full) == (0, 1)
    # slots free: kube-scheduler took the pools for something else (CPU), no slot need be freed
    assert kube_counted(["p0", "p1"], everyone, True, 1, (0, 5)) == (0, 0)
    assert kube_counted([], everyone, False, 1, full) == (0, 0)


def test_kube_free_counts_gpus_and_slots_as_kube_scheduler() -> None:
    from scheduler_plugin.preemption.victims import kube_free

    recs = [
        GpuAssignment(pod_key="a/w", gpu_indices=(0, 1)),
        GpuAssignment(pod_key="a/p", gpu_indices=(2,), milli=None, memory_bytes=2**30),
        GpuAssignment(pod_key="a/s", gpu_indices=(2,), milli=300),
    ]
    assert kube_free(recs, 8, 16) == (6, 126)
    assert kube_free(recs, 2, 1) == (0, 0)


@pytest.mark.parametrize(("slots_per_gpu", "evicted"), [(16, {"uid-whole"}), (1, {"uid-whole", "uid-a"})])
def test_a_pool_is_evicted_beside_a_whole_gpu_only_when_the_node_is_out_of_slots(
    slots_per_gpu: int, evicted: set[str]
) -> None:
    """GPU 0: two 40 GiB pools (a, b); GPU 1: a whole-GPU pod started 10 s ago (the least progress); GPUs 2-7: pools of
    higher priority. A 60 GiB pool preemptor fits once the whole-GPU pod is gone. kube-scheduler proposes the
    whole-GPU pod and pool a (for CPU, say). With slots free on the node (16 a GPU: 120 of 128) kelvin evicts the
    whole-GPU pod alone; with every slot taken (1 a GPU: 8 of 8) its count needs a slot too, and kelvin adds the
    pool that loses least. Before, kelvin always matched the slots of kube-scheduler's victims: a pool evicted for
    nothing."""
    base = gpu_node("pools")
    gpus = tuple(replace(g, memory_used_bytes=(80 if g.index == 0 else 70) * 2**30) for g in base.gpus)

    def rec(uid: str, gpu: int, prio: int, ago: float, pool: bool = True) -> GpuAssignment:
        return GpuAssignment(
            pod_key=f"low/{uid}", gpu_indices=(gpu,), pod_uid=f"uid-{uid}", priority=prio,
            milli=None if pool else 1000, memory_bytes=40 * 2**30 if pool else None,
            eviction=EvictionFacts(started_at=T0 - ago),
        )  # fmt: skip

    recs = (
        rec("a", 0, 10, 600),
        rec("b", 0, 10, 900),
        rec("whole", 1, 10, 10, pool=False),
        *(rec(f"h{i}", i, 1000, 60) for i in range(2, 8)),
    )
    ext = make_extender([replace(base, gpus=gpus, assignments=recs)], shared_slots_per_gpu=slots_per_gpu)[0]
    hi = pod("hi", gpus=1, annotations={ann.GPU_MEMORY: "60Gi"})
    hi["spec"]["priority"] = 1000
    with TestClient(create_app(ext)) as c:
        out = c.post("/preempt", content=meta_args(hi, {"pools": ["uid-whole", "uid-a"]})).json()
    assert {p["UID"] for p in out["NodeNameToMetaVictims"]["pools"]["Pods"]} == evicted
