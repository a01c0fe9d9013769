"""Per row of a fleet, a stamp of its capacity's content: which nodes were written since a memo last looked.

The simulator writes a fleet's capacity columns in place (one node per arrival) and a ledger overlay copies them with
a few nodes charged, while its telemetry columns stay the same arrays: the fragmentation memos (F per node, F after
a placement, the fleet's free totals, the per-node scores) are therefore content-checked. One :class:`RowStamps` per
snapshot index finds the rows whose content changed, once per cycle, and gives each new content a new stamp; the
memos keep the stamps they were computed for and recompute the rows whose stamp moved.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from ...model import FleetArrays
from ...model.snapshot import LINEAGE_COLUMNS, IndexKey, sealed
from ..base import CycleContext, IntA, StateKey

_STAMPS = itertools.count(1)
"""Stamps of row content versions, unique across every holder (``next`` is atomic under the GIL)."""

GPU_CAPACITY = LINEAGE_COLUMNS
"""The GPU columns of :data:`CAPACITY` (free share, free memory, kelvin tenants): a ledger overlay's own
(:class:`~scheduler_plugin.model.snapshot.Lineage`)."""
CAPACITY = (*GPU_CAPACITY, "cpu_free", "mem_free_host")
"""The columns written in place (the simulator's placements, a ledger overlay's charges) that the row memos read:
fragmentation the capacity, the noise score the tenants too."""


def next_stamp() -> int:
    return next(_STAMPS)


def changed_rows(*pairs: tuple[npt.NDArray[Any], npt.NDArray[Any]]) -> IntA:
    """The rows (ascending) where any ``(old, new)`` pair of same-shaped columns differ. Compares the flat arrays
    (an element-wise test and one ``flatnonzero``: a few microseconds for 40,000 slots, where a per-row reduction
    costs ten times that)."""
    rows = np.zeros(len(pairs[0][0]), dtype=np.bool_)
    for old, new in pairs:
        if old.ndim == 2:
            rows[(old.ravel() != new.ravel()).nonzero()[0] // old.shape[1]] = True
        else:
            rows |= old != new
    return rows.nonzero()[0]  # np.flatnonzero without its ravel (twice per arrival, per holder)


class RowStamps:
    """Per row of a fleet, a stamp of the content of its :data:`CAPACITY` columns: a new stamp (unique across all
    holders) whenever a row's content changes; the same array object while nothing changed. Kept in the snapshot
    index (:func:`row_stamps`), shared by the snapshot, its overlays and its copies. An update builds a new stamps
    array (copy on write: a stamps array handed out is never written) and brings the holder's private copies of the
    columns up to date in place, under the lock.

    The rows that changed are found by comparing the columns whole, except where the fleet itself says which
    (its GPU columns are :func:`~scheduler_plugin.model.snapshot.sealed`, never written): the very columns whose
    content the private copies hold (filter, prioritize and bind of one pod read one overlay), or an overlay's
    :class:`~scheduler_plugin.model.snapshot.Lineage` from them (the next bind's overlay names the rows it
    recharged). Only those rows of the GPU columns are compared then; the host columns, shared with the snapshot,
    are compared whole (one value per node)."""

    __slots__ = ("_lock", "_seen", "_state")

    def __init__(self) -> None:
        self._state: tuple[tuple[npt.NDArray[Any], ...], IntA] | None = None
        self._seen: tuple[npt.NDArray[Any], ...] | None = None
        """The sealed GPU columns whose content the private copies hold (None: unknown, compare them whole)."""
        self._lock = threading.Lock()

    def stamps(self, fleet: FleetArrays) -> IntA:
        """(N,) the stamp of each row's content now (read only)."""
        now = tuple(getattr(fleet, c) for c in CAPACITY)
        gpu_cols = now[_GPU]
        with self._lock:
            state = self._state
            seen, self._seen = self._seen, (gpu_cols if all(map(sealed, gpu_cols)) else None)
            if state is None or any(a.shape != b.shape for a, b in zip(state[0], now, strict=True)):
                stamps = np.full(len(now[0]), next_stamp(), dtype=np.int64)
                self._state = (tuple(a.copy() for a in now), stamps)
                return stamps
            old, stamps = state
            told = _told_rows(fleet, gpu_cols, seen)
            if told is None:
                rows = changed_rows(*zip(old, now, strict=True))
            else:
                host = changed_rows(*zip(old[_HOST], now[_HOST], strict=True))  # a ledger overlay charges none of them
                rows = _differing(old, now, np.union1d(told, host) if len(host) else told)
            if not len(rows):
                return stamps
            for a, b in zip(old, now, strict=True):  # private copies, never handed out: updated in place
                a[rows] = b[rows]
            stamps = stamps.copy()
            stamps[rows] = next_stamp()
            self._state = (old, stamps)
            return stamps


def _told_rows(
    fleet: FleetArrays,
    gpu_cols: tuple[npt.NDArray[Any], ...],
    seen: tuple[npt.NDArray[Any], ...] | None,
) -> IntA | None:
    """The only rows of the GPU columns that can differ from the private copies (which hold ``seen``'s content),
    or None when the fleet cannot tell."""
    if seen is None:
        return None
    if _same(gpu_cols, seen):
        return _NO_ROWS
    lin = fleet.lineage
    if lin is not None and _same(lin.own, gpu_cols) and _same(lin.parent, seen):
        return lin.rows
    return None


def _same(a: tuple[npt.NDArray[Any], ...], b: tuple[npt.NDArray[Any], ...]) -> bool:
    """The very same array objects, in order."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _differing(old: tuple[npt.NDArray[Any], ...], now: tuple[npt.NDArray[Any], ...], rows: IntA) -> IntA:
    """Those of ``rows`` (ascending) where any column of ``now`` differs from ``old``."""
    if not len(rows):
        return rows
    diff = np.zeros(len(rows), dtype=np.bool_)
    for a, b in zip(old, now, strict=True):
        d = a[rows] != b[rows]
        diff |= d.any(axis=1) if d.ndim == 2 else d
    return rows[diff]


_NO_ROWS = np.zeros(0, dtype=np.int64)
_GPU = slice(0, len(GPU_CAPACITY))
_HOST = slice(len(GPU_CAPACITY), None)
"""The host columns of :data:`CAPACITY` (shared by an overlay with its snapshot: compared whole)."""


ROW_STAMPS = IndexKey[RowStamps]("fragmentation.row_stamps", ())
"""Snapshot index: the :class:`RowStamps` holder of a fleet (content-checked: no column identity)."""


def row_stamps(fleet: FleetArrays) -> IntA:
    """:meth:`RowStamps.stamps` of ``fleet``."""
    return fleet.derive(ROW_STAMPS, lambda _: RowStamps()).stamps(fleet)


ROW_STAMPS_KEY: StateKey[tuple[FleetArrays, IntA]] = StateKey("fragmentation.row_stamps")
"""Cycle state: (fleet, :func:`row_stamps` of it) of the cycle (a cycle does not write its fleet)."""


def cycle_row_stamps(fleet: FleetArrays, ctx: CycleContext) -> IntA:
    """:func:`row_stamps` of ``fleet``, once per cycle: the score, the stranding term's totals and the pick of a cycle
    read the same fleet."""
    hit = ctx.state.find(ROW_STAMPS_KEY)
    if hit is not None and hit[0] is fleet:
        return hit[1]
    stamps = row_stamps(fleet)
    ctx.state.write(ROW_STAMPS_KEY, (fleet, stamps))
    return stamps


def moved(old: IntA | None, new: IntA) -> IntA | None:
    """The rows whose stamp differs between two stamps arrays (``None``: all of them, the shapes differ)."""
    if old is None or old.shape != new.shape:
        return None
    if old is new:
        return np.zeros(0, dtype=np.int64)
    return np.nonzero(old != new)[0]
