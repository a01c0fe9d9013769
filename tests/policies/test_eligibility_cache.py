"""The per-snapshot and per-cycle eligibility caches give exactly what the plain per-GPU tests give."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from scheduler_plugin.model import GpuRequest, ThrottleReason
from scheduler_plugin.policies.base import CycleContext
from scheduler_plugin.policies.eligibility import (
    LIMITS_KEY,
    GpuLimits,
    cycle_demand,
    cycle_eligible,
    eligible_gpus,
    static_of,
)
from tests.fleet_helpers import fleet, gpu, node, request, shared, whole

FLEET = fleet(
    node("a", [gpu(0), gpu(1, temp=90), gpu(2, model="H100", mem_gib=40), gpu(3)], assignments=[whole("x", 3)]),
    node("b", [gpu(0, throttle=int(ThrottleReason.HW_THERMAL_SLOWDOWN)), gpu(1, mem_gib=24)]),
    node("c", [gpu(0, model="H100"), gpu(1, model="H100")], assignments=[shared("y", 0, milli=600, mem_gib=30)]),
    node("d", []),
)

REQUESTS = [
    request(1),
    request(2),
    request(1, memory="20Gi"),
    request(1, memory="30Gi"),
    request(1, share=300),
    request(1, models="H100"),
    request(1, max_temp=60),
]


def ctx(limits: GpuLimits) -> CycleContext:
    c = CycleContext(now=0.0)
    c.state.write(LIMITS_KEY, limits)
    return c


@pytest.mark.parametrize("req", REQUESTS)
@pytest.mark.parametrize("limits", [GpuLimits(), GpuLimits(thermal_hard_limits=False, throttle_hard_limit=False)])
def test_cycle_eligible_and_demand_match_the_plain_tests(req: GpuRequest, limits: GpuLimits) -> None:
    every = np.arange(FLEET.n_nodes, dtype=np.int64)
    few = np.array([2], dtype=np.int64)  # under a quarter of the fleet: computed for those rows only
    for rows in (every, every[::-1].copy(), few):
        for _ in range(2):  # the second cycle reads the snapshot's cache
            c = ctx(limits)
            assert np.array_equal(cycle_eligible(req, FLEET, rows, c), eligible_gpus(req, FLEET, rows, limits))
            assert np.array_equal(cycle_demand(req, FLEET, rows, c), req.demand_milli(FLEET.mem_total[rows]))


def test_pods_of_one_shape_share_the_snapshot_masks_and_new_telemetry_replaces_them() -> None:
    a, b = request(1, memory="20Gi", pod="a"), request(1, memory="20Gi", pod="b")
    assert static_of(a, FLEET, GpuLimits()) is static_of(b, FLEET, GpuLimits())
    assert static_of(a, FLEET, GpuLimits()) is not static_of(request(1, memory="30Gi"), FLEET, GpuLimits())
    hotter = dataclasses.replace(FLEET, temp=np.full_like(FLEET.temp, 95.0))  # a new snapshot: new column objects
    every = np.arange(FLEET.n_nodes, dtype=np.int64)
    got = cycle_eligible(a, hotter, every, ctx(GpuLimits()))
    assert not got.any()
    assert np.array_equal(got, eligible_gpus(a, hotter, every, GpuLimits()))
