"""The filters: does the pod fit the node GPU by GPU, and is the node's telemetry fresh enough to judge?

**fit**: a GPU is eligible when it is present, of an allowed model, big enough, free enough (a whole GPU unused, or
for a share enough thousandths and memory left), not at or above its slowdown temperature, not thermally throttling,
and not above the pod's ``kelvin.dev/max-temperature``. A node passes with ``count`` eligible GPUs, which for
``kelvin.dev/topology: nvlink-required`` must be pairwise linked by NVLink.

**telemetry**: with ``onStale: deny`` a node whose telemetry is stale or missing fails; with ``allow`` it is judged
on its last data.

Rejections are *unresolvable* (``FailedAndUnresolvableNodes``: preemption is not tried on the node) when the pod would
not fit even if every pod on the node left: no GPUs, wrong model, too few GPUs, GPUs too small, GPUs too hot or
throttling, no NVLink group big enough, or stale telemetry (evicting pods neither cools a GPU within the scheduling
cycle nor refreshes telemetry, so preempting for them would evict victims for nothing). They are *resolvable*
(``FailedNodes``) when only the GPUs' current use stands in the way.

Reasons are typed (:mod:`scheduler_plugin.policies.reasons`: one dataclass per kind) and built for a whole batch of
rejected rows: each check's figures are gathered with numpy and each distinct set of them is one object, worded once.
They are built only when a consumer asks for them (:meth:`FitFilter.reasons`: the extender's ``FailedNodes``, explain,
the simulator's report of a pod that fits nowhere), never on the way to a verdict: the per-row memo of verdicts and
the per-row memo of rejections are two, and the second is brought up to date only by :meth:`FitFilter.reasons`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..model import GIB, THERMAL_THROTTLE_MASK, FleetArrays, GpuRequest, Topology, throttle_reason_names
from ..model.gpu_models import unknown_items
from ..model.quantity import format_gib
from ..model.snapshot import IndexKey
from .base import BoolA, CycleContext, IntA, Rejection, StateKey
from .eligibility import (
    STATIC_COLUMNS,
    GpuLimits,
    capacity_ok,
    cycle_eligible,
    few_rows,
    limits_of,
    model_ok,
    size_ok,
    static_ok,
    too_hot,
)
from .policy_file import FilterPolicy
from .reasons import (
    Fits,
    GpuAboveMaxTemperature,
    GpuAtSlowdown,
    GpuComputeFull,
    GpuMemoryFull,
    GpusInUse,
    GpusTooSmall,
    GpuThrottling,
    NoGpus,
    NoNvlinkGroup,
    NoTelemetry,
    NvlinkGroupInUse,
    StaleTelemetry,
    TooFewGpus,
    WrongModel,
    celsius,
)
from .row_memo import RowMemo
from .topology import WIRING_COLUMNS, TopologyArgs, TopologyTables

ObjA = npt.NDArray[np.object_]

FIT_COLUMNS = tuple(dict.fromkeys((*STATIC_COLUMNS, *WIRING_COLUMNS, "gpu_count", "gpu_index", "models")))
"""The telemetry columns the fit filter's verdicts and reasons read (the capacity columns are content-checked)."""

_MAX_SHAPES = 64


def shape_of(req: GpuRequest) -> tuple[object, ...]:
    """Everything of ``req`` the fit filter's verdicts and reasons read (its counts, shares, models, topology,
    temperature cap): pods of one shape share one :class:`~.row_memo.RowMemo`."""
    return (req.count, req.milli, req.memory_bytes, req.models, req.topology, req.max_temperature)


FIT_ROWS_KEY: StateKey[tuple[FleetArrays, GpuRequest, BoolA]] = StateKey("kelvin.fit_rows")
"""Cycle state: (fleet, request, verdict of every row) of the cycle's fit memo lookup (filter and its reasons read
it once)."""


class _Check(IntEnum):
    """The fit checks in the order they are judged: a row is rejected by the first one it fails."""

    NO_GPUS = 0
    MODEL = 1
    """Too few GPUs of an allowed model (of any model, when the pod names none)."""
    SIZE = 2
    HEAT = 3
    NVLINK = 4
    """No NVLink group of the pod's size among the statically usable GPUs."""
    FREE = 5
    NVLINK_FREE = 6
    """No NVLink group of the pod's size among the free ones."""
    FITS = 7


def _fill(
    out: npt.NDArray[np.object_], at: IntA, figures: Sequence[npt.NDArray[Any]], make: Callable[[int], Rejection]
) -> None:
    """``out[at]``: one :class:`Rejection` per distinct row of ``figures`` (columns aligned with ``at``), made by
    ``make(i)`` from the figures of a representative ``at[i]``; rows alike share the object."""
    if at.size == 0:
        return
    keys = np.ascontiguousarray(np.stack([np.asarray(c, dtype=np.int64) for c in figures], axis=1))
    flat = keys.view(np.dtype((np.void, keys.dtype.itemsize * keys.shape[1]))).ravel()
    _, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
    made = np.empty(first.size, dtype=object)
    for u, i in enumerate(first.tolist()):
        made[u] = make(i)
    out[at] = made[inverse.reshape(-1)]


class TelemetryFilter:
    """Rejects nodes with stale or missing telemetry when ``onStale`` is ``deny``."""

    name = "telemetry"

    def __init__(self, max_age_s: float, on_stale: Literal["allow", "deny"]) -> None:
        self.max_age_s = max_age_s
        self.on_stale = on_stale

    def filter(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> BoolA:
        if not req.wants_gpu or self.on_stale == "allow" or ctx.stale is None:
            return np.ones(idx.shape[0], dtype=np.bool_)
        return np.asarray(~ctx.stale[idx], dtype=np.bool_)

    def reasons(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> list[Rejection]:
        """One reason per cause, never per age: kube-scheduler groups nodes by their reason text, so a reason that
        named each node's age would split one outage into a group per second. The age is in
        :meth:`explain`."""
        missing = ~np.isfinite(ctx.now - fleet.observed_at[rows])
        never, stale = NoTelemetry(self.max_age_s), StaleTelemetry(self.max_age_s)
        return [never if m else stale for m in missing.tolist()]

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> Rejection:
        age = float(ctx.now - fleet.observed_at[row])
        if not np.isfinite(age):
            return NoTelemetry(self.max_age_s)
        return StaleTelemetry(self.max_age_s, int(age))


class FitFilter:
    """The pod's GPUs fit the node GPU by GPU: capacity, model, size, heat and required NVLink topology."""

    name = "fit"

    def __init__(self, policy: FilterPolicy, topology: TopologyArgs | None = None) -> None:
        self.policy = policy
        self.limits = GpuLimits(
            thermal_hard_limits=policy.thermal_hard_limits,
            throttle_hard_limit=policy.throttle_hard_limit,
            slowdown_margin_celsius=policy.slowdown_margin_celsius,
        )
        targs = topology or TopologyArgs()
        self.tables = TopologyTables(targs.qualities(), targs.worst_link_share)
        self._rows_key = IndexKey[RowMemo]("fit.rows", FIT_COLUMNS, limit=_MAX_SHAPES)
        """Snapshot index: this filter's :class:`~.row_memo.RowMemo` of verdicts per request shape (its own key: its
        limits and tables are its own)."""
        self._why_key = IndexKey[RowMemo]("fit.why", FIT_COLUMNS, limit=_MAX_SHAPES)
        """Snapshot index: the :class:`~.row_memo.RowMemo` of rejections per request shape (None where a row passes),
        kept apart from the verdicts' so that only :meth:`reasons` pays for them."""

    def prepare(self, fleet: FleetArrays) -> None:
        """When a snapshot is published: its wiring patterns (the NVLink cliques this filter checks)."""
        self.tables.for_fleet(fleet)

    def _needs_clique(self, req: GpuRequest) -> bool:
        return req.topology is Topology.NVLINK_REQUIRED and req.count >= 2

    def filter(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> BoolA:
        if not req.wants_gpu:
            return np.ones(idx.shape[0], dtype=np.bool_)
        ok = self._memo(req, fleet, idx, ctx)
        if ok is not None:
            return ok[idx]
        return self._filter(req, fleet, idx, ctx)

    def _memo(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> BoolA | None:
        """The verdict of every row of ``fleet`` from this shape's :class:`~.row_memo.RowMemo`, once per cycle; None
        for limits other than this filter's, or a few candidates not all kept by the memo (computed directly)."""
        hit = ctx.state.find(FIT_ROWS_KEY)
        if hit is not None and hit[0] is fleet and hit[1] is req:
            return hit[2]
        if limits_of(ctx) != self.limits:
            return None
        memo = fleet.derive(self._rows_key, lambda _: RowMemo(), shape_of(req))
        if few_rows(idx.size, fleet):  # the verdicts kept, if none of these rows moved since (a bind's node)
            kept = memo.kept(fleet, ctx, idx)
            return None if kept is None else kept[0]
        (ok,) = memo.values(fleet, ctx, lambda f, rows: (self._verdicts(req, f, rows),))
        ctx.state.write(FIT_ROWS_KEY, (fleet, req, ok))
        return ok

    def _verdicts(self, req: GpuRequest, fleet: FleetArrays, rows: IntA) -> BoolA:
        """The verdict memo's values of ``rows``, as computed without the memo."""
        return self._fits(req, fleet, rows, static_ok(req, fleet, rows, self.limits) & capacity_ok(req, fleet, rows))

    def _rejections(self, req: GpuRequest, fleet: FleetArrays, ok: BoolA, rows: IntA) -> ObjA:
        """The rejection memo's values of ``rows``: the rejection of each row that fails by ``ok`` (the verdict of
        every row this cycle), None where it passes."""
        why = np.full(rows.size, None, dtype=object)
        bad = (~ok[rows]).nonzero()[0]
        if bad.size:
            why[bad] = self._reasons(req, fleet, rows[bad])
        return why

    def _filter(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> BoolA:
        if limits_of(ctx) == self.limits:
            elig = cycle_eligible(req, fleet, idx, ctx)
        else:
            elig = static_ok(req, fleet, idx, self.limits) & capacity_ok(req, fleet, idx)
        return self._fits(req, fleet, idx, elig)

    def _fits(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, elig: BoolA) -> BoolA:
        """(n,) ``count`` of the row's GPUs are eligible (``elig``), NVLink-linked when the pod requires it."""
        ok = elig.sum(axis=1) >= req.count
        if self._needs_clique(req):
            ok &= self.tables.has_clique(fleet, idx, elig, req.count)
        return np.asarray(ok, dtype=np.bool_)

    def reasons(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> list[Rejection]:
        """Why each of ``rows`` fails (rows that pass get :class:`Fits`, for explain). The figures of each check are
        gathered with numpy for the rows it rejects; each distinct set of figures is one object, worded once. After
        :meth:`filter` of many candidates in the same cycle, the rejections are the memo's."""
        hit = ctx.state.find(FIT_ROWS_KEY)
        # when every one of the rows fails, the rejection memo (brought up to date here, never by filter) holds its
        # rejection
        if hit is not None and hit[0] is fleet and hit[1] is req and not hit[2][rows].any():
            ok = hit[2]
            memo = fleet.derive(self._why_key, lambda _: RowMemo(), shape_of(req))
            (why,) = memo.values(fleet, ctx, lambda f, r: (self._rejections(req, f, ok, r),))
            reasons: list[Rejection] = why[rows].tolist()
            return reasons
        return self._reasons(req, fleet, rows)

    def _reasons(self, req: GpuRequest, fleet: FleetArrays, rows: IntA) -> list[Rejection]:
        k = req.count
        mo = model_ok(req, fleet, rows)
        so = mo & size_ok(req, fleet, rows)
        hot = too_hot(req, fleet, rows, self.limits)
        st = so & ~hot
        el = st & capacity_ok(req, fleet, rows)
        n_mo, n_so, n_st, n_el = mo.sum(1), so.sum(1), st.sum(1), el.sum(1)
        clique = self._needs_clique(req)
        cl_st = self.tables.has_clique(fleet, rows, st, k) if clique else np.ones(rows.shape[0], dtype=np.bool_)
        cl_el = self.tables.has_clique(fleet, rows, el, k) if clique else np.ones(rows.shape[0], dtype=np.bool_)
        failed = {
            _Check.NO_GPUS: fleet.gpu_count[rows] == 0,
            _Check.MODEL: n_mo < k,
            _Check.SIZE: n_so < k,
            _Check.HEAT: n_st < k,
            _Check.NVLINK: ~cl_st,
            _Check.FREE: n_el < k,
            _Check.NVLINK_FREE: ~cl_el,
        }
        check = np.full(rows.shape[0], _Check.FITS, dtype=np.int8)
        for c, cond in reversed(failed.items()):  # the first check a row fails is its reason
            check[cond] = c
        out = np.empty(rows.shape[0], dtype=object)
        out[check == _Check.FITS] = Fits()
        out[check == _Check.NO_GPUS] = NoGpus(req.describe())
        self._by_model(req, fleet, rows, np.flatnonzero(check == _Check.MODEL), out)
        m = np.flatnonzero(check == _Check.SIZE)
        largest = np.where(mo[m], fleet.mem_total[rows[m]], 0).max(axis=1, initial=0)
        _fill(out, m, [largest], lambda i: GpusTooSmall(req.memory_bytes or 0, int(largest[i])))
        self._by_heat(req, fleet, rows, np.flatnonzero(check == _Check.HEAT), so & hot, n_st, n_so, out)
        m = np.flatnonzero(check == _Check.NVLINK)
        _fill(out, m, [n_st[m]], lambda i: NoNvlinkGroup(k, int(n_st[m[i]])))
        m = np.flatnonzero(check == _Check.FREE)
        if req.shared:
            self._by_room(req, fleet, rows, m, st, out)
        else:
            _fill(out, m, [n_el[m], n_st[m]], lambda i: GpusInUse(int(n_el[m[i]]), int(n_st[m[i]]), k))
        m = np.flatnonzero(check == _Check.NVLINK_FREE)
        _fill(out, m, [n_el[m]], lambda i: NvlinkGroupInUse(int(n_el[m[i]]), k))
        reasons: list[Rejection] = out.tolist()
        return reasons

    def _by_model(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, m: IntA, out: npt.NDArray[np.object_]) -> None:
        """Too few GPUs of an allowed model: the node's models, one object per distinct model layout."""
        if m.size == 0:
            return
        layout = fleet.model_id[rows[m]]

        def made(i: int) -> Rejection:
            counts = Counter(fleet.models[x] for x in layout[i].tolist() if x >= 0)
            if req.models is None:
                return TooFewGpus(req.count, sum(counts.values()))
            return WrongModel(
                req.count, tuple(sorted(req.models)), tuple(sorted(counts.items())), tuple(unknown_items(req.models))
            )

        _fill(out, m, list(layout.T), made)

    def _by_heat(
        self,
        req: GpuRequest,
        fleet: FleetArrays,
        rows: IntA,
        m: IntA,
        hot: BoolA,
        n_st: IntA,
        n_so: IntA,
        out: npt.NDArray[np.object_],
    ) -> None:
        """Too few GPUs cool enough: the hottest offending GPU (of those that would otherwise fit) and its cause."""
        if m.size == 0:
            return
        rm = rows[m]
        temp, slowdown = fleet.temp[rm], fleet.slowdown[rm]
        j = np.where(hot[m], temp - slowdown, -np.inf).argmax(axis=1)
        at = (np.arange(m.size), j)
        gpu = fleet.gpu_index[rm, j]
        t10, s10 = np.rint(temp[at] * 10), np.rint(slowdown[at] * 10)  # 0.1 °C, as worded
        throttle = fleet.throttle[rm, j] & THERMAL_THROTTLE_MASK
        lim = self.limits

        def made(i: int) -> Rejection:
            t, s = float(t10[i]) / 10, float(s10[i]) / 10
            g, cool, suitable, k = int(gpu[i]), int(n_st[m[i]]), int(n_so[m[i]]), req.count
            if lim.thermal_hard_limits and t >= s - lim.slowdown_margin_celsius:
                return GpuAtSlowdown(g, cool, suitable, k, t, s, lim.slowdown_margin_celsius)
            if lim.throttle_hard_limit and throttle[i]:
                return GpuThrottling(g, cool, suitable, k, tuple(throttle_reason_names(int(throttle[i]))))
            return GpuAboveMaxTemperature(g, cool, suitable, k, t, req.max_temperature or 0.0)

        _fill(out, m, [gpu, t10, s10, throttle, n_st[m], n_so[m]], made)

    def _by_room(
        self, req: GpuRequest, fleet: FleetArrays, rows: IntA, m: IntA, st: BoolA, out: npt.NDArray[np.object_]
    ) -> None:
        """A share that fits no free GPU now: the roomiest statically usable GPU, by memory and by compute."""
        if m.size == 0:
            return
        rm = rows[m]
        j_mem = np.where(st[m], fleet.free_mem[rm], -1).argmax(axis=1)
        j_milli = np.where(st[m], fleet.free_milli[rm], -1).argmax(axis=1)
        gpu_mem, gpu_milli = fleet.gpu_index[rm, j_mem], fleet.gpu_index[rm, j_milli]
        free_mem = fleet.free_mem[rm, j_mem]
        free_tenths = np.floor(free_mem / GIB * 10)  # 0.1 GiB, as worded
        free_milli, total = fleet.free_milli[rm, j_milli], fleet.mem_total[rm, j_milli]
        pool = req.memory_bytes
        short = free_mem < pool if pool is not None else np.zeros(m.size, dtype=np.bool_)

        def made(i: int) -> Rejection:
            if pool is not None and short[i]:
                return GpuMemoryFull(int(gpu_mem[i]), float(free_tenths[i]) / 10, pool)
            need = int(req.demand_milli(np.array([total[i]], dtype=np.int64))[0])
            return GpuComputeFull(int(gpu_milli[i]), int(free_milli[i]), need)

        _fill(out, m, [gpu_mem, free_tenths, gpu_milli, free_milli, total, short], made)

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> Rejection:
        return self._reasons(req, fleet, np.array([row], dtype=np.int64))[0]

    def gpu_lines(self, req: GpuRequest, fleet: FleetArrays, row: int) -> list[str]:
        """One line per GPU of the node: what it offers and whether the pod could use it (for explain)."""
        idx = np.array([row], dtype=np.int64)
        mo, so = model_ok(req, fleet, idx)[0], size_ok(req, fleet, idx)[0]
        hot = too_hot(req, fleet, idx, self.limits)[0]
        cap = capacity_ok(req, fleet, idx)[0]
        lines = []
        for j in range(fleet.max_gpus):
            if not fleet.gpu_present[row, j]:
                continue
            model = fleet.models[int(fleet.model_id[row, j])]
            desc = (
                f"gpu {int(fleet.gpu_index[row, j])} ({model}, {format_gib(int(fleet.mem_total[row, j]))}): "
                f"{format_gib(int(fleet.free_mem[row, j]))} and {int(fleet.free_milli[row, j]) / 10:g}% free, "
                f"{celsius(float(fleet.temp[row, j]))} (slowdown {celsius(float(fleet.slowdown[row, j]))})"
            )
            if not req.wants_gpu:
                verdict = "not needed"
            elif not mo[j]:
                verdict = "not usable: model not allowed"
            elif not so[j]:
                verdict = "not usable: too small for the pod's memory"
            elif hot[j]:
                verdict = "not usable: too hot"
            elif not cap[j]:
                verdict = "not usable now: in use"
            else:
                verdict = "usable"
            lines.append(f"{desc}; {verdict}")
        return lines
