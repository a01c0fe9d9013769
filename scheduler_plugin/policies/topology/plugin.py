"""The ``topology`` score and picker plugins and their arguments."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from pydantic import Field, model_validator

from ...model import FleetArrays, GpuRequest, Topology
from ...model.snapshot import IndexKey
from ..base import BoolA, CycleContext, FloatA, IntA
from ..eligibility import (
    STATIC_COLUMNS,
    GpuLimits,
    cycle_eligible,
    eligible_gpus,
    few_rows,
    limits_of,
    mask_bits,
    whole_free,
)
from ..normalize import unit
from ..policy_file import CamelModel
from ..row_memo import RowMemo
from .tables import (
    EXACT_COMBINATIONS,
    LEVEL_NAMES,
    WIRING_COLUMNS,
    FleetTopology,
    TopologyTables,
    best_set,
    set_quality,
)

SCORE_COLUMNS = tuple(dict.fromkeys((*STATIC_COLUMNS, *WIRING_COLUMNS, "models")))
"""The telemetry columns the topology score of a row reads (its capacity is content-checked by the row memo)."""


class TopologyArgs(CamelModel):
    nvlink: float = Field(1.0, ge=0, le=1)
    """Quality of an NVLink pair."""
    same_switch: float = Field(0.6, ge=0, le=1)
    """Quality of a pair behind the same PCIe switch."""
    same_numa: float = Field(0.3, ge=0, le=1)
    """Quality of a pair on the same NUMA node (through the CPU's root complex)."""
    cross_socket: float = Field(0.0, ge=0, le=1)
    """Quality of a pair on different sockets."""
    worst_link_share: float = Field(0.8, ge=0, le=1)
    """Weight of the worst pair in a set's quality; the rest goes to the mean pair."""

    @model_validator(mode="after")
    def _ordered(self) -> TopologyArgs:
        if not self.nvlink >= self.same_switch >= self.same_numa >= self.cross_socket:
            raise ValueError("link qualities must not increase: nvlink >= sameSwitch >= sameNuma >= crossSocket")
        return self

    def qualities(self) -> FloatA:
        return np.array([self.nvlink, self.same_switch, self.same_numa, self.cross_socket], dtype=np.float64)


def _single_raw(
    tables: TopologyTables, req: GpuRequest, fleet: FleetArrays, idx: IntA, elig: BoolA
) -> tuple[FloatA, FloatA]:
    """Single-GPU pods: (raw per row, loss per slot) where loss is +inf on slots the pod cannot use."""
    loss = tables.slot_loss(fleet, idx, whole_free(fleet, idx))
    loss = np.where(elig, loss, np.inf)
    best = loss.min(axis=1) if loss.shape[1] else np.full(idx.shape[0], np.inf)
    return np.where(np.isfinite(best), 1.0 - best, np.nan), loss


class _TopologyPlugin:
    """What the topology score and picker share: their args and the wiring tables, filled per snapshot."""

    name = "topology"

    def __init__(self, args: TopologyArgs) -> None:
        self.args = args
        self.tables = TopologyTables(args.qualities(), args.worst_link_share)

    def prepare(self, fleet: FleetArrays) -> None:
        self.tables.for_fleet(fleet)


@dataclass(frozen=True, slots=True)
class FlatWiring:
    """What the topology score is on a fleet whose wiring tells no node from another for some pods (see
    :func:`flat_wiring`)."""

    single: bool
    """Taking any one present slot of any node loses no connectivity: a one-GPU pod scores 1 wherever it fits."""
    multi: dict[int, float]
    """GPU count k -> the one best quality of k GPUs that every set of k present GPUs of every node reaches: such a
    pod scores it wherever it fits."""

    def value(self, count: int) -> float | None:
        """The raw score of a pod of ``count`` GPUs on every node where it fits; ``None``: it differs by node."""
        if count < 2:
            return 1.0 if self.single else None
        return self.multi.get(count)


def flat_wiring(ft: FleetTopology) -> FlatWiring:
    """Read from the fleet's tables (stacked: nodes of at most 16 GPUs): which pods the wiring scores alike on every
    node (a fleet of one link level throughout, such as a replayed trace that reports no wiring). Wide nodes: none."""
    if ft.loss is None or ft.best_quality is None or not ft.patterns:
        return FlatWiring(False, {})
    if len(ft.patterns) != len(ft.best_quality) or any(p.present is None for p in ft.patterns):
        return FlatWiring(False, {})  # tables not one per pattern, or unknown slots: nothing is judged flat
    g = ft.best_quality.shape[1] - 1
    masks = np.arange(1 << g, dtype=np.int64)
    pop = ((masks[:, None] >> np.arange(g)) & 1).sum(axis=1)
    present = mask_bits(np.stack([p.present for p in ft.patterns if p.present is not None]))
    within = (masks[None, :] & ~present[:, None]) == 0  # (P, 2^G) the masks of present slots only
    multi: dict[int, float] = {}
    for k in range(2, g + 1):
        values = ft.best_quality[:, k, :][within & (pop >= k)[None, :]]
        if values.size and np.isfinite(values[0]) and (values == values[0]).all():
            multi[k] = float(values[0])
    return FlatWiring(bool((ft.loss[within] == 0.0).all()), multi)


class TopologyScore(_TopologyPlugin):
    """Prefer nodes whose usable GPUs form the best-connected group; keep single pods off intact groups."""

    def __init__(self, args: TopologyArgs) -> None:
        super().__init__(args)
        self._rows_key = IndexKey[RowMemo]("topology.score_rows", SCORE_COLUMNS, limit=64)
        """Snapshot index: the raw score of every row per request shape (:class:`~..row_memo.RowMemo`)."""
        self._flat_key = IndexKey[FlatWiring]("topology.flat", WIRING_COLUMNS)
        """Snapshot index: the pods the fleet's wiring scores alike everywhere (:func:`flat_wiring`)."""

    def prepare(self, fleet: FleetArrays) -> None:
        super().prepare(fleet)
        fleet.derive(self._flat_key, self._flat_of)

    def _flat_of(self, fleet: FleetArrays) -> FlatWiring:
        return flat_wiring(self.tables.for_fleet(fleet))

    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        """The raw score of each row: a function of the row alone (its eligible GPUs and wiring), so for many
        candidates it is read from the shape's row memo (the rows charged since recomputed); for a few, computed."""
        if not req.wants_gpu or idx.size == 0:
            return np.ones(idx.shape[0], dtype=np.float64)
        if few_rows(idx.size, fleet):
            return self._raw(req, fleet, idx, cycle_eligible(req, fleet, idx, ctx))
        limits = limits_of(ctx)
        shape = (req.count, req.milli, req.memory_bytes, req.models, req.max_temperature, limits)
        memo = fleet.derive(self._rows_key, lambda _: RowMemo(), shape)
        (raw,) = memo.values(fleet, ctx, lambda f, rows: (self._rows(req, f, rows, limits),))
        return np.asarray(raw[idx], dtype=np.float64)

    def _rows(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, limits: GpuLimits) -> FloatA:
        return self._raw(req, fleet, rows, eligible_gpus(req, fleet, rows, limits))

    def _raw(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, elig: BoolA) -> FloatA:
        """The raw score of the ``idx`` rows, ``elig`` the GPUs the pod could get there: on a fleet whose wiring
        scores the pod alike everywhere (:func:`flat_wiring`), that one value where it fits and NaN where not, what
        :meth:`_by_wiring` gives there without its table lookups."""
        flat = fleet.derive(self._flat_key, self._flat_of).value(req.count)
        if flat is not None:
            return np.where(elig.sum(axis=1) >= max(1, req.count), flat, np.nan)
        return self._by_wiring(req, fleet, idx, elig)

    def _by_wiring(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, elig: BoolA) -> FloatA:
        if req.count >= 2:
            q = self.tables.best_quality(fleet, idx, elig, req.count)
            return np.where(np.isfinite(q), q, np.nan)
        raw, _ = _single_raw(self.tables, req, fleet, idx, elig)
        return raw

    def normalize(self, raw: FloatA) -> FloatA:
        return unit(raw)

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> list[str]:
        if not req.wants_gpu:
            return ["the pod requests no GPU; topology does not matter"]
        idx = np.array([row], dtype=np.int64)
        elig = cycle_eligible(req, fleet, idx, ctx)
        pat = self.tables.pattern(fleet, row)
        gidx = fleet.gpu_index[row]
        if req.count >= 2:
            cols = [int(j) for j in np.nonzero(elig[0])[0]]
            q, s = best_set(pat.pair_quality, cols, req.count, self.args.worst_link_share)
            if not s:
                return [f"fewer than {req.count} usable GPUs ({len(cols)})"]
            worst = max(int(pat.levels[a, b]) for a, b in itertools.combinations(s, 2))
            names = ",".join(str(int(gidx[j])) for j in s)
            return [
                f"best {req.count} usable GPUs are {names}: slowest link {LEVEL_NAMES[worst]} "
                f"(set quality {q:.2f} of 1)",
                f"{len(cols)} GPUs usable by the pod",
            ]
        raw, loss = _single_raw(self.tables, req, fleet, idx, elig)
        if not np.isfinite(raw[0]):
            return ["no usable GPU"]
        j = int(np.argmin(loss[0]))
        free = int(whole_free(fleet, idx)[0].sum())
        return [
            f"best slot for one GPU is gpu {int(gidx[j])}: it costs {loss[0, j]:.0%} of the free GPUs' connectivity "
            f"quality ({free} whole GPUs free; uniformly connected GPUs cost nothing)",
        ]


class TopologyPicker(_TopologyPlugin):
    """Choose the best-connected usable set for multi-GPU pods; for one GPU, the slot that breaks the least."""

    def pick(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> tuple[int, ...] | None:
        if not req.wants_gpu:
            return ()
        idx = np.array([row], dtype=np.int64)
        elig = cycle_eligible(req, fleet, idx, ctx)[0]
        cols = [int(j) for j in np.nonzero(elig)[0]]
        if len(cols) < req.count:
            return None
        gidx = fleet.gpu_index[row]
        pat = self.tables.pattern(fleet, row)
        share = self.args.worst_link_share
        if req.count == 1:
            _, loss = _single_raw(self.tables, req, fleet, idx, elig[None, :])
            free_after = fleet.free_milli[row] - req.demand_milli(fleet.mem_total[row])
            # least connectivity lost, then best fit (least left over), then the lowest slot
            j = min(cols, key=lambda c: (round(float(loss[0, c]), 9), int(free_after[c]), c))
            return (int(gidx[j]),)
        free_bits = int(mask_bits(whole_free(fleet, idx))[0])
        need_clique = req.topology is Topology.NVLINK_REQUIRED
        best_key: tuple[float, float] | None = None
        best: tuple[int, ...] | None = None
        if math.comb(len(cols), req.count) <= EXACT_COMBINATIONS:
            candidates: list[tuple[int, ...]] = list(itertools.combinations(cols, req.count))
        else:
            candidates = [best_set(pat.pair_quality, cols, req.count, share)[1]]
        for s in candidates:
            if need_clique and not all(pat.nvl[a, b] for a, b in itertools.combinations(s, 2)):
                continue
            rest = free_bits
            for c in s:
                rest &= ~(1 << c)
            key = (round(set_quality(pat.pair_quality, s, share), 9), round(pat.capacity(rest, share), 9))
            if best_key is None or key > best_key:
                best_key, best = key, s
        if best is None:
            return None
        return tuple(int(gidx[j]) for j in best)
