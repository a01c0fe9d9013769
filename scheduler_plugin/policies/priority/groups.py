"""Free NVLink groups of a node: how many disjoint, fully NVLink-connected groups of ``k`` GPUs a set of free GPUs
holds, and how many of them placing ``g`` GPUs there destroys at best (pure, memoised per wiring).

A node's wiring is its ``(G, G)`` NVLink matrix over its present GPU columns; a set of GPUs is a bit mask over those
columns. ``capacity(k, m)`` is the largest number of disjoint ``k``-cliques (every pair NVLink-linked; ``k = 1``: any
GPU) inside mask ``m``; ``loss(m, g)`` the least, over every ``g`` GPUs of ``m``, of the weighted capacity they take
away. Nodes share a handful of wirings, and a fleet a handful of masks per wiring, so both are cached per
(wiring, mask); the caches are bounded (cleared when full), derived from the arrays alone, and shared by no request
state.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import combinations

import numpy as np
import numpy.typing as npt

CACHE_SIZE = 65_536
"""Entries per memo (``lru_cache``): masks x wirings x sizes seen."""


def _bits(mask: int) -> list[int]:
    return [j for j in range(mask.bit_length()) if mask >> j & 1]


class Wiring:
    """One NVLink wiring: ``links[j]`` is the bit mask of the columns column ``j`` is NVLink-linked to."""

    __slots__ = ("_hash", "links")

    def __init__(self, links: Sequence[int]) -> None:
        self.links = tuple(int(x) for x in links)
        self._hash = hash(self.links)

    @classmethod
    def of(cls, nvlink: npt.NDArray[np.bool_], present: npt.NDArray[np.bool_]) -> Wiring:
        """The wiring of one node's row (``nvlink``: ``(G, G)``; ``present``: ``(G,)``)."""
        g = present.shape[0]
        weights = np.left_shift(1, np.arange(g, dtype=np.int64))
        linked = (nvlink & present[None, :] & present[:, None]).astype(np.int64) @ weights
        return cls([int(x) for x in linked.tolist()])

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Wiring) and other.links == self.links

    def is_clique(self, cols: Sequence[int]) -> bool:
        return all(self.links[a] >> b & 1 for i, a in enumerate(cols) for b in cols[i + 1 :])


@lru_cache(maxsize=CACHE_SIZE)
def capacity(wiring: Wiring, k: int, mask: int) -> int:
    """The most disjoint ``k``-GPU NVLink cliques inside ``mask`` (exact: the lowest GPU of ``mask`` is either in one
    of them, with ``k - 1`` of its linked GPUs, or in none)."""
    if k <= 1:
        return mask.bit_count()
    if mask.bit_count() < k:
        return 0
    low = mask & -mask
    j = low.bit_length() - 1
    rest = mask & ~low
    best = capacity(wiring, k, rest)
    peers = _bits(rest & wiring.links[j])
    for others in combinations(peers, k - 1):
        if wiring.is_clique(others):
            taken = sum(1 << c for c in others)
            best = max(best, 1 + capacity(wiring, k, rest & ~taken))
    return best


def value(wiring: Wiring, mask: int, sizes: Sequence[tuple[int, float]]) -> float:
    """The weighted group capacity of ``mask``: ``sum(weight * k * capacity(k, mask))`` over ``sizes`` ((k, weight)
    pairs): the GPUs it keeps available as whole groups of each size."""
    return sum(w * k * capacity(wiring, k, mask) for k, w in sizes)


@lru_cache(maxsize=CACHE_SIZE)
def drops(wiring: Wiring, mask: int, g: int, ks: tuple[int, ...]) -> npt.NDArray[np.float64]:
    """``(S, len(ks))``: for each of the ``S`` Pareto-distinct choices of ``g`` GPUs of ``mask``, the GPUs of
    ``k``-groups it takes away (``k * capacity drop``) per size of ``ks``; no row when ``mask`` has fewer than ``g``.
    Weight-free, so a learned mix whose weights move reuses it."""
    cols = _bits(mask)
    if len(cols) < g:
        return np.zeros((0, len(ks)), dtype=np.float64)
    before = [k * capacity(wiring, k, mask) for k in ks]
    seen: set[tuple[int, ...]] = set()
    for take in combinations(cols, g):
        rest = mask & ~sum(1 << c for c in take)
        seen.add(tuple(b - k * capacity(wiring, k, rest) for b, k in zip(before, ks, strict=True)))
    out = np.array(sorted(seen), dtype=np.float64).reshape(len(seen), len(ks))
    out.setflags(write=False)
    return out


def loss(wiring: Wiring, mask: int, g: int, sizes: Sequence[tuple[int, float]]) -> float:
    """The least weighted group capacity (:func:`value`) that taking ``g`` GPUs of ``mask`` destroys, over every
    choice of them; ``inf`` when ``mask`` has fewer than ``g`` GPUs."""
    ks = tuple(k for k, _ in sizes)
    d = drops(wiring, mask, g, ks)
    if d.shape[0] == 0:
        return float("inf")
    return float((d @ np.array([w for _, w in sizes], dtype=np.float64)).min())
