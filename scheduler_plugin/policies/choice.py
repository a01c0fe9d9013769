"""kelvin's choice as kube-scheduler reads it: one node at the top score.

kube-scheduler adds the extender's integer scores (times the extender's weight and 10) to its own plugins' scores and
binds the node with the highest total, drawing at random among equal totals (``schedule_one.go``: a heap ordered by
total score, then a random number per node). Rounding kelvin's weighted mean to 0..10 alone gives dozens or hundreds
of nodes the top score in a large fleet: kube-scheduler would then choose among them at random, and the placement
would not be the one kelvin ranked first (on the openb trace through that combination: 8.1 % of the GPUs left
unallocated instead of 3.7 %; ``bench/kube_combination.py``).

So the node kelvin ranks first gets 10 alone and every other node its rounded mean, at most 9. Nodes whose means are
equal (up to float noise) are ordered by a fixed key per node name (CRC-32): every pod meets the same order, so equal
nodes fill one after another instead of evenly, and the answer does not depend on the order kube-scheduler lists
the names in. The simulator's replays break those ties by a node order drawn per seed, the same kind of fixed order.
"""

from __future__ import annotations

import zlib

import numpy as np

from .base import MAX_EXTENDER_PRIORITY, FloatA, IntA

#: Relative tolerance within which two weighted means count as equal (:func:`~.ranking.tied_best`'s).
TIE_TOLERANCE = 1e-9


def order_keys(names: tuple[str, ...]) -> IntA:
    """The fixed tie-break key of each node name (lower comes first): CRC-32 of its UTF-8 bytes."""
    return np.fromiter((zlib.crc32(n.encode()) for n in names), dtype=np.int64, count=len(names))


class NodeOrder:
    """:func:`order_keys` of a fleet's names, computed once per names tuple (a snapshot and its ledger overlays
    share one)."""

    __slots__ = ("_keys", "_names")

    def __init__(self) -> None:
        self._names: tuple[str, ...] | None = None
        self._keys: IntA = np.zeros(0, dtype=np.int64)

    def keys(self, names: tuple[str, ...]) -> IntA:
        if names is not self._names:
            self._keys = order_keys(names)
            self._names = names
        return self._keys


def single_best(ints: IntA, combined: FloatA, keys: IntA) -> IntA:
    """``ints`` (the rounded means, one per row) with the row kelvin ranks first at :data:`MAX_EXTENDER_PRIORITY`
    and every other row at most one below it. The first row is the highest ``combined``; among rows equal to it (up
    to :data:`TIE_TOLERANCE`), the lowest ``keys``, then the first. Rows whose mean is not finite are never first
    unless no row is finite."""
    if ints.size == 0:
        return ints
    finite = np.isfinite(combined)
    if not finite.any():
        candidates = np.arange(ints.size)
    else:
        best = float(np.max(combined[finite]))
        candidates = np.flatnonzero(finite & (combined >= best - TIE_TOLERANCE * max(1.0, abs(best))))
    first = int(candidates[np.argmin(keys[candidates])]) if candidates.size > 1 else int(candidates[0])
    out = np.minimum(ints, MAX_EXTENDER_PRIORITY - 1)
    out[first] = MAX_EXTENDER_PRIORITY
    return out
