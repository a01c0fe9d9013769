"""The per-row memos (:mod:`scheduler_plugin.policies.row_memo`) never serve a stale entry: after a bind (a ledger
overlay charging one row), a ledger expiry (the overlay gone), a new snapshot and a pod of another shape, the memo's
answer equals a cold computation, and only the rows that changed are recomputed (the fit filter, the topology, noise
and thermal scores)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from scheduler_plugin.model import FleetArrays, GpuAssignment, GpuRequest, ThrottleReason
from scheduler_plugin.model.snapshot import IndexKey, SnapshotIndex
from scheduler_plugin.policies.base import CycleContext, FloatA, Rejection
from scheduler_plugin.policies.eligibility import GpuLimits
from scheduler_plugin.policies.fit import FitFilter, shape_of
from scheduler_plugin.policies.noise import NoiseArgs, NoiseScore
from scheduler_plugin.policies.policy_file import FilterPolicy
from scheduler_plugin.policies.row_memo import RowMemo
from scheduler_plugin.policies.thermal import ThermalArgs, ThermalScore
from scheduler_plugin.policies.topology import TopologyArgs, TopologyScore
from tests.fleet_helpers import dgx, fleet, gpu, node, nvlink_pairs, pcie_box, request, shared, whole

BASE = fleet(
    node("a", [gpu(0), gpu(1, temp=90), gpu(2, model="H100", mem_gib=40), gpu(3)], assignments=[whole("x", 3)]),
    node("b", [gpu(0, throttle=int(ThrottleReason.HW_THERMAL_SLOWDOWN)), gpu(1, mem_gib=24)]),
    node("c", [gpu(0, model="H100"), gpu(1, model="H100")], assignments=[shared("y", 0, milli=600, mem_gib=30)]),
    node("d", []),
    dgx("e", 4, assignments=[whole("z", 0, 1)]),
    pcie_box("f", 4),
    nvlink_pairs("g", 4, assignments=[whole("w", 0)]),
    dgx("h", 4),
)

SHAPES = [
    request(1),
    request(2),
    request(2, topology="nvlink-required"),
    request(1, memory="20Gi"),
    request(1, share=300),
    request(1, models="H100"),
    request(1, max_temp=60),
]


def cold(fit: FitFilter, req: GpuRequest, f: FleetArrays) -> list[Rejection | None]:
    """Each row judged alone (one row is "few": computed, on an index of its own so that no memo is read), a passing
    row as None."""
    f = dataclasses.replace(f, derived=SnapshotIndex())
    out: list[Rejection | None] = []
    for r in range(f.n_nodes):
        one = np.array([r], dtype=np.int64)
        ok = bool(fit.filter(req, f, one, CycleContext(now=0.0))[0])
        out.append(None if ok else fit.reasons(req, f, one, CycleContext(now=0.0))[0])
    return out


def memo(fit: FitFilter, req: GpuRequest, f: FleetArrays) -> list[Rejection | None]:
    """Every row at once (the memo's path): the verdicts and the rejections of the rows that fail."""
    every = np.arange(f.n_nodes, dtype=np.int64)
    ctx = CycleContext(now=0.0)
    ok = fit.filter(req, f, every, ctx)
    bad = every[~ok]
    why = dict(zip(bad.tolist(), fit.reasons(req, f, bad, ctx), strict=True))
    return [why.get(r) for r in range(f.n_nodes)]


def fresh() -> FleetArrays:
    """:data:`BASE` with an empty snapshot index of its own (no memo left by another test)."""
    return dataclasses.replace(BASE, derived=SnapshotIndex())


def computed(fit: FitFilter, req: GpuRequest, f: FleetArrays) -> int:
    """How many rows the memo of ``req``'s shape has computed in all."""
    holder = f.derive(fit._rows_key, lambda _: RowMemo(), shape_of(req))
    return holder.computed_rows


def test_bind_expiry_snapshot_and_shape_each_change_the_answer_and_match_a_cold_computation() -> None:
    fit = FitFilter(FilterPolicy())
    base = fresh()
    one_gpu = request(1)
    first = memo(fit, one_gpu, base)
    assert first == cold(fit, one_gpu, base)
    assert computed(fit, one_gpu, base) == base.n_nodes
    assert memo(fit, one_gpu, base) == first and computed(fit, one_gpu, base) == base.n_nodes  # reused

    # a bind: the overlay takes node f's four free GPUs; only that row is recomputed
    bound = base.with_assumed({"f": [whole("new", 0, 1, 2, 3)]})
    after_bind = memo(fit, one_gpu, bound)
    assert after_bind != first
    assert after_bind == cold(fit, one_gpu, bound)
    assert computed(fit, one_gpu, base) == base.n_nodes + 1

    # the ledger entry expires: the snapshot without the overlay again
    assert memo(fit, one_gpu, base) == first == cold(fit, one_gpu, base)

    # a new snapshot: every GPU hot (a replaced telemetry column)
    hotter = dataclasses.replace(base, temp=np.full_like(base.temp, 95.0))
    after_snapshot = memo(fit, one_gpu, hotter)
    assert after_snapshot != first
    assert after_snapshot == cold(fit, one_gpu, hotter)

    # a pod of another shape on the same fleet
    nvlink = request(2, topology="nvlink-required")
    other = memo(fit, nvlink, base)
    assert other != first
    assert other == cold(fit, nvlink, base)


@pytest.mark.parametrize("req", SHAPES, ids=lambda r: r.describe() + str(r.topology) + str(r.models))
def test_every_shape_matches_a_cold_computation_through_a_run_of_binds(req: GpuRequest) -> None:
    fit = FitFilter(FilterPolicy())
    base = fresh()
    current = base
    binds = [("e", whole("b1", 2)), ("f", shared("b2", 1, milli=500, mem_gib=20)), ("h", whole("b3", 0, 1, 2, 3))]
    assumed: dict[str, list[GpuAssignment]] = {}
    assert memo(fit, req, current) == cold(fit, req, current)
    for name, a in binds:
        assumed.setdefault(name, []).append(a)
        current = base.with_assumed(assumed)
        assert memo(fit, req, current) == cold(fit, req, current)


def test_shapes_on_one_snapshot_each_get_their_own_answer() -> None:
    fit = FitFilter(FilterPolicy())
    base = fresh()
    for _ in range(2):  # the second round reads the memos the first filled
        for req in SHAPES:
            assert memo(fit, req, base) == cold(fit, req, base), req


def topology_memo(score: TopologyScore, req: GpuRequest, f: FleetArrays) -> list[float]:
    """Every row at once (the memo's path)."""
    return [float(x) for x in score.score(req, f, np.arange(f.n_nodes, dtype=np.int64), CycleContext(now=0.0))]


def topology_cold(score: TopologyScore, req: GpuRequest, f: FleetArrays) -> list[float]:
    """Each row alone (one row is "few": computed, the memo not read)."""
    return [float(score.score(req, f, np.array([r]), CycleContext(now=0.0))[0]) for r in range(f.n_nodes)]


@pytest.mark.parametrize("req", [request(1), request(2), request(1, memory="20Gi"), request(1, models="H100")])
def test_topology_scores_follow_binds_expiry_snapshots_and_shapes(req: GpuRequest) -> None:
    score = TopologyScore(TopologyArgs())
    base = fresh()
    same = np.testing.assert_array_equal  # NaN where no GPU is usable: equal to NaN
    first = topology_memo(score, req, base)
    same(first, topology_cold(score, req, base))
    bound = base.with_assumed({"h": [whole("n1", 1)], "f": [whole("n2", 0, 2)], "c": [whole("n3", 1)]})  # binds
    after_bind = topology_memo(score, req, bound)
    assert not np.array_equal(after_bind, first, equal_nan=True)
    same(after_bind, topology_cold(score, req, bound))
    same(topology_memo(score, req, base), first)  # the ledger entry expired
    unwired = dataclasses.replace(base, nvlink=np.zeros_like(base.nvlink))  # a new snapshot: no NVLink at all
    same(topology_memo(score, req, unwired), topology_cold(score, req, unwired))
    other = request(3)  # another shape on the first snapshot
    same(topology_memo(score, req, base), first)
    same(topology_memo(score, other, base), topology_cold(score, other, base))


def noise_memo(score: NoiseScore, f: FleetArrays) -> list[float]:
    return [float(x) for x in score.score(request(1), f, np.arange(f.n_nodes, dtype=np.int64), CycleContext(now=0.0))]


def noise_cold(score: NoiseScore, f: FleetArrays) -> list[float]:
    return [float(score.score(request(1), f, np.array([r]), CycleContext(now=0.0))[0]) for r in range(f.n_nodes)]


def test_whole_gpu_noise_follows_binds_expiry_and_snapshots() -> None:
    score = NoiseScore(NoiseArgs())
    base = fresh()
    first = noise_memo(score, base)
    assert first == noise_cold(score, base)
    bound = base.with_assumed({"h": [whole("n1", 1)], "e": [shared("n2", 3, milli=200)]})  # two more tenants
    after_bind = noise_memo(score, bound)
    assert after_bind != first
    assert after_bind == noise_cold(score, bound)
    assert noise_memo(score, base) == first  # the ledger entries expired
    busy = dataclasses.replace(base, util=np.full_like(base.util, 0.9))  # a new snapshot: every GPU busy
    after_snapshot = noise_memo(score, busy)
    assert after_snapshot != first
    assert after_snapshot == noise_cold(score, busy)


HOT = fleet(
    node("a", [gpu(0), gpu(1), gpu(2, model="H100", mem_gib=40), gpu(3)]),
    node("b", [gpu(0, throttle=int(ThrottleReason.SW_POWER_CAP)), gpu(1, mem_gib=24)]),
    node("c", [gpu(0, model="H100"), gpu(1, model="H100")], assignments=[shared("y", 0, milli=600)]),
    node("d", []),
    dgx("e", 4, assignments=[whole("z", 0)]),
    pcie_box("f", 4),
    nvlink_pairs("g", 4, assignments=[whole("w", 0)]),
    dgx("h", 4),
)
"""GPUs of graded temperatures (62 to 80 °C, within the comfortable headroom of slowdown): which of them the pod
could get moves its thermal score."""
HOT = dataclasses.replace(HOT, temp=62.0 + np.arange(HOT.temp.size, dtype=np.float64).reshape(HOT.temp.shape) % 7 * 3.0)


def every_row(score: ThermalScore | NoiseScore, req: GpuRequest, f: FleetArrays) -> FloatA:
    """The raw score of every row at once (the memo's path)."""
    return score.score(req, f, np.arange(f.n_nodes, dtype=np.int64), CycleContext(now=0.0))


def row_alone(score: ThermalScore | NoiseScore, req: GpuRequest, f: FleetArrays) -> FloatA:
    """The raw score of each row alone (one row is "few": computed, the memo not read)."""
    return np.array([score.score(req, f, np.array([r]), CycleContext(now=0.0))[0] for r in range(f.n_nodes)])


def computed_for(key: IndexKey[RowMemo], req: GpuRequest, f: FleetArrays) -> int:
    """How many rows the memo under ``key`` of ``req``'s shape (default limits) computed in all."""
    shape = (req.count, req.milli, req.memory_bytes, req.models, req.max_temperature, GpuLimits())
    return f.derive(key, lambda _: RowMemo(), shape).computed_rows


def thermal_memo(score: ThermalScore, req: GpuRequest, f: FleetArrays) -> FloatA:
    return every_row(score, req, f)


def thermal_cold(score: ThermalScore, req: GpuRequest, f: FleetArrays) -> FloatA:
    return row_alone(score, req, f)


def thermal_computed(score: ThermalScore, req: GpuRequest, f: FleetArrays) -> int:
    return computed_for(score._rows_key, req, f)


@pytest.mark.parametrize("req", [request(1), request(2), request(1, memory="20Gi"), request(1, models="H100")])
def test_thermal_scores_follow_binds_expiry_snapshots_and_shapes(req: GpuRequest) -> None:
    score = ThermalScore(ThermalArgs())
    base = dataclasses.replace(HOT, derived=SnapshotIndex())
    same = np.testing.assert_array_equal  # the same floats; NaN where a node has no GPU
    first = thermal_memo(score, req, base)
    same(first, thermal_cold(score, req, base))
    assert thermal_computed(score, req, base) == base.n_nodes
    same(thermal_memo(score, req, base), first)
    assert thermal_computed(score, req, base) == base.n_nodes  # reused
    for n, bound in enumerate(  # binds, one after the other, take the coolest GPUs of nodes a and c
        (
            base.with_assumed({"a": [whole("n1", 0, 2)]}),
            base.with_assumed({"a": [whole("n1", 0, 2)], "c": [whole("n2", 1)]}),
        )
    ):
        after_bind = thermal_memo(score, req, bound)
        assert not np.array_equal(after_bind, first, equal_nan=True)
        same(after_bind, thermal_cold(score, req, bound))
        assert thermal_computed(score, req, base) == base.n_nodes + n + 1  # the charged row only
    same(thermal_memo(score, req, base), first)  # the ledger entries expired
    hotter = dataclasses.replace(base, temp=base.temp + 10.0)  # a new snapshot: every GPU 10 °C hotter
    after_snapshot = thermal_memo(score, req, hotter)
    assert not np.array_equal(after_snapshot, first, equal_nan=True)
    same(after_snapshot, thermal_cold(score, req, hotter))
    other = request(3)  # another shape on the first snapshot
    same(thermal_memo(score, other, base), thermal_cold(score, other, base))
    assert not np.array_equal(thermal_memo(score, other, base), first, equal_nan=True)
    same(thermal_memo(score, req, base), first)


def test_thermal_memo_serves_a_run_of_binds_the_same_floats_as_a_cold_score() -> None:
    score = ThermalScore(ThermalArgs())
    base = dataclasses.replace(HOT, derived=SnapshotIndex())
    assumed: dict[str, list[GpuAssignment]] = {}
    for name, a in [
        ("e", whole("b1", 2)),
        ("f", shared("b2", 1, milli=500)),
        ("h", whole("b3", 0, 1)),
        ("a", whole("b4", 3)),
    ]:
        assumed.setdefault(name, []).append(a)
        current = base.with_assumed(assumed)
        for req in (request(1), request(2), request(1, share=300)):
            np.testing.assert_array_equal(thermal_memo(score, req, current), thermal_cold(score, req, current))


BUSY = dataclasses.replace(BASE, util=np.arange(BASE.util.size, dtype=np.float64).reshape(BASE.util.shape) % 5 / 5)
"""GPUs of graded utilisation: which of them a share could get moves its noise score."""


SHARES = [request(1, share=300), request(1, memory="20Gi"), request(1, share=500, models="H100")]


@pytest.mark.parametrize("req", SHARES)
def test_shared_gpu_noise_follows_binds_expiry_snapshots_and_shapes(req: GpuRequest) -> None:
    score = NoiseScore(NoiseArgs())
    base = dataclasses.replace(BUSY, derived=SnapshotIndex())
    same = np.testing.assert_array_equal  # the same floats; NaN where no GPU could take the share
    first = every_row(score, req, base)
    assert req.shared
    same(first, row_alone(score, req, base))
    assert computed_for(score._shared_key, req, base) == base.n_nodes
    same(every_row(score, req, base), first)
    assert computed_for(score._shared_key, req, base) == base.n_nodes  # reused
    quietest = {"a": 0, "c": 1, "h": 2}  # GPUs a share could get, made busier by a co-tenant one by one
    assumed: dict[str, list[GpuAssignment]] = {}
    for n, (name, gpu_index) in enumerate(quietest.items()):
        assumed[name] = [shared(f"t{n}", gpu_index, milli=100)]
        bound = base.with_assumed(assumed)
        same(every_row(score, req, bound), row_alone(score, req, bound))
        assert computed_for(score._shared_key, req, base) == base.n_nodes + n + 1  # the charged row only
    same(every_row(score, req, base), first)  # the ledger entries expired
    busier = dataclasses.replace(base, util=np.full_like(base.util, 0.95))  # a new snapshot: every GPU busy
    after_snapshot = every_row(score, req, busier)
    assert not np.array_equal(after_snapshot, first, equal_nan=True)
    same(after_snapshot, row_alone(score, req, busier))
    other = request(1, share=900)  # another shape on the first snapshot
    same(every_row(score, other, base), row_alone(score, other, base))
    same(every_row(score, req, base), first)


def test_a_few_rows_read_the_verdicts_kept_while_those_rows_did_not_move() -> None:
    """A bind's check of its one node reads the shape's memo when that row's stamp has not moved since the memo
    computed it (the other rows may have moved), and computes it otherwise: the same verdict either way."""
    fit = FitFilter(FilterPolicy())
    base = fresh()
    req = request(2)
    every = np.arange(base.n_nodes, dtype=np.int64)
    verdicts = fit.filter(req, base, every, CycleContext(now=0.0)).tolist()
    holder = base.derive(fit._rows_key, lambda _: RowMemo(), shape_of(req))
    h = base.index["h"]
    bound = base.with_assumed({"h": [whole("n1", 0, 1, 2)]})  # node h cannot take two more GPUs now
    e = base.index["e"]
    assert holder.kept(bound, CycleContext(now=0.0), np.array([e])) is not None  # e did not move
    assert holder.kept(bound, CycleContext(now=0.0), np.array([h])) is None  # h did
    for r in range(base.n_nodes):
        one = np.array([r], dtype=np.int64)
        assert fit.filter(req, base, one, CycleContext(now=0.0)).tolist() == [verdicts[r]]
        assert fit.filter(req, bound, one, CycleContext(now=0.0)).tolist() == [verdicts[r] and r != h]
    assert verdicts[h]
    assert holder.computed_rows == base.n_nodes  # the few rows never computed into the memo
