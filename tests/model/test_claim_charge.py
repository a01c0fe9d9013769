"""Charging a claim against capacity is one function (issue 15, item 5): the snapshot builder (records on the nodes),
the ledger overlay (``FleetArrays.with_assumed``), the simulators' placements (``apply_placement``, ``charge``) and
their release all go through :class:`~scheduler_plugin.model.claim.SlotCharges`."""

from __future__ import annotations

import numpy as np

from scheduler_plugin.model import GIB, GpuRequest
from scheduler_plugin.model.claim import claim_of
from scheduler_plugin.simulator.fleet import apply_placement
from tests.fleet_helpers import fleet, gpu, node, shared, whole

COLUMNS = ("free_milli", "free_mem", "assigned_milli", "assigned_mem", "tenants")


def _columns(f: object) -> dict[str, list[list[int]]]:
    return {c: getattr(f, c).tolist() for c in COLUMNS}


def test_a_gpu_index_reported_twice_is_charged_on_the_same_slot_everywhere() -> None:
    """A node that reports one GPU index on two slots (a GPU swapped under Prometheus: two series, two UUIDs): the
    builder charged its records on the last slot, the overlay and the simulator on the first, so a bound pod moved
    between slots once telemetry listed it. Now every path charges the first."""
    gpus = [gpu(0), gpu(1), gpu(1)]
    claims = [whole("w", 1), shared("s", 0, milli=250, mem_gib=10)]
    recorded = fleet(node("a", gpus, assignments=claims))
    overlay = fleet(node("a", gpus)).with_assumed({"a": claims})
    placed = fleet(node("a", gpus)).copy()
    for a in claims:
        placed.charge([(0, a)])
    assert _columns(recorded) == _columns(overlay) == _columns(placed)
    assert recorded.assigned_milli[0].tolist() == [250, 1000, 0]  # before: [250, 0, 1000]


def test_a_placement_is_charged_as_bind_records_it() -> None:
    """``apply_placement`` charges the pod's claim (``claim_of``) as the snapshot charges the record bind writes."""
    gpus = [gpu(0, mem_gib=80), gpu(1, mem_gib=40)]
    reqs = [
        (GpuRequest(count=1, milli=None, memory_bytes=20 * GIB, cpu_milli=2000, host_memory_bytes=GIB), (1,)),
        (GpuRequest(count=1, milli=300, cpu_milli=1000), (0,)),
        (GpuRequest(count=1, milli=200, memory_bytes=30 * GIB), (0,)),
    ]
    placed = fleet(node("a", gpus)).copy()
    taken = [apply_placement(placed, req, 0, g) for req, g in reqs]
    recorded = fleet(
        node("a", gpus, assignments=[claim_of(req, g, pod_key=f"ns/p{i}") for i, (req, g) in enumerate(reqs)])
    )
    assert _columns(placed) == _columns(recorded)
    assert taken == [500, 300, 375]  # a 20 GiB pool on a 40 GiB GPU; 30 GiB of 80 GiB outweighs 200 thousandths
    assert placed.cpu_free[0] == recorded.cpu_free[0] - 3000


def test_giving_a_placement_back_restores_the_fleet_exactly() -> None:
    """The job simulator's release is the same charge with ``sign=-1`` (before: a copy of its own)."""
    gpus = [gpu(0, mem_gib=80), gpu(1, mem_gib=40), gpu(2)]
    base = fleet(node("a", gpus, assignments=[whole("w", 2)]))
    f = base.copy()
    placements = [
        (GpuRequest(count=1, milli=None, memory_bytes=20 * GIB, cpu_milli=2000, host_memory_bytes=GIB), (1,)),
        (GpuRequest(count=1, milli=300, cpu_milli=1000), (0,)),
    ]
    for req, g in placements:
        apply_placement(f, req, 0, g)
    assert not np.array_equal(f.free_milli, base.free_milli)
    for req, g in placements:
        apply_placement(f, req, 0, g, sign=-1)
    for col in (*COLUMNS, "cpu_free", "mem_free_host"):
        assert np.array_equal(getattr(f, col), getattr(base, col)), col


def test_a_placement_charges_what_the_fleets_charge_does_over_a_random_replay() -> None:
    """``apply_placement`` works out one pod's charge slot by slot (the simulators' hot path) instead of through
    :class:`SlotCharges`' arrays: over random placements and releases (whole GPUs, shares, pools larger than the
    GPU, overcommitted slots, an index the node does not report, an index on two slots) every capacity column and
    every return value is the fleet's own ``charge``'s."""
    gpus = [gpu(0, mem_gib=80), gpu(1, mem_gib=40), gpu(2, mem_gib=16), gpu(3, mem_gib=80), gpu(3, mem_gib=24)]
    fast, ref = fleet(node("a", gpus)).copy(), fleet(node("a", gpus)).copy()
    rng = np.random.default_rng(7)
    placed: list[tuple[GpuRequest, tuple[int, ...]]] = []
    for _ in range(400):
        if placed and rng.random() < 0.3:
            req, g = placed.pop(int(rng.integers(len(placed))))
            sign = -1
        else:
            kind = int(rng.integers(4))
            if kind == 0:
                req = GpuRequest(count=int(rng.integers(1, 4)), cpu_milli=500)
            elif kind == 1:
                req = GpuRequest(count=1, milli=int(rng.integers(1, 1000)), host_memory_bytes=GIB)
            elif kind == 2:
                req = GpuRequest(count=1, milli=None, memory_bytes=int(rng.integers(1, 100)) * GIB)
            else:
                req = GpuRequest(count=1, milli=int(rng.integers(1, 1000)), memory_bytes=int(rng.integers(1, 50)) * GIB)
            g = tuple(int(x) for x in rng.choice(6, size=req.count, replace=False))  # 3: two slots; 4, 5: none
            placed.append((req, g))
            sign = 1
        taken = apply_placement(fast, req, 0, g, sign)
        ref.cpu_free[0] -= sign * req.cpu_milli
        ref.mem_free_host[0] -= sign * req.host_memory_bytes
        assert taken == ref.charge([(0, claim_of(req, g))], sign)
        assert _columns(fast) == _columns(ref)
        assert fast.cpu_free[0] == ref.cpu_free[0] and fast.mem_free_host[0] == ref.mem_free_host[0]
