"""A per-row memo over a fleet: values that are functions of one node's row alone, kept for every row of the fleet
and recomputed only for the rows whose capacity changed since.

A bind changes one row of the ledger overlay, the next snapshot none of the capacity of most rows: a filter that
judges every node per pod recomputes the same verdicts over and over. A :class:`RowMemo` keeps, per request shape, one
array per value over every row (a row's verdict, its rejection, its eligible GPUs), together with the row stamps
(:mod:`.fragmentation.row_stamps`) of the content they were computed from.

**Invalidation rule.** A memo lives in the snapshot index (``FleetArrays.derive``) under an :class:`IndexKey` that
names every telemetry column its values read (never written in place: a replaced column, a new snapshot, starts an
empty memo) and a parameter naming everything of the request its values read. The capacity columns (written in
place by the simulator, copied and charged by a ledger overlay) are content-checked: the rows whose stamp moved since
the memo's values were computed are recomputed, the others reused; when a quarter of the fleet or more moved, every
row is. The arrays handed out are never written afterwards (an update copies them first), so a caller may keep them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from ..model import FleetArrays
from .base import CycleContext, IntA
from .fragmentation.row_stamps import cycle_row_stamps, moved

Columns = tuple[npt.NDArray[Any], ...]
"""The values of a memo: arrays whose first axis is the fleet's rows."""

RowsCompute = Callable[[FleetArrays, IntA], Columns]
"""Computes the values of the given rows (ascending) of a fleet."""

RECOMPUTE_ALL_SHARE = 4
"""When 1/4 of the fleet's rows or more moved, every row is recomputed (one pass over the fleet is cheaper than
indexing that many rows and writing them back)."""


class RowMemo:
    """Per-row values of one request shape over every row of a fleet, with the row stamps they were computed for
    (see the module docstring for when they are recomputed). Thread-safe."""

    __slots__ = ("_lock", "_state", "computed_rows")

    def __init__(self) -> None:
        self._state: tuple[IntA, Columns] | None = None
        self._lock = threading.Lock()
        self.computed_rows = 0
        """How many rows were computed in all (tests read it)."""

    def kept(self, fleet: FleetArrays, ctx: CycleContext, rows: IntA) -> Columns | None:
        """The values kept, when none of ``rows`` moved since they were computed (a row's values are its own: the
        other rows may have moved); None otherwise. Computes nothing: what a check of a few rows (a bind's node)
        reads instead of computing them anew."""
        stamps = cycle_row_stamps(fleet, ctx)
        with self._lock:
            state = self._state
        if state is None or state[0].shape != stamps.shape:
            return None
        if state[0] is not stamps and bool((state[0][rows] != stamps[rows]).any()):
            return None
        return state[1]

    def values(self, fleet: FleetArrays, ctx: CycleContext, compute: RowsCompute) -> Columns:
        """The values of every row of ``fleet`` now (read only)."""
        stamps = cycle_row_stamps(fleet, ctx)
        with self._lock:
            state = self._state
            rows = None if state is None else moved(state[0], stamps)
            if state is not None and rows is not None:
                if not rows.size:
                    return state[1]
                if rows.size * RECOMPUTE_ALL_SHARE < fleet.n_nodes:
                    fresh = compute(fleet, rows)
                    kept = tuple(a.copy() for a in state[1])
                    for a, b in zip(kept, fresh, strict=True):
                        a[rows] = b
                    self.computed_rows += int(rows.size)
                    self._state = (stamps, kept)
                    return kept
            every = compute(fleet, np.arange(fleet.n_nodes, dtype=np.int64))
            self.computed_rows += fleet.n_nodes
            self._state = (stamps, every)
            return every
