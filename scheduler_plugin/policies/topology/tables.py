"""Wiring patterns of a fleet and their tables: the best quality of ``k`` GPUs of every mask, NVLink cliques, the
connected capacity of a mask and the connectivity lost by taking one slot (see the package docstring)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import numpy.typing as npt

from ...model import FleetArrays
from ...model.snapshot import IndexKey
from ..base import BoolA, FloatA, IntA
from ..eligibility import mask_bits

LEVEL_NAMES = ("NVLink", "the same PCIe switch", "the same NUMA node", "across sockets")
MAX_TABLE_GPUS = 16
EXACT_COMBINATIONS = 4096
I8A = npt.NDArray[np.int8]


def link_levels(fleet: FleetArrays, idx: IntA) -> I8A:
    """(n, G, G) link level between slots: 0 NVLink, 1 same PCIe switch, 2 same NUMA node, 3 across sockets."""
    sw = fleet.switch[idx]
    nu = fleet.numa[idx]
    same_numa = (nu[:, :, None] == nu[:, None, :]) & (nu[:, :, None] >= 0)
    same_sw = (sw[:, :, None] == sw[:, None, :]) & (sw[:, :, None] >= 0)
    lv = np.where(same_numa, 2, 3).astype(np.int8)
    lv[same_sw] = 1
    lv[fleet.nvlink[idx]] = 0
    g = lv.shape[1]
    lv[:, np.arange(g), np.arange(g)] = 0
    return lv


def set_quality(lq: FloatA, cols: tuple[int, ...], share: float) -> float:
    """Quality of a set of slots under the pair-quality matrix ``lq``."""
    if len(cols) < 2:
        return 1.0 if cols else -math.inf
    a = np.asarray(cols)
    ia, ib = np.triu_indices(len(cols), 1)
    pq = lq[a[ia], a[ib]]
    return float(share * pq.min() + (1 - share) * pq.mean())


def best_set(lq: FloatA, cols: list[int], k: int, share: float) -> tuple[float, tuple[int, ...]]:
    """The best ``k`` of ``cols``: exact when there are at most EXACT_COMBINATIONS subsets, greedy beyond."""
    if k <= 0:
        return 1.0, ()
    if len(cols) < k:
        return -math.inf, ()
    if math.comb(len(cols), k) <= EXACT_COMBINATIONS:
        best_q, best_s = -math.inf, cast(tuple[int, ...], ())
        for s in itertools.combinations(cols, k):
            q = set_quality(lq, s, share)
            if q > best_q + 1e-12:
                best_q, best_s = q, s
        return best_q, best_s
    # Greedy: start from the best pair, then add the slot that keeps the set best.
    pairs = [(lq[a, b], (a, b)) for a, b in itertools.combinations(cols, 2)]
    chosen = list(max(pairs, key=lambda p: p[0])[1]) if k >= 2 else [cols[0]]
    while len(chosen) < k:
        rest = [c for c in cols if c not in chosen]
        nxt = max(rest, key=lambda c: set_quality(lq, (*chosen, c), share))
        chosen.append(nxt)
    s = tuple(sorted(chosen))
    return set_quality(lq, s, share), s


def greedy_chain(lq: FloatA, cols: list[int], share: float) -> list[tuple[int, float]]:
    """(k, quality) of nested sets grown greedily from the best pair: an approximation of ``best(k)`` for every k."""
    if len(cols) < 2:
        return []
    a, b = max(itertools.combinations(cols, 2), key=lambda p: lq[p[0], p[1]])
    chosen = [a, b]
    out = [(2, set_quality(lq, (a, b), share))]
    rest = [c for c in cols if c not in chosen]
    while rest:
        best_q, best_c = -math.inf, rest[0]
        for c in rest:
            q = set_quality(lq, (*chosen, c), share)
            if q > best_q + 1e-12:
                best_q, best_c = q, c
        chosen.append(best_c)
        rest.remove(best_c)
        out.append((len(chosen), best_q))
    return out


def _bit_cols(bits: int, g: int) -> list[int]:
    return [j for j in range(g) if bits >> j & 1]


@dataclass(slots=True)
class Pattern:
    """One wiring pattern (link levels between slots, which slots are present) and its tables."""

    g: int
    n_present: int
    levels: I8A  # (G, G) link level
    pair_quality: FloatA  # (G, G) quality of the link between two slots
    nvl: BoolA  # (G, G) NVLink pair
    weights: FloatA  # (G + 1,) k/G for k >= 2, else 0
    best_quality: FloatA | None = None  # (G + 1, 2^G) best quality of k of the mask
    clique: BoolA | None = None  # (G + 1, 2^G) some k of the mask are all NVLink-linked
    connected_capacity: FloatA | None = None  # (2^G,) connected free capacity of a mask (multi-GPU picker's tie-break)
    present: BoolA | None = None  # (G,) slots holding a GPU (default: the first n_present)
    loss: FloatA | None = None  # (2^G, G) connectivity quality lost by taking slot j of the mask (0..1)

    @property
    def floor(self) -> float:
        """Quality of the node's weakest link between present slots (what any pair of this node gets anyway)."""
        if self.n_present < 2:
            return 1.0
        cols = np.flatnonzero(self.present) if self.present is not None else np.arange(self.n_present)
        return float(self.pair_quality[np.ix_(cols, cols)].min())

    @property
    def drop_norm(self) -> float:
        """Maximum of the size-weighted quality drop: ``sum_{k=2}^{n-1} k/G`` (0 on nodes of two GPUs or fewer)."""
        return float(self.weights[2 : self.n_present].sum())

    def build_tables(self, share: float) -> None:
        """Tabulate every mask of the pattern. O(G^2 * 2^G) time, O(G * 2^G) memory; about 0.1 s for G = 16."""
        g = self.g
        n_sub = 1 << g
        s = np.arange(n_sub, dtype=np.int64)
        pop = np.zeros(n_sub, dtype=np.int64)
        for j in range(g):
            pop += (s >> j) & 1
        # Per subset: worst pair, sum of pairs, all pairs NVLink; built by adding the highest slot h to every subset
        # of the slots below it.
        qmin = np.full(n_sub, np.inf)
        qsum = np.zeros(n_sub)
        linked = np.ones(n_sub, dtype=np.bool_)
        for h in range(1, g):
            lo = 1 << h
            below = ((s[:lo, None] >> np.arange(h)) & 1).astype(np.bool_)  # (2^h, h)
            row = self.pair_quality[h, :h]
            blk = slice(lo, 2 * lo)
            qmin[blk] = np.minimum(qmin[:lo], np.where(below, row[None, :], np.inf).min(axis=1))
            qsum[blk] = qsum[:lo] + below @ row
            linked[blk] = linked[:lo] & (~below | self.nvl[h, :h][None, :]).all(axis=1)
        npairs = pop * (pop - 1) // 2
        qset = np.where(pop >= 2, share * qmin + (1 - share) * qsum / np.maximum(npairs, 1), -np.inf)
        qset[pop == 1] = 1.0
        # best(k)[m] = max over subsets t of m with |t| = k: a subset-max transform, one pass per slot
        qbest = np.where(pop[None, :] == np.arange(g + 1)[:, None], qset[None, :], -np.inf)
        clique = (pop[None, :] == np.arange(g + 1)[:, None]) & (linked | (pop <= 1))[None, :]
        for j in range(g):
            qv = qbest.reshape(g + 1, -1, 2, 1 << j)
            np.maximum(qv[:, :, 1, :], qv[:, :, 0, :], out=qv[:, :, 1, :])
            cv = clique.reshape(g + 1, -1, 2, 1 << j)
            np.logical_or(cv[:, :, 1, :], cv[:, :, 0, :], out=cv[:, :, 1, :])
        qbest[0] = 1.0
        clique[0] = True
        cval = (self.weights[:, None] * np.maximum(qbest, 0.0)).sum(axis=0)
        floor, norm = self.floor, self.drop_norm
        # sizes 2..|m|-1 of every mask (the sizes the mask can still host once one slot is taken)
        ks = np.arange(g + 1)[:, None]
        kept = (ks >= 2) & (ks <= pop[None, :] - 1)
        qfin = np.where(np.isfinite(qbest), qbest, 0.0)  # finite on every kept size of a mask and its submask
        loss = np.zeros((n_sub, g))
        for j in range(g):
            has = ((s >> j) & 1).astype(np.bool_)
            # best link from j to another slot of the mask: a subset max over the other slots
            partner = np.full(n_sub, -np.inf)
            for i in range(g):
                if i != j:
                    partner = np.where((s >> i) & 1 == 1, np.maximum(partner, self.pair_quality[j, i]), partner)
            premium = np.clip(partner - floor, 0.0, None)
            without = s & ~(1 << j)
            drop = np.where(kept, qfin - qfin[:, without], 0.0)
            dsum = (self.weights[:, None] * drop).sum(axis=0)
            loss[:, j] = np.where(has, 0.5 * premium + (0.5 * dsum / norm if norm > 0 else 0.0), 0.0)
        self.best_quality, self.clique, self.connected_capacity, self.loss = qbest, clique, cval, loss

    # Enumeration (wide nodes, and the picker)
    def best(self, bits: int, k: int, share: float) -> tuple[float, tuple[int, ...]]:
        return best_set(self.pair_quality, _bit_cols(bits, self.g), k, share)

    def has_clique(self, bits: int, k: int) -> bool:
        q, _ = best_set(self.nvl.astype(np.float64), _bit_cols(bits, self.g), k, 1.0)
        return q >= 1.0

    def slot_loss(self, bits: int, j: int, share: float) -> float:
        """Connectivity quality lost by taking slot ``j`` of ``bits``, enumerated exactly (the tables' definition)."""
        if not bits >> j & 1:
            return 0.0
        cols = _bit_cols(bits, self.g)
        rest = [c for c in cols if c != j]
        drops = [
            best_set(self.pair_quality, cols, k, share)[0] - best_set(self.pair_quality, rest, k, share)[0]
            for k in range(2, len(cols))
        ]
        return self._combine(j, rest, drops)

    def slot_losses_greedy(self, bits: int, share: float) -> list[float]:
        """Wide nodes: every slot's loss, with ``best(k)`` approximated by one greedy growth per mask."""
        cols = _bit_cols(bits, self.g)
        full = dict(greedy_chain(self.pair_quality, cols, share))
        out = [0.0] * self.g
        for j in cols:
            rest = [c for c in cols if c != j]
            part = dict(greedy_chain(self.pair_quality, rest, share))
            drops = [max(0.0, full[k] - part[k]) for k in range(2, len(cols))]
            out[j] = self._combine(j, rest, drops)
        return out

    def _combine(self, j: int, rest: list[int], drops: list[float]) -> float:
        """Half the link premium of ``j``, half the size-weighted quality drop of sizes 2.. (``drops[0]`` is k = 2)."""
        partner = max((float(self.pair_quality[j, i]) for i in rest), default=-math.inf)
        premium = max(0.0, partner - self.floor)
        norm = self.drop_norm
        if norm <= 0:
            return 0.5 * premium
        dsum = sum(float(self.weights[k]) * d for k, d in enumerate(drops, start=2))
        return 0.5 * premium + 0.5 * dsum / norm

    def capacity(self, bits: int, share: float) -> float:
        if self.connected_capacity is not None:
            return float(self.connected_capacity[bits])
        # Wide nodes: one greedy growth gives a nested best set for every size at once.
        return float(
            sum(
                self.weights[k] * max(0.0, q)
                for k, q in greedy_chain(self.pair_quality, _bit_cols(bits, self.g), share)
            )
        )


@dataclass(slots=True)
class FleetTopology:
    """The wiring patterns of one fleet: ``pid[row]`` indexes ``patterns``; stacked tables when G <= 16."""

    pid: IntA
    patterns: list[Pattern]
    best_quality: FloatA | None
    """(P, G + 1, 2^G) :attr:`Pattern.best_quality` of every pattern (None for wide nodes)."""
    clique: BoolA | None
    loss: FloatA | None
    wide_best: dict[tuple[int, int, int], float] = field(default_factory=dict)
    """Wide nodes: (pattern, mask, k) -> best quality of k of the mask, as asked."""
    wide_clique: dict[tuple[int, int, int], bool] = field(default_factory=dict)
    wide_loss: dict[tuple[int, int], list[float]] = field(default_factory=dict)


#: The columns the wiring patterns are read from (never written in place, not by the simulator either).
WIRING_COLUMNS = ("nvlink", "switch", "numa", "gpu_present")
TOPOLOGY = IndexKey[FleetTopology]("topology.fleet", WIRING_COLUMNS, limit=8)
"""Snapshot index: the :class:`FleetTopology` of a fleet per (link qualities, worst-link share)."""


class TopologyTables:
    """Wiring patterns and their tables for one set of link qualities.

    The patterns (one per distinct wiring, tabulated over every mask) are kept by the instance across snapshots
    (nodes keep their wiring); which pattern each row of a fleet has (:class:`FleetTopology`) is in the fleet's
    snapshot index, computed once per snapshot and shared by every plugin of the same qualities."""

    def __init__(self, link_quality: FloatA, share: float) -> None:
        self.link_quality = link_quality
        self.share = share
        self._patterns: dict[bytes, Pattern] = {}
        self._quality = (link_quality.tobytes(), share)

    def same_quality(self, other: TopologyTables) -> bool:
        return self.share == other.share and bool(np.array_equal(self.link_quality, other.link_quality))

    def for_fleet(self, fleet: FleetArrays) -> FleetTopology:
        """The wiring patterns of ``fleet``'s rows: from its snapshot index, computed once per snapshot."""
        return fleet.derive(TOPOLOGY, self._patterns_of, self._quality)

    def _patterns_of(self, fleet: FleetArrays) -> FleetTopology:
        n, g = fleet.gpu_present.shape
        if n == 0:  # an empty fleet (no telemetry yet) has no patterns
            return FleetTopology(
                pid=np.zeros(0, dtype=np.int64), patterns=[], best_quality=None, clique=None, loss=None
            )
        rows = np.arange(n, dtype=np.int64)
        lv = link_levels(fleet, rows)
        raw = np.concatenate([lv.reshape(n, -1), fleet.gpu_present.astype(np.int8)], axis=1)
        raw = np.ascontiguousarray(raw)
        keys = raw.view(np.dtype((np.void, raw.shape[1]))).ravel()
        uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        patterns: list[Pattern] = []
        for u, r in zip(uniq.tolist(), first.tolist(), strict=True):
            kb = bytes(u)
            pat = self._patterns.get(kb)
            if pat is None:
                weights = np.arange(g + 1, dtype=np.float64) / g
                weights[:2] = 0.0
                pat = Pattern(
                    g=g,
                    n_present=int(fleet.gpu_present[r].sum()),
                    levels=lv[r],
                    pair_quality=self.link_quality[lv[r]],
                    nvl=lv[r] == 0,
                    weights=weights,
                    present=fleet.gpu_present[r].copy(),
                )
                if g <= MAX_TABLE_GPUS:
                    pat.build_tables(self.share)
                self._patterns[kb] = pat
            patterns.append(pat)
        best_quality: FloatA | None = None
        clique: BoolA | None = None
        loss: FloatA | None = None
        if g <= MAX_TABLE_GPUS:
            best_quality = np.stack([p.best_quality for p in patterns if p.best_quality is not None])
            clique = np.stack([p.clique for p in patterns if p.clique is not None])
            loss = np.stack([p.loss for p in patterns if p.loss is not None])
        return FleetTopology(
            pid=inverse.reshape(-1).astype(np.int64),
            patterns=patterns,
            best_quality=best_quality,
            clique=clique,
            loss=loss,
        )

    # Wide nodes (G > MAX_TABLE_GPUS): evaluated per distinct (pattern, mask), memoised in the fleet's topology.

    def _wide_best(self, ft: FleetTopology, pids: IntA, bits: IntA, k: int) -> FloatA:
        out = np.empty(pids.shape[0], dtype=np.float64)
        for i, (p, b) in enumerate(zip(pids.tolist(), bits.tolist(), strict=True)):
            v = ft.wide_best.get((p, b, k))
            if v is None:
                v = ft.wide_best[(p, b, k)] = ft.patterns[p].best(b, k, self.share)[0]
            out[i] = v
        return out

    def _wide_clique(self, ft: FleetTopology, pids: IntA, bits: IntA, k: int) -> BoolA:
        out = np.empty(pids.shape[0], dtype=np.bool_)
        for i, (p, b) in enumerate(zip(pids.tolist(), bits.tolist(), strict=True)):
            v = ft.wide_clique.get((p, b, k))
            if v is None:
                v = ft.wide_clique[(p, b, k)] = ft.patterns[p].has_clique(b, k)
            out[i] = v
        return out

    def _wide_loss(self, ft: FleetTopology, pids: IntA, bits: IntA, g: int) -> FloatA:
        """(n, G) every slot's loss, once per (pattern, mask)."""
        out = np.empty((pids.shape[0], g), dtype=np.float64)
        for i, (p, b) in enumerate(zip(pids.tolist(), bits.tolist(), strict=True)):
            v = ft.wide_loss.get((p, b))
            if v is None:
                v = ft.wide_loss[(p, b)] = ft.patterns[p].slot_losses_greedy(b, self.share)
            out[i] = v
        return out

    def best_quality(self, fleet: FleetArrays, idx: IntA, usable: BoolA, k: int) -> FloatA:
        """(n,) best quality of ``k`` usable GPUs per row (-inf when fewer than k are usable)."""
        ft = self.for_fleet(fleet)
        bits = mask_bits(usable)
        if k > usable.shape[1]:
            return np.full(idx.shape[0], -np.inf)
        if ft.best_quality is not None:
            return np.asarray(ft.best_quality[ft.pid[idx], k, bits], dtype=np.float64)
        return self._wide_best(ft, ft.pid[idx], bits, k)

    def has_clique(self, fleet: FleetArrays, idx: IntA, usable: BoolA, k: int) -> BoolA:
        """(n,) some ``k`` usable GPUs of the row are pairwise linked by NVLink."""
        ft = self.for_fleet(fleet)
        if k > usable.shape[1]:
            return np.zeros(idx.shape[0], dtype=np.bool_)
        bits = mask_bits(usable)
        if ft.clique is not None:
            return np.asarray(ft.clique[ft.pid[idx], k, bits], dtype=np.bool_)
        return self._wide_clique(ft, ft.pid[idx], bits, k)

    def slot_loss(self, fleet: FleetArrays, idx: IntA, free: BoolA) -> FloatA:
        """(n, G) connectivity quality lost by placing one GPU on each slot (0..1; see the module docstring)."""
        ft = self.for_fleet(fleet)
        bits = mask_bits(free)
        pids = ft.pid[idx]
        if ft.loss is not None:
            return np.asarray(ft.loss[pids, bits], dtype=np.float64)
        return self._wide_loss(ft, pids, bits, free.shape[1])

    def pattern(self, fleet: FleetArrays, row: int) -> Pattern:
        ft = self.for_fleet(fleet)
        return ft.patterns[int(ft.pid[row])]
