"""What bind records equals what the listing of bound pods rebuilds.

Bind goes through the real extender and the real :class:`KubeBinder`, against an in-memory pod that applies the
binder's Binding (and any merge patch) as the API server would; the listing is :func:`assignments_from_pods` of that
pod.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_plugin.extender.binder import KubeBinder
from scheduler_plugin.kubeapi import KubeError
from scheduler_plugin.model import GIB, MIB, GpuAssignment, GpuInfo, GpuNode, RequestError, build_arrays, parse_pod
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.claim import charge_milli, charged_milli, claim_of
from scheduler_plugin.telemetry.assignments import assignments_from_pods, merge_assignments
from tests.extender.ext_helpers import make_extender


class PodStore:
    """The few API calls :class:`KubeBinder` makes, on one pod held in memory (Binding, merge patch), applied as
    kube-apiserver does: a Binding's annotations are merged into the pod in the write that sets ``nodeName``."""

    def __init__(self, pod: dict[str, Any]) -> None:
        self.pod = pod

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        return copy.deepcopy(self.pod)

    async def patch_merge(self, path: str, body: Any) -> dict[str, Any]:
        annotations = self.pod["metadata"].setdefault("annotations", {})
        for k, v in body["metadata"].get("annotations", {}).items():
            if v is None:
                annotations.pop(k, None)
            else:
                annotations[k] = v
        return self.pod

    async def post(self, path: str, body: Any) -> dict[str, Any]:
        assert body["kind"] == "Binding"
        uid = body["metadata"].get("uid")
        have = self.pod["metadata"].get("uid")
        if uid not in (None, have):  # as kube-apiserver answers, and KubeClient raises, a failed UID precondition
            name = body["metadata"]["name"]
            message = (
                f'Operation cannot be fulfilled on pods/binding "{name}": Precondition failed: '
                f"UID in precondition: {uid}, UID in object meta: {have}"
            )
            status = {"kind": "Status", "status": "Failure", "message": message, "reason": "Conflict", "code": 409}
            raise KubeError(409, f"POST {path}: {message}", status)
        self.pod["metadata"].setdefault("annotations", {}).update(body["metadata"].get("annotations") or {})
        self.pod["spec"]["nodeName"] = body["target"]["name"]
        return {"kind": "Status"}

    async def close(self) -> None:
        return None


def gpu_node(name: str, gib: int, n: int = 4) -> GpuNode:
    gpus = tuple(
        GpuInfo(index=i, uuid=f"{name}-{i}", model="NVIDIA H100 80GB HBM3", memory_total_bytes=gib * GIB)
        for i in range(n)
    )
    return GpuNode(name=name, gpus=gpus, cpu_allocatable_milli=64_000, memory_allocatable_bytes=512 * GIB)


def make_pod(name: str, gpus: int, annotations: dict[str, str]) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": dict(annotations)},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }


def bind_and_list(nodes: list[GpuNode], pod: dict[str, Any]) -> tuple[Any, GpuAssignment, GpuAssignment]:
    """Bind ``pod`` through the extender onto the first node; return (extender, ledger entry, listed record)."""
    store = PodStore(pod)
    ext, _, _ = make_extender(nodes, binder=KubeBinder(store))  # type: ignore[arg-type]

    async def go() -> dict[str, str]:
        await ext.cache.refresh_once()
        meta = pod["metadata"]
        body = {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": nodes[0].name}
        return await ext.bind(json.dumps(body).encode())

    assert asyncio.run(go()) == {"Error": ""}
    bound = ext.ledger.entries(ext.clock())[nodes[0].name]
    listed = assignments_from_pods([store.pod])[nodes[0].name]
    assert len(bound) == len(listed) == 1
    return ext, bound[0], listed[0]


KINDS = st.sampled_from(["whole", "pool", "share", "pool+share"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=KINDS,
    gib=st.sampled_from([16, 24, 40, 48, 80, 94, 141]),
    count=st.integers(1, 4),
    pool_mib=st.integers(1, 16 * 1024),
    share=st.integers(1, 1000),
)
def test_bind_records_what_the_listing_rebuilds(kind: str, gib: int, count: int, pool_mib: int, share: int) -> None:
    annotations: dict[str, str] = {}
    gpus = count if kind == "whole" else 1
    if "pool" in kind:
        annotations[ann.GPU_MEMORY] = f"{pool_mib}Mi"
    if "share" in kind:
        annotations[ann.GPU_SHARE] = str(share)
    nodes = [gpu_node("n1", gib)]
    ext, bound, listed = bind_and_list(nodes, make_pod("p", gpus, annotations))
    assert bound == listed
    # the same charge per GPU, from the ledger overlay and from the snapshot rebuilt with the listing
    fleet = ext.cache.snapshot.arrays
    via_ledger = fleet.with_assumed({"n1": [bound]})
    via_listing = build_arrays(merge_assignments(nodes, {"n1": [listed]}))
    assert np.array_equal(via_ledger.assigned_milli, via_listing.assigned_milli)
    assert np.array_equal(via_ledger.free_milli, via_listing.free_milli)
    want = 1000 if kind == "whole" else 0
    if "pool" in kind:
        want = max(want, math.ceil(pool_mib * MIB * 1000 / (gib * GIB)))
    if "share" in kind:
        want = max(want, share)
    charged = sorted(via_listing.assigned_milli[0].tolist(), reverse=True)
    assert charged == [min(want, 1000)] * len(listed.gpu_indices) + [0] * (4 - len(listed.gpu_indices))


def test_pool_pod_listed_back_is_charged_its_memory_share_and_a_second_fits() -> None:
    """Before: a 20 GiB pool pod was charged 250 at bind but 1000 once listed back, so nothing else fit its GPU."""
    nodes = [gpu_node("n1", 80, n=1)]
    first = make_pod("first", 1, {ann.GPU_MEMORY: "20Gi"})
    _, _, listed = bind_and_list(nodes, first)
    assert listed.memory_bytes == 20 * GIB and listed.gpu_indices == (0,)
    assert charged_milli(listed, 80 * GIB) == 250
    # the extender now sees the listed pod (a snapshot with the listing, no ledger entry): a second pool still fits
    nodes = merge_assignments(nodes, {"n1": [listed]})
    assert build_arrays(nodes).assigned_milli.tolist() == [[250]]
    _, bound2, listed2 = bind_and_list(list(nodes), make_pod("second", 1, {ann.GPU_MEMORY: "20Gi"}))
    assert bound2 == listed2 and listed2.gpu_indices == (0,)
    fleet = build_arrays(merge_assignments(nodes, {"n1": [listed2]}))
    assert fleet.assigned_milli.tolist() == [[500]] and fleet.free_milli.tolist() == [[500]]


def _bound(name: str, memory: str) -> dict[str, Any]:
    pod = make_pod(name, 1, {ann.GPU_MEMORY: memory, ann.GPU_ASSIGNED: "0", ann.GPU_ASSIGNED_NODE: "n1"})
    pod["spec"]["nodeName"] = "n1"
    return pod


def test_a_pool_pod_bound_before_the_unit_was_required_keeps_its_pool(caplog: pytest.LogCaptureFixture) -> None:
    """A bound pod whose pool is bare bytes (the deprecated reading, kept until 0.3.0) is charged its pool, not a whole
    GPU, and warned about once however often the pods are listed, naming the removal version; admission is strict."""
    old = _bound("old-pool", "21474836480")
    with caplog.at_level(logging.INFO, logger="scheduler_plugin.telemetry.assignments"):
        for _ in range(3):
            (listed,) = assignments_from_pods([old])["n1"]
            assert listed.memory_bytes == 20 * GIB and listed.gpu_indices == (0,)
            assert charged_milli(listed, 80 * GIB) == 250
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "default/old-pool" in warnings[0].getMessage()
    assert "read as bytes for now (deprecated: from kelvin 0.3.0 a bound pod's kelvin.dev/gpu-memory needs a unit" in (
        warnings[0].getMessage()
    )
    with pytest.raises(RequestError, match="has no memory unit"):
        parse_pod(old)  # filter / bind: still refused
    # below 1Mi (a typo, never a pool) or not a number: still counted whole
    for bad in ("20", "twenty"):
        (whole,) = assignments_from_pods([_bound(f"bad-{bad}", bad)])["n1"]
        assert whole.memory_bytes is None and charged_milli(whole, 80 * GIB) == 1000


def test_charge_of_a_claim() -> None:
    assert charge_milli(1000, None, 80 * GIB) == 1000
    assert charge_milli(None, 20 * GIB, 80 * GIB) == 250
    assert charge_milli(300, 20 * GIB, 80 * GIB) == 300
    assert charge_milli(None, 20 * GIB + 1, 80 * GIB) == 251  # rounded up
    assert charge_milli(None, 81 * GIB, 80 * GIB) == 1001  # never fits
    assert charge_milli(None, GIB, 0) == 1001  # unknown size: never fits
    a = claim_of(parse_pod(make_pod("p", 0, {ann.GPU_MEMORY: "100Gi"})), (0,))
    assert a.milli is None and charged_milli(a, 80 * GIB) == 1000  # recorded: at most the whole GPU


def test_a_binding_for_a_recreated_pod_is_refused_and_its_gpus_released() -> None:
    """The pod was deleted and recreated under the same name: the Binding's UID precondition fails (409 Conflict),
    nothing is written, and (a definite refusal) kelvin releases the GPUs it had assumed."""
    nodes = [gpu_node("n1", 80)]
    pod = make_pod("p1", 1, {})
    store = PodStore(pod)
    ext, _, _ = make_extender(nodes, binder=KubeBinder(store))  # type: ignore[arg-type]

    async def go() -> dict[str, str]:
        await ext.cache.refresh_once()
        body = {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-old", "Node": "n1"}
        return await ext.bind(json.dumps(body).encode())

    err = asyncio.run(go())["Error"]
    assert "HTTP 409" in err and "Precondition failed: UID in precondition: uid-old" in err
    assert "nodeName" not in store.pod["spec"] and ann.GPU_ASSIGNED not in store.pod["metadata"]["annotations"]
    assert len(ext.ledger) == 0
