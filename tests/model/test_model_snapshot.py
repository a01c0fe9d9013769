"""The columnar fleet view: shapes, padding, capacity from records and telemetry, overlays, staleness."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_plugin.model import GIB, GpuAssignment, Snapshot, ThrottleReason, build_arrays, empty_snapshot
from tests.fleet_helpers import NOW, dgx, fleet, gpu, node, shared, whole


def test_shapes_and_padding() -> None:
    f = fleet(dgx("big"), node("small", [gpu(0, model="T4", mem_gib=16), gpu(1, model="T4", mem_gib=16)]))
    assert f.gpu_present.shape == (2, 8)
    assert f.gpu_present.sum(axis=1).tolist() == [8, 2]
    assert f.gpu_count.tolist() == [8, 2]
    assert f.gpu_index[1].tolist() == [0, 1, -1, -1, -1, -1, -1, -1]
    assert f.free_milli[1, 2:].tolist() == [0] * 6  # padding is never free
    assert f.models == ("A100", "T4")
    assert f.model_ids(["t4", "V100"]) == {1}
    assert f.index == {"big": 0, "small": 1}
    assert f.nvlink[0].sum() == 8 * 7
    assert not f.nvlink[1].any()
    assert f.switch[0, 0] == f.switch[0, 1] != f.switch[0, 2]


def test_capacity_from_records_and_telemetry() -> None:
    n = node(
        "a",
        [gpu(0), gpu(1, used_gib=40), gpu(2, used_gib=0.5), gpu(3)],
        assignments=[whole("w", 0), shared("s", 3, milli=250, mem_gib=10)],
    )
    f = fleet(n)
    assert f.free_milli[0].tolist() == [0, 500, 1000, 750]  # telemetry use counts; driver overhead does not
    assert f.free_mem[0].tolist() == [0, 40 * GIB, 80 * GIB, 70 * GIB]
    assert f.tenants[0].tolist() == [1, 0, 0, 1]


def test_with_assumed_overlays_capacity_only() -> None:
    f = fleet(dgx("a"), dgx("b"))
    view = f.with_assumed({"b": [shared("x", 2, milli=300, mem_gib=20), whole("y", 5)], "gone": [whole("z", 0)]})
    assert view.free_milli[1, [2, 5]].tolist() == [700, 0]
    assert view.free_mem[1, 2] == 60 * GIB
    assert view.tenants[1, [2, 5]].tolist() == [1, 1]
    assert f.free_milli[1, [2, 5]].tolist() == [1000, 1000]  # the original is untouched
    assert view.temp is f.temp  # everything else shared
    assert f.with_assumed({}) is f


def test_copy_is_deep_for_arrays() -> None:
    f = fleet(dgx("a"))
    c = f.copy()
    c.free_milli[0, 0] = 0
    assert f.free_milli[0, 0] == 1000


def test_gpu_derived_fields() -> None:
    g = gpu(0, used_gib=90, mem_gib=80, throttle=int(ThrottleReason.HW_THERMAL_SLOWDOWN), clock=(500, 2000))
    assert g.memory_free_bytes == 0
    assert g.thermally_throttled
    assert g.clock_ratio == 0.25
    assert gpu(0, clock=(0, 0)).clock_ratio == 1.0


def test_stale_mask() -> None:
    snap = Snapshot(
        nodes=(
            node("fresh", [gpu(0)]),
            node("old", [gpu(0)], observed_at=NOW - 60),
            node("never", [gpu(0)], observed_at=None),
        ),
        taken_at=NOW,
    )
    assert snap.stale_mask(NOW + 1, 30).tolist() == [False, True, True]
    assert snap.stale_nodes(NOW + 1, 30) == ["old", "never"]
    assert snap.node("old") is snap.nodes[1]
    assert snap.age_seconds(NOW + 5) == 5
    assert math.isinf(empty_snapshot().age_seconds(NOW))


def test_empty_fleet() -> None:
    f = build_arrays([])
    assert f.n_nodes == 0
    assert f.gpu_present.shape == (0, 1)
    assert np.isnan(f.observed_at).all()


def test_compute_only_share_holds_its_share_of_memory() -> None:
    share = GpuAssignment(pod_key="default/c", gpu_indices=(0,), milli=250)
    f = fleet(node("a", [gpu(0)], assignments=[share]))
    assert f.free_mem[0, 0] == 60 * GIB  # not 0: a 25 % compute share holds 25 % of the memory
    view = fleet(node("b", [gpu(0)])).with_assumed({"b": [share]})
    assert view.free_mem[0, 0] == 60 * GIB


_MEM = [16, 24, 80]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 8), st.sampled_from(_MEM)), min_size=1, max_size=4),
    st.lists(
        st.tuples(
            st.integers(0, 4),  # node (4: one the fleet does not hold)
            st.lists(st.integers(0, 8), min_size=1, max_size=3, unique=True),  # GPU indices (8: not on any node)
            st.one_of(st.none(), st.integers(0, 1000)),  # compute share (None: a memory pool only)
            st.one_of(st.none(), st.integers(1, 100)),  # memory pool, GiB (up to more than any GPU)
        ),
        max_size=30,
    ),
)
def test_an_overlay_charges_like_the_records_it_stands_for(
    shape: list[tuple[int, int]], claims: list[tuple[int, list[int], int | None, int | None]]
) -> None:
    """with_assumed's view equals the fleet built with the same assignments recorded on its nodes (the snapshot
    builder's own, separate code): same charge per GPU, same free capacity, same tenants."""
    names = [f"n{k}" for k in range(len(shape))]
    assigned: dict[str, list[GpuAssignment]] = {}
    for k, (n, gpus, milli, pool) in enumerate(claims):
        if milli is None and pool is None:
            milli = 1000
        a = GpuAssignment(f"default/p{k}", tuple(gpus), milli=milli, memory_bytes=None if pool is None else pool * GIB)
        assigned.setdefault(f"n{n}", []).append(a)
    empty = [
        node(nm, [gpu(j, mem_gib=mem) for j in range(count)]) for nm, (count, mem) in zip(names, shape, strict=True)
    ]
    recorded = [
        node(nm, [gpu(j, mem_gib=mem) for j in range(count)], assignments=assigned.get(nm, ()))
        for nm, (count, mem) in zip(names, shape, strict=True)
    ]
    view, want = fleet(*empty).with_assumed(assigned), fleet(*recorded)
    for col in ("free_milli", "free_mem", "assigned_milli", "assigned_mem", "tenants"):
        assert np.array_equal(getattr(view, col), getattr(want, col)), col


def test_an_overlay_charges_all_its_gpus_in_one_vectorised_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The extender rebuilds the overlay after every bind, with every assignment of the ledger's TTL: its charge is
    one array computation, not one per GPU (a thousand assumed pods cost 20 ms a request when it was)."""
    from scheduler_plugin.model import claim

    calls: list[int] = []
    real = claim.charge_milli_array

    def counting(share: object, pool: object, total: object) -> object:
        calls.append(1)
        return real(share, pool, total)  # type: ignore[arg-type]

    monkeypatch.setattr(claim, "charge_milli_array", counting)
    f = fleet(dgx("a"), dgx("b"))
    view = f.with_assumed({"a": [whole(f"w{j}", j) for j in range(8)], "b": [shared("s", 3, milli=250)]})
    assert len(calls) == 1
    assert view.free_milli[0].tolist() == [0] * 8 and view.free_milli[1, 3] == 750
