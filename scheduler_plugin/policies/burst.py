"""Burst protection: spread a burst of pods instead of stacking them on the one "best" node.

The framework publishes the assumed-allocation ledger's recent placements in the cycle state (``ctx.state``, key
:data:`~.base.RECENT_PLACEMENTS`: node name -> placement times). Each placement ``age`` seconds old weighs
``max(0, 1 - age / windowSeconds)``; a node's burst load is the sum, and::

    raw = 1 - min(1, load / saturation)

so a node that took ``saturation`` pods just now scores 0 and recovers linearly over the window. Capacity itself is
already corrected by the ledger overlay; this score adds the caution that the telemetry (temperature, utilisation)
of a node that just took pods does not show their load yet. Normalised absolutely (``normalize.unit``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from itertools import chain, repeat

import numpy as np
from pydantic import Field

from ..model import FleetArrays, GpuRequest
from .base import PLACEMENT_LOG, RECENT_PLACEMENTS, CycleContext, FloatA, IntA, PlacementLog, StateKey
from .normalize import unit
from .policy_file import CamelModel

PLACEMENTS_KEY = RECENT_PLACEMENTS
"""The cycle-state key of the ledger's recent placements (``Mapping[str, Sequence[float]]``)."""


class BurstArgs(CamelModel):
    window_seconds: float = Field(10.0, gt=0, le=600)
    """How long a placement counts (linearly fading)."""
    saturation: float = Field(4.0, gt=0)
    """Recent placements at which a node scores 0."""


def burst_load(placements: Mapping[str, Sequence[float]] | None, now: float, window_s: float) -> dict[str, float]:
    """Node -> sum of fading weights of its placements in the window."""
    if placements is None:
        return {}
    out: dict[str, float] = {}
    for node, times in placements.items():
        w = sum(max(0.0, 1.0 - (now - t) / window_s) for t in times if t <= now + 1e-9)
        if w > 0:
            out[str(node)] = w
    return out


class BurstScore:
    """Penalise nodes that took many pods in the last seconds."""

    name = "burst"

    def __init__(self, args: BurstArgs) -> None:
        self.args = args
        self._load_key: StateKey[FloatA] = StateKey("burst.load")
        # (log epoch, fleet index, number of the first placement, their rows): the rows of the last window's
        # placements (:meth:`_window`), replaced whole (never changed in place), so concurrent cycles read either
        self._rows: tuple[int, Mapping[str, int], int, IntA] | None = None

    def _per_row(self, fleet: FleetArrays, ctx: CycleContext) -> FloatA:
        """(N,) every node's fading burst load this cycle: :func:`burst_load` of the fleet's nodes, in numpy.

        A busy cluster has thousands of placements in the ledger's TTL (180 pods/s for 30 s), read by every
        prioritize: with the ledger's :data:`~.base.PLACEMENT_LOG` only the placements of the last ``windowSeconds``
        are read (a bisection when the times are in order), else one Python step per node of
        :data:`~.base.RECENT_PLACEMENTS`, none per placement. The same floats as :func:`burst_load` either way: each
        weight is the same IEEE operations elementwise, and ``np.bincount`` adds a node's weights in order from 0.0,
        as ``sum`` does (a placement after ``now``, or one the window's cut leaves in, adds 0.0 instead of being
        skipped: the same sum)."""
        log = ctx.state.find(PLACEMENT_LOG)
        if log is not None:
            rows, times = self._window(log, fleet, ctx.now)
        else:
            rows, times = self._flatten(ctx.state.find(RECENT_PLACEMENTS), fleet)
        if not times.size:
            return np.zeros(fleet.n_nodes, dtype=np.float64)
        now = ctx.now
        weights = np.where(times <= now + 1e-9, np.maximum(0.0, 1.0 - (now - times) / self.args.window_seconds), 0.0)
        return np.asarray(np.bincount(rows, weights=weights, minlength=fleet.n_nodes), dtype=np.float64)

    def _window(self, log: PlacementLog, fleet: FleetArrays, now: float) -> tuple[IntA, FloatA]:
        """The rows and times of the log's placements that may weigh (a second of margin before the window: the
        weights of older ones are exactly 0.0, whatever the rounding of ``now - t``), skipping unknown nodes.

        A placement's row is looked up once: the rows of the last window are kept with the log's numbering
        (:class:`~.base.PlacementLog`), so a cycle looks up only the placements made since the last one (a busy
        cluster's window holds thousands, 180 pods/s for 10 s, where a name lookup each costs more than the rest of
        the burst score)."""
        start = bisect_right(log.times, now - self.args.window_seconds - 1.0, 0, log.size) if log.ordered else 0
        rows = self._rows_of(log, fleet.index, start)
        times = np.asarray(log.times[start : log.size], dtype=np.float64)
        known = rows >= 0
        if not known.all():
            rows, times = rows[known], times[known]
        return rows, times

    def _rows_of(self, log: PlacementLog, index: Mapping[str, int], start: int) -> IntA:
        """The rows of ``log.nodes[start:size]`` (-1: not in the fleet), from the kept rows where the log's
        numbering and the fleet's index are the ones they were looked up for."""
        first, end = log.first + start, log.first + log.size  # the placements' numbers in the log's epoch
        kept = self._rows
        have = np.zeros(0, dtype=np.int64)
        if kept is not None and log.epoch and kept[0] == log.epoch and kept[1] is index and kept[2] <= first:
            have = kept[3][first - kept[2] : end - kept[2]]
        tail = log.nodes[start + len(have) : log.size]
        if tail:
            looked = np.fromiter(map(index.get, tail, repeat(-1, len(tail))), dtype=np.int64, count=len(tail))
            have = np.concatenate((have, looked))
        if log.epoch:
            self._rows = (log.epoch, index, first, have)
        return have

    @staticmethod
    def _flatten(placements: Mapping[str, Sequence[float]] | None, fleet: FleetArrays) -> tuple[IntA, FloatA]:
        """Every placement of ``placements`` on the fleet's nodes: their rows and times, node by node."""
        if not placements:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        index = fleet.index
        nodes = [node for node in placements if node in index]
        counts = np.fromiter(map(len, map(placements.__getitem__, nodes)), dtype=np.int64, count=len(nodes))
        times = np.fromiter(chain.from_iterable(map(placements.__getitem__, nodes)), dtype=np.float64)
        rows = np.repeat(np.fromiter(map(index.__getitem__, nodes), dtype=np.int64, count=len(nodes)), counts)
        return rows, times

    def pre_score(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> None:
        """The loads of every node, once per cycle (score and explain index them)."""
        ctx.state.compute(self._load_key, lambda: self._per_row(fleet, ctx))

    def _load(self, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        per_row = ctx.state.compute(self._load_key, lambda: self._per_row(fleet, ctx))
        return np.asarray(per_row[idx], dtype=np.float64)

    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        load = self._load(fleet, idx, ctx)
        return np.asarray(1.0 - np.minimum(np.maximum(load / self.args.saturation, 0.0), 1.0), dtype=np.float64)

    def normalize(self, raw: FloatA) -> FloatA:
        return unit(raw)

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> list[str]:
        placements = ctx.state.find(RECENT_PLACEMENTS)
        times = placements.get(fleet.names[row], ()) if placements is not None else ()
        recent = [t for t in times if ctx.now - self.args.window_seconds < t <= ctx.now + 1e-9]
        load = float(self._load(fleet, np.array([row], dtype=np.int64), ctx)[0])
        return [
            f"{len(recent)} pods placed here in the last {self.args.window_seconds:g} s "
            f"(fading load {load:.2f} of {self.args.saturation:g})"
        ]
