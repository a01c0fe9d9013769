"""Per-node memo of a fragmentation plugin's score: a node's score for a request shape is recomputed only when the
node's capacity was written since it was last scored for that shape.

A node's score (its best placement's value) depends on the node alone: its capacity columns, its telemetry columns
(eligibility, GPU sizes, model), the request shape and the workload, plus a few values shared by every node of the
cycle (the plugin passes them as ``extra``: the stranding term's surplus factor, the packing plan). The simulator
writes one node per arrival, so most nodes' scores are the ones computed for that shape before: the memo keeps them
per shape and node with the node's content stamp (:mod:`.row_stamps`), and asks the plugin to compute only the others.
Every value is computed from its own node's data alone (the sums of F row by row, element-wise functions after), so
a score computed with other nodes or alone has the same bits.

Some shared values are read by a few nodes' scores only (kelvin's stranding weight, which moves with the fleet's free
CPU at nearly every arrival once CPU runs short, changes only the placements that strand GPU): the plugin passes them
as ``soft``, and its ``compute`` says per row whether the score it computed read them. When they change, only the
kept scores that read them are recomputed (the others are the same floats whatever they are). A plugin that can value
a placement again from a few numbers per placement and the new ``soft`` (kelvin's: dF, the GPU stranded, the packing
plan's price) hands them back with the scores (:class:`SoftParts`) and a ``revalue`` function: the memo then keeps
them for the rows that read ``soft`` and, when it moves, values those placements again instead of asking for them
(on the default trace 4,700 of the 7,900 computations, 560,000 of 770,000 rows, were for a moved stranding weight).

The memo engages for a workload once it is asked for twice in a row (as the F memo does). The extender's learned
workload is published in steps (:mod:`.publication`): the same object between republications, so the memo serves
the pods in between; the call after one computes every candidate as without a memo.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np

from ...model import FleetArrays, GpuRequest
from ..base import BoolA, FloatA, IntA
from .row_stamps import row_stamps
from .workload import Workload

STATIC = ("names", "models", "gpu_present", "model_id", "mem_total", "temp", "slowdown", "throttle")
"""The columns a score reads that are never written in place (a new snapshot brings new arrays)."""

_CELLS = 4_000_000
"""(shape, node) scores a memo keeps, 16 bytes each (then it starts afresh): 3,300 shapes on 1,213 nodes."""


def shape_key(req: GpuRequest) -> Hashable:
    """The request's fields but the pod's identity (name, UID, priority): what its score depends on."""
    return (
        req.count,
        req.milli,
        req.memory_bytes,
        req.models,
        req.topology,
        req.max_temperature,
        req.cpu_milli,
        req.host_memory_bytes,
    )


@dataclass(frozen=True, slots=True)
class SoftParts:
    """The placements of the computed rows whose score read ``soft``, as ``revalue`` takes them: per placement its
    row (a position into the rows computed) and the plugin's numbers (same-length arrays). A row's score is its
    placements' highest value."""

    pos: IntA
    arrays: tuple[FloatA, ...]


Computed = tuple[FloatA, BoolA] | tuple[FloatA, BoolA, SoftParts | None] | tuple[FloatA, BoolA, SoftParts | None, BoolA]
"""What a score computation gives for its rows: the scores, per row whether the score read the ``soft`` values,
(with a ``revalue``) the :class:`SoftParts` of the rows that read them, and optionally each row's pick: (rows, G) the
GPU slots the pod would get there (none: no placement), kept for :meth:`ScoreMemo.picked`."""

Revalue = Callable[[tuple[FloatA, ...], tuple[Hashable, ...]], FloatA]
"""Each placement's value from its :attr:`SoftParts.arrays` and the ``soft`` values: exactly what the computation
gives (the same element-wise operations), so a row valued again has the bits a computation would give it."""


@dataclass(slots=True)
class _Entry:
    extra: tuple[Hashable, ...]
    soft: tuple[Hashable, ...]
    stamp: IntA
    """(N,) the row content stamp each kept score was computed for (0: none kept)."""
    reads: BoolA
    """(N,) whether the kept score read ``soft``."""
    value: FloatA
    parts_row: IntA = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """(K,) the row of each kept soft placement (:class:`SoftParts`) ..."""
    parts_stamp: IntA = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """(K,) ... the row stamp it was computed for (a placement of a row computed since is stale) ..."""
    parts: tuple[FloatA, ...] = ()
    """... and the plugin's numbers."""
    picks: BoolA | None = None
    """(N, G) the GPU slots of each row's pick, where :attr:`picked` (none taken: no placement on the row)."""
    picked: BoolA | None = None
    """(N,) the row's pick is kept (computed with its kept score, and the score not valued again since)."""

    def keep_picks(self, at: IntA, slots: BoolA) -> None:
        if self.picks is None or self.picked is None or self.picks.shape[1] != slots.shape[1]:
            self.picks = np.zeros((len(self.stamp), slots.shape[1]), dtype=np.bool_)
            self.picked = np.zeros(len(self.stamp), dtype=np.bool_)
        self.picks[at] = slots
        self.picked[at] = True

    def keep_parts(self, at: IntA, stamps: IntA, new: SoftParts) -> None:
        """Add the soft placements of the rows ``at`` (computed for ``stamps``), the stale ones dropped when they
        have come to outnumber the rows."""
        if len(new.arrays) != len(self.parts):
            self.parts_row, self.parts_stamp, self.parts = _NO_ROWS, _NO_ROWS, tuple(np.zeros(0) for _ in new.arrays)
        elif len(self.parts_row) > 2 * len(self.stamp):
            live = self.live_parts()
            self.parts_row, self.parts_stamp = self.parts_row[live], self.parts_stamp[live]
            self.parts = tuple(a[live] for a in self.parts)
        self.parts_row = np.concatenate((self.parts_row, at[new.pos]))
        self.parts_stamp = np.concatenate((self.parts_stamp, stamps[new.pos]))
        self.parts = tuple(np.concatenate((a, b)) for a, b in zip(self.parts, new.arrays, strict=True))

    def live_parts(self) -> BoolA:
        """The kept soft placements of the kept scores: their row's stamp is the one they were computed for."""
        return np.asarray(self.stamp[self.parts_row] == self.parts_stamp, dtype=np.bool_)

    def revalued(self, soft: tuple[Hashable, ...], revalue: Revalue) -> None:
        """Value the kept scores that read ``soft`` again from their placements; a kept score that read it without
        placements kept (none should) is dropped (computed when asked for)."""
        live = self.live_parts() & self.reads[self.parts_row]
        self.parts_row, self.parts_stamp = self.parts_row[live], self.parts_stamp[live]
        self.parts = tuple(a[live] for a in self.parts)
        covered = np.zeros(len(self.stamp), dtype=np.bool_)
        covered[self.parts_row] = True
        self.stamp[self.reads & ~covered] = 0
        if self.picked is not None:  # another value may win on the rows valued again: their picks are computed anew
            self.picked[self.reads] = False
        self.value[covered] = -np.inf
        np.maximum.at(self.value, self.parts_row, revalue(self.parts, soft))
        self.soft = soft


_NO_ROWS = np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class ScoreMemo:
    """One plugin's per-node scores, per request shape (:func:`shape_key`), for the last workload and fleet
    telemetry it scored against."""

    revalue: Revalue | None = None
    """How the plugin values its kept soft placements again (:data:`Revalue`; ``None``: it recomputes them)."""
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
        compute: Callable[[IntA], Computed],
        stamps: Callable[[], IntA] | None = None,
        soft: tuple[Hashable, ...] = (),
    ) -> FloatA:
        """The score of each of ``rows`` for the shape ``key`` with the cycle's shared values ``extra`` and ``soft``:
        kept values where the row's content is the one they were computed for (and, for a score that read ``soft``,
        ``soft`` is the same), ``compute(sel)`` (positions into ``rows``, ascending) for the others. ``extra`` and
        ``soft`` are compared with ``is`` or ``==`` element by element; ``stamps()``: :func:`.row_stamps` of
        ``fleet`` when the caller has them (the cycle's). With :attr:`revalue`, ``compute`` gives the
        :class:`SoftParts` of its rows too, and a moved ``soft`` values the kept placements again
        (:meth:`_Entry.revalued`)."""
        revalue = self.revalue
        static = tuple(getattr(fleet, c) for c in STATIC)
        with self._lock:
            if self._workload is not w or not _same(self._static, static):
                # a workload (or telemetry) not seen in the last call: computed afresh, kept from the next call on
                self._workload, self._static = w, static
                self._entries.clear()
                return compute(np.arange(len(rows), dtype=np.int64))[0]
            now_all = row_stamps(fleet) if stamps is None else stamps()
            n = len(now_all)
            hit = self._entries.get(key)
            if hit is None or not _same(hit.extra, extra):
                if hit is None and len(self._entries) >= max(8, _CELLS // max(n, 1)):
                    self._entries.clear()
                hit = self._entries[key] = _Entry(
                    extra, soft, np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.bool_), np.zeros(n)
                )
            elif not _same(hit.soft, soft):  # the kept scores that read the old values are stale, on every row
                if revalue is None:
                    hit.stamp[hit.reads] = 0
                    hit.soft = soft
                else:
                    hit.revalued(soft, revalue)
            now = now_all[rows]
            stale = (hit.stamp[rows] != now).nonzero()[0]
            if len(stale):
                at = rows[stale]
                out = compute(stale)
                hit.value[at], hit.reads[at] = out[0], out[1]
                hit.stamp[at] = now[stale]
                if revalue is not None and len(out) >= 3 and out[2] is not None:
                    hit.keep_parts(at, now[stale], out[2])
                if len(out) == 4:
                    hit.keep_picks(at, out[3])
            return hit.value[rows]

    def picked(
        self,
        key: Hashable,
        fleet: FleetArrays,
        row: int,
        w: Workload,
        extra: tuple[Hashable, ...],
        stamps: Callable[[], IntA],
        soft: tuple[Hashable, ...] = (),
    ) -> BoolA | None:
        """(G,) the GPU slots of ``row``'s pick kept with its score for the shape ``key`` (none taken: the row has no
        placement), when the score would be served from the memo now (the same workload, telemetry, ``extra`` and
        ``soft`` as :meth:`scores` would check, and the row's content unchanged); None otherwise (compute it)."""
        static = tuple(getattr(fleet, c) for c in STATIC)
        with self._lock:
            if self._workload is not w or not _same(self._static, static):
                return None
            hit = self._entries.get(key)
            if hit is None or hit.picks is None or hit.picked is None or not hit.picked[row]:
                return None
            if not _same(hit.extra, extra) or (hit.reads[row] and not _same(hit.soft, soft)):
                return None
            now = stamps()
            if len(now) != len(hit.stamp) or hit.stamp[row] != now[row]:
                return None
            slots: BoolA = hit.picks[row].copy()
            return slots


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return len(a) == len(b) and all(x is y or (isinstance(x, float) and x == y) for x, y in zip(a, b, strict=True))
