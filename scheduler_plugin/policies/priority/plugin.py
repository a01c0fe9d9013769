"""The ``priority`` score: place preemptible pods where they leave the high-priority mix its free NVLink groups.

A pod whose priority is below ``protectFrom`` (spot, batch: the pods preemption evicts) is scored by how much of the
free capacity that higher-priority pods need it destroys: on each node, the free whole GPUs form disjoint NVLink
groups of the protected sizes (``groupSizes``: e.g. whole 8-GPU nodes, 4-GPU islands, pairs), and taking ``g`` of
them at best (the choice that breaks least) takes ``loss`` GPUs' worth of such groups away (:func:`.groups.loss`,
each size weighted by its share of the protected mix). Raw score ``1 - loss / g / max(groupSizes)`` (1: breaks
nothing, e.g. a node already broken; 0: breaks a whole group of the largest size for every GPU it takes),
normalised absolutely. A high-priority pod that then arrives more often finds its group free instead of preempting.

The reserve (``reserveGpus`` above 0): a score only ranks, and a fleet kept full by preemptible work seldom leaves
them a choice, so the policy also refuses a node (reason ``reserved``) where a pod below ``protectFrom`` breaks a
group, while the fleet's free groups (their weighted GPUs summed over every node) after it would be below
``reserveGpus``. The pod then waits, or goes where it breaks none; the groups freed as pods end stay free for the
protected pods up to the reserve. Nodes it breaks nothing on are never refused.

Off for pods without priority differences: a pod at or above ``protectFrom`` scores 1 everywhere (no preference),
and so does every pod until a protected pod with a GPU has been seen when ``groupSizes`` is left to be learned (the
sizes and their weights are then the GPU counts of the protected pods the framework observed). A share (a memory
pool, a compute share) takes one whole GPU out of the groups only on a node where no GPU is shared already.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pydantic import Field, field_validator

from ...model import FleetArrays, GpuRequest
from ...model.snapshot import IndexKey
from ..base import BoolA, CycleContext, FloatA, IntA, Rejection
from ..eligibility import mask_bits, whole_free
from ..normalize import unit
from ..policy_file import CamelModel
from ..reasons import ReservedForPriority
from .groups import Wiring, loss, value

MAX_GROUP = 16


@dataclass(frozen=True, slots=True)
class FleetWirings:
    """The NVLink wirings of a fleet's rows: ``pid[row]`` indexes ``wirings``."""

    pid: IntA
    wirings: tuple[Wiring, ...]


WIRINGS = IndexKey[FleetWirings]("priority.wirings", ("nvlink", "gpu_present"))
"""Snapshot index: the wirings of the fleet's rows (nodes keep their wiring: once per snapshot)."""


def wirings_of(fleet: FleetArrays) -> FleetWirings:
    n, _g = fleet.gpu_present.shape
    if n == 0:
        return FleetWirings(np.zeros(0, dtype=np.int64), ())
    raw = np.ascontiguousarray(
        np.concatenate([fleet.nvlink.reshape(n, -1), fleet.gpu_present], axis=1).astype(np.uint8)
    )
    keys = raw.view(np.dtype((np.void, raw.shape[1]))).ravel()
    _uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    wirings = tuple(Wiring.of(fleet.nvlink[r], fleet.gpu_present[r]) for r in first.tolist())
    return FleetWirings(inverse.reshape(-1).astype(np.int64), wirings)


def per_row(fleet: FleetArrays, idx: IntA, fn: Callable[[Wiring, int], float]) -> FloatA:
    """``fn(wiring, free whole-GPU mask)`` of each row of ``idx``, computed once per distinct (wiring, mask)."""
    if idx.size == 0:
        return np.zeros(0, dtype=np.float64)
    fw = fleet.derive(WIRINGS, wirings_of)
    g = fleet.gpu_present.shape[1]
    keys = (fw.pid[idx] << g) | mask_bits(whole_free(fleet, idx))
    uniq, inverse = np.unique(keys, return_inverse=True)
    low = (1 << g) - 1
    vals = np.array([fn(fw.wirings[k >> g], k & low) for k in uniq.tolist()], dtype=np.float64)
    return np.asarray(vals[inverse.reshape(-1)], dtype=np.float64)


class PriorityArgs(CamelModel):
    protect_from: int = Field(ge=-(2**31), le=2**31 - 1)
    """Pods of this priority or more are protected: the score keeps their groups free; pods below it are scored."""
    group_sizes: list[int] | None = None
    """GPUs per protected group (each 1..16, distinct), weighted alike; ``None``: learned from the protected pods
    observed (each size weighted by how often it was asked)."""
    reserve_gpus: int = Field(0, ge=0, le=1_000_000)
    """Free groups (weighted GPUs, summed over the fleet) below which a pod below ``protectFrom`` is refused a node
    where it would break one (0: no reserve, the score alone)."""

    @field_validator("group_sizes")
    @classmethod
    def _sizes(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("must name at least one group size (or be left out to learn them)")
        bad = [k for k in v if not 1 <= k <= MAX_GROUP]
        if bad:
            raise ValueError(f"group sizes must be 1..{MAX_GROUP}, got {bad}")
        if len(set(v)) != len(v):
            raise ValueError(f"group sizes must be distinct, got {v}")
        return v


class PriorityScore:
    """Keep the free NVLink groups high-priority pods need away from preemptible pods."""

    name = "priority"

    def __init__(self, args: PriorityArgs) -> None:
        self.args = args
        self._seen: Counter[int] = Counter()

    def observe(self, req: GpuRequest) -> None:
        """Learn the protected mix: the GPU count of each protected pod that asks for GPUs (learned sizes only)."""
        if self.args.group_sizes is None and req.wants_gpu and req.priority >= self.args.protect_from:
            self._seen[min(req.count, MAX_GROUP)] += 1

    def sizes(self) -> tuple[tuple[int, float], ...]:
        """(group size, weight) pairs, weights summing to 1; empty when nothing is protected yet."""
        if self.args.group_sizes is not None:
            return tuple((k, 1.0 / len(self.args.group_sizes)) for k in sorted(self.args.group_sizes))
        total = sum(self._seen.values())
        return tuple((k, n / total) for k, n in sorted(self._seen.items())) if total else ()

    def _applies(self, req: GpuRequest) -> tuple[tuple[int, float], ...]:
        """The weighted sizes when ``req`` is scored at all (below ``protectFrom``, asks GPUs), else ()."""
        if req.priority >= self.args.protect_from or not req.wants_gpu:
            return ()
        return self.sizes()

    def losses(self, req: GpuRequest, fleet: FleetArrays, idx: IntA) -> FloatA:
        """(len(idx),) weighted GPUs of protected groups the pod destroys at best on each node (0 for a protected
        pod, with nothing to protect, or where too few GPUs are free whole: the fit filter decides there)."""
        sizes = self._applies(req)
        if not sizes:
            return np.zeros(idx.shape[0], dtype=np.float64)
        g = req.count

        def lost(w: Wiring, mask: int) -> float:
            x = loss(w, mask, g, sizes)
            return x if np.isfinite(x) else 0.0

        out = per_row(fleet, idx, lost)
        if req.shared:  # a share breaks no group on a node where a GPU is shared (partly used) already
            free = whole_free(fleet, idx)
            partly = (fleet.gpu_present[idx] & ~free & (fleet.free_milli[idx] > 0)).any(axis=1)
            out = np.where(partly, 0.0, out)
        return out

    def free_groups(self, fleet: FleetArrays, sizes: tuple[tuple[int, float], ...]) -> float:
        """The fleet's free groups: weighted GPUs (:func:`.groups.value`) summed over every row."""
        rows = np.arange(fleet.n_nodes, dtype=np.int64)
        return float(per_row(fleet, rows, lambda w, m: value(w, m, sizes)).sum())

    # the reserve: a filter the framework runs after its own (RestrictsPlacement)

    def restricts(self) -> bool:
        return self.args.reserve_gpus > 0

    def _judge(self, req: GpuRequest, fleet: FleetArrays, idx: IntA) -> tuple[BoolA, FloatA, float]:
        sizes = self._applies(req)
        if not sizes or not self.restricts():
            return np.ones(idx.shape[0], dtype=np.bool_), np.zeros(idx.shape[0]), 0.0
        lost = self.losses(req, fleet, idx)
        if not (lost > 0).any():
            return np.ones(idx.shape[0], dtype=np.bool_), lost, 0.0
        free = self.free_groups(fleet, sizes)
        ok = (lost <= 0) | (free - lost >= self.args.reserve_gpus)
        return np.asarray(ok, dtype=np.bool_), lost, free

    def filter(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> BoolA:
        return self._judge(req, fleet, np.asarray(idx, dtype=np.int64))[0]

    def reasons(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> list[Rejection]:
        _ok, lost, free = self._judge(req, fleet, np.asarray(rows, dtype=np.int64))
        return [
            ReservedForPriority(req.priority, self.args.protect_from, float(x), free, self.args.reserve_gpus)
            for x in lost.tolist()
        ]

    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        sizes = self.sizes()
        if not sizes:
            return np.ones(idx.shape[0], dtype=np.float64)
        top = max(k for k, _ in sizes)
        return np.asarray(1.0 - self.losses(req, fleet, idx) / (max(1, req.count) * top), dtype=np.float64)

    def normalize(self, raw: FloatA) -> FloatA:
        return unit(raw)

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> list[str]:
        sizes = self.sizes()
        if req.priority >= self.args.protect_from:
            return [f"priority {req.priority} >= protectFrom {self.args.protect_from}: protected, no preference"]
        if not sizes:
            return ["no protected pod observed yet: no preference"]
        lost = float(self.losses(req, fleet, np.array([row], dtype=np.int64))[0])
        shown = ", ".join(f"{k} GPUs ({w:.0%})" for k, w in sizes)
        return [f"breaks {lost:.1f} GPUs' worth of free NVLink groups kept for higher priorities ({shown})"]
