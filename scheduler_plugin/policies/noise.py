"""Noise: keep shared-GPU pods away from busy, crowded or erroring co-tenants.

Per GPU, co-tenant pressure is a weighted mean of four terms in 0..1: SM utilisation, memory-controller utilisation,
memory pressure (used / total) and crowding (kelvin tenants / ``tenantScale``). XID errors scale it down::

    pressure = (wU*util + wM*memUtil + wP*used/total + wT*min(1, tenants/tenantScale)) / (wU + wM + wP + wT)
    quiet    = (1 - pressure) * (1 - min(1, xid / xidScale))

* a share of one GPU: raw = the quietest GPU the pod could use;
* whole GPUs do not share SMs or memory, so only the node matters: raw = 1 - wholeXidWeight * min(1, node xid /
  xidScale) - wholePressureWeight * mean pressure of the node's GPUs (shared PCIe, host memory, power).

Normalised absolutely (``normalize.unit``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from ..model import FleetArrays, GpuRequest
from ..model.snapshot import IndexKey
from .base import BoolA, CycleContext, FloatA, IntA
from .eligibility import STATIC_COLUMNS, GpuLimits, cycle_eligible, eligible_gpus, few_rows, limits_of
from .fragmentation.row_stamps import changed_rows
from .normalize import unit
from .policy_file import CamelModel
from .row_memo import RECOMPUTE_ALL_SHARE, RowMemo


class NoiseArgs(CamelModel):
    util_weight: float = Field(0.35, ge=0)
    """Weight of SM utilisation in a GPU's pressure."""
    mem_util_weight: float = Field(0.15, ge=0)
    """Weight of memory-controller (bandwidth) utilisation."""
    memory_pressure_weight: float = Field(0.3, ge=0)
    """Weight of memory used / memory total."""
    tenants_weight: float = Field(0.2, ge=0)
    """Weight of crowding (number of kelvin tenants on the GPU)."""
    tenant_scale: float = Field(4.0, gt=0)
    """Tenants at which crowding counts fully."""
    xid_scale: float = Field(4.0, gt=0)
    """XID errors at which a GPU (or node, for whole-GPU pods) counts as fully erroring."""
    whole_xid_weight: float = Field(0.6, ge=0, le=1)
    """Whole-GPU pods: weight of the node's XID errors."""
    whole_pressure_weight: float = Field(0.2, ge=0, le=1)
    """Whole-GPU pods: weight of the node's mean GPU pressure."""

    @model_validator(mode="after")
    def _some_weight(self) -> NoiseArgs:
        if self.util_weight + self.mem_util_weight + self.memory_pressure_weight + self.tenants_weight <= 0:
            raise ValueError(
                "at least one of utilWeight, memUtilWeight, memoryPressureWeight, tenantsWeight must be > 0"
            )
        return self


def _telemetry_terms(fleet: FleetArrays, idx: IntA, args: NoiseArgs) -> FloatA:
    """(n, G) the weighted pressure terms that come from telemetry (all but crowding), not yet divided."""
    total = np.maximum(fleet.mem_total[idx], 1)
    return (
        args.util_weight * np.clip(fleet.util[idx], 0, 1)
        + args.mem_util_weight * np.clip(fleet.mem_util[idx], 0, 1)
        + args.memory_pressure_weight * np.clip(fleet.mem_used[idx] / total, 0, 1)
    )


def _pressure(terms: FloatA, tenants: npt.NDArray[np.int32], present: BoolA, args: NoiseArgs) -> FloatA:
    wsum = args.util_weight + args.mem_util_weight + args.memory_pressure_weight + args.tenants_weight
    terms = terms + args.tenants_weight * np.minimum(np.maximum(tenants / args.tenant_scale, 0), 1)  # np.clip, faster
    return np.where(present, terms / wsum, 0.0)


def _xid_factor(fleet: FleetArrays, idx: IntA, args: NoiseArgs) -> FloatA:
    return np.asarray(1.0 - np.clip(fleet.xid[idx] / args.xid_scale, 0, 1), dtype=np.float64)


def gpu_pressure(fleet: FleetArrays, idx: IntA, args: NoiseArgs) -> FloatA:
    """(n, G) co-tenant pressure 0..1 per GPU (0 for padding)."""
    return _pressure(_telemetry_terms(fleet, idx, args), fleet.tenants[idx], fleet.gpu_present[idx], args)


def gpu_quiet(fleet: FleetArrays, idx: IntA, args: NoiseArgs) -> FloatA:
    """(n, G) 1 - pressure, scaled down by the GPU's XID errors."""
    return (1.0 - gpu_pressure(fleet, idx, args)) * _xid_factor(fleet, idx, args)


#: The telemetry columns the noise score reads (never written in place; ``tenants`` is, so it is read per request).
TELEMETRY_COLUMNS = ("util", "mem_util", "mem_used", "mem_total", "xid", "gpu_present")
#: The telemetry columns the score of a share reads: its own and those of the GPUs the pod could get.
SHARED_COLUMNS = tuple(dict.fromkeys((*TELEMETRY_COLUMNS, *STATIC_COLUMNS, "models")))


@dataclass(frozen=True, slots=True)
class _FleetNoise:
    """What the noise score needs from telemetry alone, for every node: computed once per snapshot."""

    terms: FloatA  # (N, G) telemetry pressure terms (see ``_telemetry_terms``)
    xid_factor: FloatA  # (N, G) 1 - min(1, xid / xidScale)
    node_xid: FloatA  # (N,) min(1, node xid / xidScale)
    n_present: npt.NDArray[np.int64]  # (N,) GPUs, at least 1
    silent: bool
    """No GPU reports any utilisation, memory use or XID error (a fleet without that telemetry, such as a replayed
    trace): with crowding weighed 0 (the default policy's) or no tenant anywhere, every GPU is perfectly quiet."""


class _NodeQuiet:
    """The whole-GPU score of every node, with the ``tenants`` column it was computed from. Kept in the snapshot
    index under the telemetry columns it reads (a replaced column: a new holder); the rows whose ``tenants`` differ
    from the copy kept are recomputed (a bind adds a tenant to one row), the rest reused. Copy on write: the values
    handed out are never written. Thread-safe."""

    __slots__ = ("_lock", "_state")

    def __init__(self) -> None:
        self._state: tuple[npt.NDArray[np.int32], FloatA] | None = None
        self._lock = threading.Lock()

    def values(self, fleet: FleetArrays, compute: Callable[[IntA], FloatA]) -> FloatA:
        tenants = fleet.tenants
        with self._lock:
            state = self._state
            if state is not None and state[0].shape == tenants.shape:
                rows = changed_rows((state[0], tenants))
                if not rows.size:
                    return state[1]
                if rows.size * RECOMPUTE_ALL_SHARE < fleet.n_nodes:
                    kept_tenants, values = state[0].copy(), state[1].copy()
                    kept_tenants[rows] = tenants[rows]
                    values[rows] = compute(rows)
                    self._state = (kept_tenants, values)
                    return values
            values = compute(np.arange(fleet.n_nodes, dtype=np.int64))
            self._state = (tenants.copy(), values)
            return values


class NoiseScore:
    """Co-tenant pressure on shared GPUs; node-level XID errors and load for whole GPUs."""

    name = "noise"

    def __init__(self, args: NoiseArgs) -> None:
        self.args = args
        self._noise_key = IndexKey[_FleetNoise]("noise.telemetry", TELEMETRY_COLUMNS)
        self._quiet_key = IndexKey[_NodeQuiet]("noise.node_rows", TELEMETRY_COLUMNS)
        self._shared_key = IndexKey[RowMemo]("noise.shared_rows", SHARED_COLUMNS, limit=64)
        """Snapshot index: the raw score of every row per shape of a share (:class:`~.row_memo.RowMemo`: a row's
        tenants and the GPUs the pod could get there are its capacity columns, a row stamp's content)."""

    def prepare(self, fleet: FleetArrays) -> None:
        fleet.derive(self._noise_key, self._noise_of)

    def _noise_of(self, fleet: FleetArrays) -> _FleetNoise:
        rows = np.arange(fleet.n_nodes, dtype=np.int64)
        present = fleet.gpu_present
        terms = _telemetry_terms(fleet, rows, self.args)
        xid_factor = _xid_factor(fleet, rows, self.args)
        return _FleetNoise(
            terms=terms,
            xid_factor=xid_factor,
            node_xid=np.clip(np.where(present, fleet.xid, 0).sum(axis=1) / self.args.xid_scale, 0, 1),
            n_present=np.maximum(present.sum(axis=1), 1),
            silent=not np.where(present, terms, 0.0).any() and bool((np.where(present, xid_factor, 1.0) == 1.0).all()),
        )

    def _quiet(self, fleet: FleetArrays, fn: _FleetNoise) -> bool:
        """Every GPU is perfectly quiet now (pressure 0, no XID error): the score tells no node from another, and a
        node scores 1 (whole GPUs), or 1 where the pod could get a GPU (a share), NaN where not, what the general
        computation gives there."""
        return fn.silent and (self.args.tenants_weight == 0 or not fleet.tenants.any())

    def _node(self, fleet: FleetArrays, idx: IntA, fn: _FleetNoise) -> FloatA:
        mean_p = _pressure(fn.terms[idx], fleet.tenants[idx], fleet.gpu_present[idx], self.args).sum(axis=1)
        mean_p = mean_p / fn.n_present[idx]
        raw = 1.0 - self.args.whole_xid_weight * fn.node_xid[idx] - self.args.whole_pressure_weight * mean_p
        return np.asarray(np.minimum(np.maximum(raw, 0.0), 1.0), dtype=np.float64)  # np.clip, faster

    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        if idx.size == 0:
            return np.zeros(0)
        fn = fleet.derive(self._noise_key, self._noise_of)
        if not req.shared:
            if self._quiet(fleet, fn):
                return np.ones(idx.shape[0], dtype=np.float64)
            if few_rows(idx.size, fleet):
                return self._node(fleet, idx, fn)
            memo = fleet.derive(self._quiet_key, lambda _: _NodeQuiet())
            return np.asarray(memo.values(fleet, lambda rows: self._node(fleet, rows, fn))[idx], dtype=np.float64)
        if few_rows(idx.size, fleet):
            return self._shared(fleet, idx, fn, cycle_eligible(req, fleet, idx, ctx))
        limits = limits_of(ctx)
        shape = (req.count, req.milli, req.memory_bytes, req.models, req.max_temperature, limits)
        rows_memo = fleet.derive(self._shared_key, lambda _: RowMemo(), shape)
        (raw,) = rows_memo.values(fleet, ctx, lambda f, rows: (self._shared_rows(req, f, rows, limits, ctx, fn),))
        return np.asarray(raw[idx], dtype=np.float64)

    def _shared_rows(
        self, req: GpuRequest, fleet: FleetArrays, rows: IntA, limits: GpuLimits, ctx: CycleContext, fn: _FleetNoise
    ) -> FloatA:
        """The raw score of ``rows`` for the row memo: every row from the cycle's mask (shared with the fit filter),
        a few from their own."""
        if rows.size == fleet.n_nodes:
            return self._shared(fleet, rows, fn, cycle_eligible(req, fleet, rows, ctx))
        return self._shared(fleet, rows, fn, eligible_gpus(req, fleet, rows, limits))

    def _shared(self, fleet: FleetArrays, idx: IntA, fn: _FleetNoise, elig: BoolA) -> FloatA:
        """The raw score of a share on the ``idx`` rows: the quietest GPU of ``elig`` (NaN: none); on a quiet fleet
        (:meth:`_quiet`) 1 where the pod could get a GPU, what :meth:`_quietest` gives there."""
        if self._quiet(fleet, fn):
            return np.where(elig.any(axis=1), 1.0, np.nan)
        return self._quietest(fleet, idx, fn, elig)

    def _quietest(self, fleet: FleetArrays, idx: IntA, fn: _FleetNoise, elig: BoolA) -> FloatA:
        pressure = _pressure(fn.terms[idx], fleet.tenants[idx], fleet.gpu_present[idx], self.args)
        quiet = (1.0 - pressure) * fn.xid_factor[idx]
        best = np.where(elig, quiet, -np.inf).max(axis=1)
        return np.where(np.isfinite(best), best, np.nan)

    def normalize(self, raw: FloatA) -> FloatA:
        return unit(raw)

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> list[str]:
        idx = np.array([row], dtype=np.int64)
        if not req.shared:
            xid = int(np.where(fleet.gpu_present[row], fleet.xid[row], 0).sum())
            p = gpu_pressure(fleet, idx, self.args)[0]
            n = max(1, int(fleet.gpu_present[row].sum()))
            return [
                f"whole GPUs share no SMs or memory: only the node counts ({xid} XID errors, "
                f"mean GPU pressure {p.sum() / n:.2f})"
            ]
        elig = cycle_eligible(req, fleet, idx, ctx)[0]
        quiet = gpu_quiet(fleet, idx, self.args)[0]
        lines = []
        for j in np.nonzero(elig)[0].tolist():
            used = fleet.mem_used[row, j] / max(1, int(fleet.mem_total[row, j]))
            lines.append(
                f"gpu {int(fleet.gpu_index[row, j])}: util {fleet.util[row, j]:.0%}, memory bandwidth "
                f"{fleet.mem_util[row, j]:.0%}, memory {used:.0%} used, {int(fleet.tenants[row, j])} tenants, "
                f"{int(fleet.xid[row, j])} XID errors; quiet {quiet[j]:.2f}"
            )
        return lines or ["no GPU the pod could share"]
