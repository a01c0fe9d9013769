"""Per-node memo of a fragmentation plugin's score: a node's score for a request shape is recomputed only when the
node's capacity was written since it was last scored for that shape.

A node's score (its best placement's value) depends on the node alone: its capacity columns, its telemetry columns
(eligibility, GPU sizes, model), the request shape and the workload, plus a few values shared by every node of the
cycle (the plugin passes them as ``extra``: the stranding term's surplus factor, the packing plan). The simulator
writes one node per arrival, so most nodes' scores are the ones computed for that shape before: the memo keeps them
per shape and node with the node's content stamp (:class:`RowStamps`), and asks the plugin to compute only the others.
Every value is computed from its own node's data alone (the sums of F row by row, element-wise functions after), so
a score computed with other nodes or alone has the same bits.

The memo engages for a workload once it is asked for twice in a row (as the F memo does): the extender's learned
workload changes with every pod, and then each call computes every candidate as without a memo.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ...model import FleetArrays, GpuRequest
from ...model.snapshot import IndexKey
from ..base import FloatA, IntA
from .workload import Workload

_STAMPS = itertools.count(1)
"""Stamps of row content versions, unique across every :class:`RowStamps` (``next`` is atomic under the GIL)."""

CAPACITY = ("free_milli", "free_mem", "cpu_free", "mem_free_host")
"""The columns written in place (the simulator's placements, a ledger overlay's charges) that a score reads."""

STATIC = ("names", "models", "gpu_present", "model_id", "mem_total", "temp", "slowdown", "throttle")
"""The columns a score reads that are never written in place (a new snapshot brings new arrays)."""

_CELLS = 4_000_000
"""(shape, node) scores a memo keeps, 16 bytes each (then it starts afresh): 3,300 shapes on 1,213 nodes."""


class RowStamps:
    """Per row of a fleet, a stamp of the content of its :data:`CAPACITY` columns: a new stamp (unique across all
    holders) whenever a row's content changes. Content-checked like the F memo (``FleetFreeStats``): kept in the
    snapshot index, shared by the snapshot, its overlays and its copies. Updates build new arrays and replace them in
    one assignment (copy on write)."""

    __slots__ = ("_lock", "_state")

    def __init__(self) -> None:
        self._state: tuple[tuple[npt.NDArray[Any], ...], IntA] | None = None
        self._lock = threading.Lock()

    def stamps(self, fleet: FleetArrays) -> IntA:
        """(N,) the stamp of each row's content now (read only)."""
        now = tuple(getattr(fleet, c) for c in CAPACITY)
        with self._lock:
            state = self._state
            if state is None or any(a.shape != b.shape for a, b in zip(state[0], now, strict=True)):
                stamps = np.full(len(now[0]), next(_STAMPS), dtype=np.int64)
                self._state = (tuple(a.copy() for a in now), stamps)
                return stamps
            old, stamps = state
            changed = np.zeros(len(stamps), dtype=np.bool_)
            for a, b in zip(old, now, strict=True):
                if a.ndim == 2:
                    changed[np.flatnonzero(a.ravel() != b.ravel()) // a.shape[1]] = True
                else:
                    changed |= a != b
            rows = np.flatnonzero(changed)
            if not len(rows):
                return stamps
            kept = []
            for a, b in zip(old, now, strict=True):
                c = a.copy()
                c[rows] = b[rows]
                kept.append(c)
            stamps = stamps.copy()
            stamps[rows] = next(_STAMPS)
            self._state = (tuple(kept), stamps)
            return stamps


ROW_STAMPS = IndexKey[RowStamps]("fragmentation.row_stamps", ())
"""Snapshot index: the :class:`RowStamps` holder of a fleet (content-checked: no column identity)."""


def row_stamps(fleet: FleetArrays) -> IntA:
    return fleet.derive(ROW_STAMPS, lambda _: RowStamps()).stamps(fleet)


def shape_key(req: GpuRequest) -> GpuRequest:
    """The request without the pod's identity (name, UID, priority): what its score depends on."""
    return replace(req, pod_key="", pod_uid="", priority=0)


@dataclass(slots=True)
class _Entry:
    extra: tuple[Hashable, ...]
    stamp: IntA
    value: FloatA


@dataclass(slots=True)
class ScoreMemo:
    """One plugin's per-node scores, per request shape (:func:`shape_key`), for the last workload and fleet
    telemetry it scored against."""

    _static: tuple[object, ...] = ()
    _workload: Workload | None = None
    _entries: dict[Hashable, _Entry] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def scores(
        self,
        key: Hashable,
        fleet: FleetArrays,
        rows: IntA,
        w: Workload,
        extra: tuple[Hashable, ...],
        compute: Callable[[IntA], FloatA],
    ) -> FloatA:
        """The score of each of ``rows`` for the shape ``key`` with the cycle's shared values ``extra``:
        kept values where the row's content is the one they were computed for, ``compute(sel)`` (positions into
        ``rows``, ascending) for the others. ``extra`` is compared with ``is`` or ``==`` element by element."""
        static = tuple(getattr(fleet, c) for c in STATIC)
        with self._lock:
            if self._workload is not w or not _same(self._static, static):
                # a workload (or telemetry) not seen in the last call: computed afresh, kept from the next call on
                self._workload, self._static = w, static
                self._entries.clear()
                return compute(np.arange(len(rows), dtype=np.int64))
            stamps = row_stamps(fleet)
            n = len(stamps)
            hit = self._entries.get(key)
            if hit is None or not _same(hit.extra, extra):
                if hit is None and len(self._entries) >= max(8, _CELLS // max(n, 1)):
                    self._entries.clear()
                hit = self._entries[key] = _Entry(extra, np.zeros(n, dtype=np.int64), np.zeros(n))
            now = stamps[rows]
            stale = np.flatnonzero(hit.stamp[rows] != now)
            if len(stale):
                at = rows[stale]
                hit.value[at] = compute(stale)
                hit.stamp[at] = now[stale]
            return hit.value[rows]


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return len(a) == len(b) and all(x is y or (isinstance(x, float) and x == y) for x, y in zip(a, b, strict=True))
