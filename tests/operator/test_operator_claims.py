"""The operator reads a pod's GPU claim and charges it like bind does (issue 10 item 3)."""

from __future__ import annotations

import pytest
from kelvin_operator.pods import pod_view
from kelvin_operator.strategies import thermal
from opkit import gpu, node, pod

from scheduler_plugin.hotness import HotnessConfig, observe
from scheduler_plugin.model import GIB, parse_pod
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.claim import claim_of
from scheduler_plugin.telemetry.assignments import assignment_of_pod


def pool_pod(name: str, memory: str, *, slot: bool = False) -> dict[str, object]:
    p = pod(name, gpus=0 if slot else 1, gpu_indices="0", annotations={ann.GPU_MEMORY: memory})
    if slot:  # a pool pod as the webhook writes it: one kelvin.dev/shared-gpu slot, no nvidia.com/gpu
        p["spec"]["containers"][0]["resources"] = {"limits": {ann.SHARED_GPU_RESOURCE: "1"}}  # type: ignore[index]
    return p


@pytest.mark.parametrize("slot", [False, True])
def test_pod_view_holds_the_claim_bind_records(slot: bool) -> None:
    p = pool_pod("a", "20Gi", slot=slot)
    v = pod_view(p)
    assert v.request_error is None and v.gpu_count == 1 and v.memory_pool_bytes == 20 * GIB
    assert v.claim == claim_of(parse_pod(p), (0,))


def test_pod_view_names_a_bad_shared_slot() -> None:
    p = pod("b", gpus=0, gpu_indices="0")
    p["spec"]["containers"][0]["resources"] = {"limits": {ann.SHARED_GPU_RESOURCE: "1"}}
    v = pod_view(p)
    assert v.claim is None and v.request_error is not None and ann.SHARED_GPU_RESOURCE in v.request_error


def test_thermal_heat_of_pool_pods_follows_their_charge() -> None:
    """Before: pool pods without attributed processes split a hot GPU's heat evenly (a 20 GiB pool counted as much
    as a 60 GiB one); now each counts its charge on the 80 GiB GPU (250 and 750 thousandths)."""
    nd = node("n1", gpu(0, 88.0, total_gib=80))
    pods = [pod_view(pool_pod("small", "20Gi")), pod_view(pool_pod("big", "60Gi", slot=True))]
    cfg = HotnessConfig()
    got = {c.pod.name: c.heat for c in thermal(nd, observe(nd, cfg), pods, cfg.cool_celsius)}
    assert got["big"] == pytest.approx(3 * got["small"]) and got["small"] > 0


def test_a_pool_bound_before_units_were_required_is_read_as_the_listing_reads_it() -> None:
    """A running pod with ``gpu-memory: "21474836480"`` (bare bytes, admitted before units were required): the
    operator must see its 20 GiB pool, as the extender's pod listing does, not a whole GPU with a parse error."""
    p = pool_pod("old", "21474836480")
    v = pod_view(p)
    assert v.request_error is None and v.memory_pool_bytes == 20 * GIB
    assert v.claim is not None and v.claim.memory_bytes == 20 * GIB and v.claim.gpu_indices == (0,)
    _, listed = assignment_of_pod({**p, "spec": {**p["spec"], "nodeName": "n1"}})  # type: ignore[dict-item]
    assert v.claim == listed


def test_gpu_indices_are_read_as_the_listing_reads_them() -> None:
    """``gpu-assigned: "0,x"`` is not a list of GPU indices: the listing ignores it whole, and so must the operator
    (it used to keep GPU 0 and drop the rest without a word)."""
    p = pod("bad", gpus=2, gpu_indices="0,x")
    assert pod_view(p).gpu_indices == ()
    assert assignment_of_pod({**p, "spec": {**p["spec"], "nodeName": "n1"}}) is None  # type: ignore[dict-item]
