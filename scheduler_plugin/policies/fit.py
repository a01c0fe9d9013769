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

Reasons are built for a whole batch of rejected rows: key figures are gathered with numpy and each distinct key is
worded once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np

from ..model import GIB, THERMAL_THROTTLE_MASK, FleetArrays, GpuRequest, Topology, throttle_reason_names
from ..model import annotations as ann
from ..model.gpu_models import unknown_items
from ..model.quantity import format_gib
from .base import BoolA, CycleContext, IntA, Rejection
from .config import FilterPolicy
from .eligibility import (
    GpuLimits,
    capacity_ok,
    cycle_eligible,
    limits_of,
    model_ok,
    size_ok,
    static_ok,
    too_hot,
)
from .topology import TopologyArgs, TopologyTables


def _celsius(t: float) -> str:
    r = round(t, 1)
    return f"{r:.0f} °C" if r == int(r) else f"{r:.1f} °C"


def _gib_req(n: int) -> str:
    return f"{n / GIB:g} GiB"


def _worded(keys: IntA, word: Callable[[tuple[int, ...]], Rejection]) -> list[Rejection]:
    """Word each distinct row of the (n, K) integer key matrix once; return one Rejection per row."""
    if keys.shape[0] == 0:
        return []
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    flat = keys.view(np.dtype((np.void, keys.dtype.itemsize * keys.shape[1]))).ravel()
    _, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
    worded = np.empty(first.size, dtype=object)
    for u, r in enumerate(first.tolist()):
        worded[u] = word(tuple(int(x) for x in keys[r]))
    out: list[Rejection] = worded[inverse.reshape(-1)].tolist()
    return out


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
        named each node's age would split one outage into a group per second (issue 20, defect 9). The age is in
        :meth:`explain`."""
        missing = ~np.isfinite(ctx.now - fleet.observed_at[rows])
        never, stale = self._missing(), self._stale()
        return [never if m else stale for m in missing.tolist()]

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> Rejection:
        age = float(ctx.now - fleet.observed_at[row])
        if not np.isfinite(age):
            return self._missing()
        return self._stale(f"{int(age)} s old, ")

    def _missing(self) -> Rejection:
        return Rejection(
            f"no telemetry from this node yet (limit {self.max_age_s:g} s)", unresolvable=True, code="stale_telemetry"
        )

    def _stale(self, age: str = "") -> Rejection:
        return Rejection(
            f"stale telemetry ({age}older than {self.max_age_s:g} s: telemetry.maxAgeSeconds)",
            unresolvable=True,
            code="stale_telemetry",
        )


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

    def _needs_clique(self, req: GpuRequest) -> bool:
        return req.topology is Topology.NVLINK_REQUIRED and req.count >= 2

    def filter(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> BoolA:
        if not req.wants_gpu:
            return np.ones(idx.shape[0], dtype=np.bool_)
        if limits_of(ctx) == self.limits:
            elig = cycle_eligible(req, fleet, idx, ctx)
        else:
            elig = static_ok(req, fleet, idx, self.limits) & capacity_ok(req, fleet, idx)
        ok = elig.sum(axis=1) >= req.count
        if self._needs_clique(req):
            ok &= self.tables.has_clique(fleet, idx, elig, req.count)
        return np.asarray(ok, dtype=np.bool_)

    def reasons(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> list[Rejection]:
        """Why each of ``rows`` fails (rows that pass get a 'fits' verdict, for explain)."""
        k = req.count
        mo = model_ok(req, fleet, rows)
        so = mo & size_ok(req, fleet, rows)
        hot = too_hot(req, fleet, rows, self.limits)
        st = so & ~hot
        el = st & capacity_ok(req, fleet, rows)
        n_present = fleet.gpu_count[rows]
        n_mo, n_so, n_st, n_el = mo.sum(1), so.sum(1), st.sum(1), el.sum(1)
        clique = self._needs_clique(req)
        cl_st = self.tables.has_clique(fleet, rows, st, k) if clique else np.ones(rows.shape[0], dtype=np.bool_)
        cl_el = self.tables.has_clique(fleet, rows, el, k) if clique else np.ones(rows.shape[0], dtype=np.bool_)

        cat = np.full(rows.shape[0], 8, dtype=np.int8)  # 8 = fits
        for code, cond in reversed(
            list(enumerate([n_present == 0, n_mo < k, n_so < k, n_st < k, ~cl_st, n_el < k, ~cl_el]))
        ):
            cat[cond] = code
        n = rows.shape[0]
        keys = np.zeros((n, 7), dtype=np.int64)
        keys[:, 0] = cat
        # Figures per category, gathered only for the rows in it.
        m = np.nonzero(cat == 1)[0]
        if m.size:  # the node's models: one id per distinct model layout, worded from a representative row
            layout = np.ascontiguousarray(fleet.model_id[rows[m]])
            lv = layout.view(np.dtype((np.void, layout.dtype.itemsize * layout.shape[1]))).ravel()
            _, rep, inv = np.unique(lv, return_index=True, return_inverse=True)
            keys[m, 1] = rows[m][rep][inv.reshape(-1)]
        m = np.nonzero(cat == 2)[0]
        if m.size:
            keys[m, 1] = np.where(mo[m], fleet.mem_total[rows[m]], 0).max(axis=1)
        m = np.nonzero(cat == 3)[0]
        if m.size:  # the hottest offending GPU among the ones that would otherwise fit
            rm = rows[m]
            temp = fleet.temp[rm]
            j = np.where(so[m] & hot[m], temp - fleet.slowdown[rm], -np.inf).argmax(axis=1)
            keys[m, 1] = fleet.gpu_index[rm, j]
            keys[m, 2] = np.rint(temp[np.arange(m.size), j] * 10)
            keys[m, 3] = np.rint(fleet.slowdown[rm, j] * 10)
            keys[m, 4] = fleet.throttle[rm, j]
            keys[m, 5] = n_st[m]
            keys[m, 6] = n_so[m]
        m = np.nonzero(cat == 4)[0]
        keys[m, 1] = n_st[m]
        m = np.nonzero(cat == 5)[0]
        if m.size and req.shared:  # the roomiest statically usable GPU, by memory and by compute
            rm = rows[m]
            j_mem = np.where(st[m], fleet.free_mem[rm], -1).argmax(axis=1)
            j_milli = np.where(st[m], fleet.free_milli[rm], -1).argmax(axis=1)
            free_mem = fleet.free_mem[rm, j_mem]
            keys[m, 1] = fleet.gpu_index[rm, j_mem]
            keys[m, 2] = np.floor(free_mem / GIB * 10)  # 0.1 GiB, as worded
            keys[m, 3] = fleet.gpu_index[rm, j_milli]
            keys[m, 4] = fleet.free_milli[rm, j_milli]
            keys[m, 5] = fleet.mem_total[rm, j_milli]
            if req.memory_bytes is not None:
                keys[m, 6] = free_mem < req.memory_bytes
        elif m.size:
            keys[m, 1] = n_el[m]
            keys[m, 2] = n_st[m]
        m = np.nonzero(cat == 6)[0]
        keys[m, 1] = n_el[m]
        return _worded(keys, lambda key: self._word(req, fleet, key))

    def _word(self, req: GpuRequest, fleet: FleetArrays, key: tuple[int, ...]) -> Rejection:  # noqa: C901
        c = key[0]
        k = req.count
        one = "GPU" if k == 1 else "GPUs"
        if c == 0:
            return Rejection(f"node has no GPUs; the pod needs {req.describe()}", unresolvable=True, code="gpu_count")
        if c == 1:
            ids = fleet.model_id[key[1]].tolist()
            counts: dict[str, int] = {}
            for m in ids:
                if m >= 0:
                    counts[fleet.models[m]] = counts.get(fleet.models[m], 0) + 1
            has = ", ".join(f"{n} {m}" for m, n in sorted(counts.items())) or "no GPUs"
            if req.models is None:
                return Rejection(
                    f"needs {k} {one}; node has {sum(counts.values())} in total", unresolvable=True, code="gpu_count"
                )
            wanted = " or ".join(sorted(req.models))
            unknown = unknown_items(req.models)
            hint = (
                f" ({', '.join(unknown)}: not a GPU family kelvin knows; {ann.GPU_MODELS} items match by family, "
                "e.g. A100, H100-80GB, L40S)"
                if unknown
                else ""
            )
            return Rejection(
                f"needs {k} {one} of model {wanted}; node has {has}{hint}", unresolvable=True, code="gpu_model"
            )
        if c == 2:
            mem = req.memory_bytes or 0
            return Rejection(
                f"the pod needs {_gib_req(mem)} on one GPU; the largest allowed GPU here has {format_gib(key[1])}",
                unresolvable=True,
                code="gpu_memory",
            )
        if c == 3:
            _, gi, t10, s10, thr, n_st, n_so = key
            t, s = t10 / 10, s10 / 10
            margin = self.limits.slowdown_margin_celsius
            if self.limits.thermal_hard_limits and t >= s - margin:
                if margin > 0:
                    what = f"gpu {gi} is at {_celsius(t)}, within {margin:g} °C of its slowdown threshold {_celsius(s)}"
                else:
                    what = f"gpu {gi} is at {_celsius(t)}, at or above its slowdown threshold {_celsius(s)}"
            elif self.limits.throttle_hard_limit and thr & THERMAL_THROTTLE_MASK:
                names = ", ".join(throttle_reason_names(thr & THERMAL_THROTTLE_MASK))
                what = f"gpu {gi} is thermally throttling ({names})"
            else:
                limit = _celsius(req.max_temperature or 0)
                what = f"gpu {gi} is at {_celsius(t)}, above the pod's {ann.MAX_TEMPERATURE} of {limit}"
            return Rejection(
                f"{what}; {n_st} of {n_so} GPUs are cool enough, the pod needs {k}", unresolvable=True, code="thermal"
            )
        if c == 4:
            return Rejection(
                f"no {k} of the node's {key[1]} usable GPUs are all linked by NVLink; "
                f"the pod sets {ann.TOPOLOGY}={Topology.NVLINK_REQUIRED.value}",
                unresolvable=True,
                code="topology",
            )
        if c == 5:
            if req.shared:
                _, gm, free_mem10, gc, free_milli, total, mem_short = key
                if req.memory_bytes is not None and mem_short:
                    return Rejection(
                        f"gpu {gm} has {free_mem10 / 10:.1f} GiB free; the pod needs "
                        f"{_gib_req(req.memory_bytes)} on one GPU",
                        code="gpu_memory",
                    )
                need = int(req.demand_milli(np.array([total], dtype=np.int64))[0])
                return Rejection(
                    f"gpu {gc} has {free_milli / 10:g}% of its capacity free; the pod needs {need / 10:g}% of one GPU",
                    code="gpu_memory",
                )
            _, n_el, n_st, *_ = key
            return Rejection(f"{n_el} of {n_st} usable GPUs are free; the pod needs {k} whole {one}", code="gpu_count")
        if c == 6:
            return Rejection(
                f"{key[1]} GPUs are free but no {k} of them are all linked by NVLink; "
                f"the pod sets {ann.TOPOLOGY}={Topology.NVLINK_REQUIRED.value}",
                code="topology",
            )
        return Rejection("the pod fits this node")

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> Rejection:
        return self.reasons(req, fleet, np.array([row], dtype=np.int64), ctx)[0]

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
                f"{_celsius(float(fleet.temp[row, j]))} (slowdown {_celsius(float(fleet.slowdown[row, j]))})"
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
