"""Topology: keep multi-GPU pods on well-connected GPUs, and single-GPU pods off well-connected free groups.

Two GPUs of a node are linked at one of four levels, best first: NVLink, the same PCIe switch, the same NUMA node,
across sockets. Each level has a quality in 0..1 (args). A set of GPUs has quality
``share * worst_pair + (1 - share) * mean_pair`` (an all-reduce runs at the speed of its slowest link; the mean breaks
ties). For a node and a mask of usable GPUs, ``best(k)`` is the best quality of any ``k`` of them.

* multi-GPU pods (k >= 2): raw = ``best(k)`` over the GPUs the pod could get (absolute, 0..1);
* single-GPU pods: what matters is connectivity *quality*, not GPU count (keeping large nodes whole for large pods
  is the fragmentation policy's job, which knows the workload's shapes). Taking wholly free GPU j out of the free
  set m costs, in 0..1 (zero on a GPU already shared):

  - half the *link premium* of j: its best link to another free GPU above the node's weakest link
    (``max_i q(j, i) - floor``), i.e. the NVLink or PCIe-switch partner it would leave alone;
  - half the quality the GPUs left lose for every group size they can still host,
    ``sum_{k=2}^{|m|-1} (k/G) * (best_m(k) - best_{m-j}(k))``, over its maximum ``sum_{k=2}^{G-1} k/G``.

  Raw = ``1 - min_j loss``. A node whose GPUs are uniformly connected (all NVLink, or no NVLink or switch data, as in
  a trace) costs nothing whatever its size, so 1-GPU pods are not pushed onto 8-GPU nodes by this score; on a node
  of NVLink pairs the GPU whose partner is busy is free of charge, and an intact pair costs its premium.

Nodes share a handful of wiring patterns, so everything is tabulated once per pattern over all ``2^G`` masks
(G <= 16) and looked up by (pattern, mask) per request; wider nodes fall back to cached enumeration per distinct
(pattern, mask), exact up to ``EXACT_COMBINATIONS`` subsets and greedy beyond. The same tables answer the fit
filter's "are there k eligible GPUs all linked by NVLink" question.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from ..model import FleetArrays, GpuRequest, Topology
from .base import BoolA, CycleContext, FloatA, IntA
from .config import CamelModel
from .eligibility import cycle_eligible, mask_bits, whole_free
from .normalize import unit

LEVEL_NAMES = ("NVLink", "the same PCIe switch", "the same NUMA node", "across sockets")
MAX_TABLE_GPUS = 16
EXACT_COMBINATIONS = 4096
I8A = npt.NDArray[np.int8]


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
    lq: FloatA  # (G, G) pair quality
    nvl: BoolA  # (G, G) NVLink pair
    weights: FloatA  # (G + 1,) k/G for k >= 2, else 0
    qbest: FloatA | None = None  # (G + 1, 2^G) best quality of k of the mask
    clique: BoolA | None = None  # (G + 1, 2^G) some k of the mask are all NVLink-linked
    cval: FloatA | None = None  # (2^G,) connected free capacity of a mask (the multi-GPU picker's tie-break)
    present: BoolA | None = None  # (G,) slots holding a GPU (default: the first n_present)
    loss: FloatA | None = None  # (2^G, G) connectivity quality lost by taking slot j of the mask (0..1)

    @property
    def floor(self) -> float:
        """Quality of the node's weakest link between present slots (what any pair of this node gets anyway)."""
        if self.n_present < 2:
            return 1.0
        cols = np.flatnonzero(self.present) if self.present is not None else np.arange(self.n_present)
        return float(self.lq[np.ix_(cols, cols)].min())

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
            row = self.lq[h, :h]
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
                    partner = np.where((s >> i) & 1 == 1, np.maximum(partner, self.lq[j, i]), partner)
            premium = np.clip(partner - floor, 0.0, None)
            without = s & ~(1 << j)
            drop = np.where(kept, qfin - qfin[:, without], 0.0)
            dsum = (self.weights[:, None] * drop).sum(axis=0)
            loss[:, j] = np.where(has, 0.5 * premium + (0.5 * dsum / norm if norm > 0 else 0.0), 0.0)
        self.qbest, self.clique, self.cval, self.loss = qbest, clique, cval, loss

    # Enumeration (wide nodes, and the picker)
    def best(self, bits: int, k: int, share: float) -> tuple[float, tuple[int, ...]]:
        return best_set(self.lq, _bit_cols(bits, self.g), k, share)

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
            best_set(self.lq, cols, k, share)[0] - best_set(self.lq, rest, k, share)[0] for k in range(2, len(cols))
        ]
        return self._combine(j, rest, drops)

    def slot_losses_greedy(self, bits: int, share: float) -> list[float]:
        """Wide nodes: every slot's loss, with ``best(k)`` approximated by one greedy growth per mask."""
        cols = _bit_cols(bits, self.g)
        full = dict(greedy_chain(self.lq, cols, share))
        out = [0.0] * self.g
        for j in cols:
            rest = [c for c in cols if c != j]
            part = dict(greedy_chain(self.lq, rest, share))
            drops = [max(0.0, full[k] - part[k]) for k in range(2, len(cols))]
            out[j] = self._combine(j, rest, drops)
        return out

    def _combine(self, j: int, rest: list[int], drops: list[float]) -> float:
        """Half the link premium of ``j``, half the size-weighted quality drop of sizes 2.. (``drops[0]`` is k = 2)."""
        partner = max((float(self.lq[j, i]) for i in rest), default=-math.inf)
        premium = max(0.0, partner - self.floor)
        norm = self.drop_norm
        if norm <= 0:
            return 0.5 * premium
        dsum = sum(float(self.weights[k]) * d for k, d in enumerate(drops, start=2))
        return 0.5 * premium + 0.5 * dsum / norm

    def capacity(self, bits: int, share: float) -> float:
        if self.cval is not None:
            return float(self.cval[bits])
        # Wide nodes: one greedy growth gives a nested best set for every size at once.
        return float(
            sum(self.weights[k] * max(0.0, q) for k, q in greedy_chain(self.lq, _bit_cols(bits, self.g), share))
        )


@dataclass(slots=True)
class FleetTopology:
    """The wiring patterns of one fleet: ``pid[row]`` indexes ``patterns``; stacked tables when G <= 16."""

    pid: IntA
    patterns: list[Pattern]
    qbest: FloatA | None
    clique: BoolA | None
    loss: FloatA | None


class TopologyTables:
    """Wiring patterns and their tables, cached per plugin instance across snapshots (patterns repeat)."""

    def __init__(self, link_quality: FloatA, share: float) -> None:
        self.link_quality = link_quality
        self.share = share
        self._patterns: dict[bytes, Pattern] = {}
        self._fleet_key: tuple[object, ...] = ()
        self._fleet: FleetTopology | None = None
        self._memo: dict[tuple[str, int, int, int], object] = {}

    def same_quality(self, other: TopologyTables) -> bool:
        return self.share == other.share and bool(np.array_equal(self.link_quality, other.link_quality))

    def for_fleet(self, fleet: FleetArrays) -> FleetTopology:
        key = (fleet.nvlink, fleet.switch, fleet.numa, fleet.gpu_present)
        if self._fleet is not None:
            if all(a is b for a, b in zip(key, self._fleet_key, strict=True)):
                return self._fleet
            # A copy of the same fleet (the simulator copies, the ledger overlay shares): compare the wiring, which
            # costs far less than recomputing the patterns.
            if all(
                isinstance(b, np.ndarray) and a.shape == b.shape and np.array_equal(a, b)
                for a, b in zip(key, self._fleet_key, strict=True)
            ):
                self._fleet_key = key
                return self._fleet
        n, g = fleet.gpu_present.shape
        if n == 0:  # an empty fleet (no telemetry yet) has no patterns
            empty = FleetTopology(pid=np.zeros(0, dtype=np.int64), patterns=[], qbest=None, clique=None, loss=None)
            self._fleet_key, self._fleet = key, empty
            self._memo.clear()
            return empty
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
                    lq=self.link_quality[lv[r]],
                    nvl=lv[r] == 0,
                    weights=weights,
                    present=fleet.gpu_present[r].copy(),
                )
                if g <= MAX_TABLE_GPUS:
                    pat.build_tables(self.share)
                self._patterns[kb] = pat
            patterns.append(pat)
        qbest: FloatA | None = None
        clique: BoolA | None = None
        loss: FloatA | None = None
        if g <= MAX_TABLE_GPUS:
            qbest = np.stack([p.qbest for p in patterns if p.qbest is not None])
            clique = np.stack([p.clique for p in patterns if p.clique is not None])
            loss = np.stack([p.loss for p in patterns if p.loss is not None])
        ft = FleetTopology(
            pid=inverse.reshape(-1).astype(np.int64),
            patterns=patterns,
            qbest=qbest,
            clique=clique,
            loss=loss,
        )
        self._fleet_key, self._fleet = key, ft
        self._memo.clear()
        return ft

    def _per_key(self, ft: FleetTopology, pids: IntA, bits: IntA, what: str, k: int) -> FloatA:
        """Wide nodes: evaluate per distinct (pattern, mask), memoised."""
        out = np.empty(pids.shape[0], dtype=np.float64)
        for i, (p, b) in enumerate(zip(pids.tolist(), bits.tolist(), strict=True)):
            mk = (what, p, b, -1 if what == "loss" else k)
            v = self._memo.get(mk)
            if v is None:
                pat = ft.patterns[p]
                if what == "best":
                    v = pat.best(b, k, self.share)[0]
                elif what == "clique":
                    v = 1.0 if pat.has_clique(b, k) else 0.0
                else:  # "loss": every slot's, once per (pattern, mask)
                    v = pat.slot_losses_greedy(b, self.share)
                self._memo[mk] = v
            out[i] = v[k] if isinstance(v, list) else float(v)  # type: ignore[arg-type]
        return out

    def best_quality(self, fleet: FleetArrays, idx: IntA, usable: BoolA, k: int) -> FloatA:
        """(n,) best quality of ``k`` usable GPUs per row (-inf when fewer than k are usable)."""
        ft = self.for_fleet(fleet)
        bits = mask_bits(usable)
        if k > usable.shape[1]:
            return np.full(idx.shape[0], -np.inf)
        if ft.qbest is not None:
            return np.asarray(ft.qbest[ft.pid[idx], k, bits], dtype=np.float64)
        return self._per_key(ft, ft.pid[idx], bits, "best", k)

    def has_clique(self, fleet: FleetArrays, idx: IntA, usable: BoolA, k: int) -> BoolA:
        """(n,) some ``k`` usable GPUs of the row are pairwise linked by NVLink."""
        ft = self.for_fleet(fleet)
        if k > usable.shape[1]:
            return np.zeros(idx.shape[0], dtype=np.bool_)
        bits = mask_bits(usable)
        if ft.clique is not None:
            return np.asarray(ft.clique[ft.pid[idx], k, bits], dtype=np.bool_)
        return self._per_key(ft, ft.pid[idx], bits, "clique", k) > 0.5

    def slot_loss(self, fleet: FleetArrays, idx: IntA, free: BoolA) -> FloatA:
        """(n, G) connectivity quality lost by placing one GPU on each slot (0..1; see the module docstring)."""
        ft = self.for_fleet(fleet)
        bits = mask_bits(free)
        pids = ft.pid[idx]
        if ft.loss is not None:
            return np.asarray(ft.loss[pids, bits], dtype=np.float64)
        return np.stack([self._per_key(ft, pids, bits, "loss", j) for j in range(free.shape[1])], axis=1)

    def pattern(self, fleet: FleetArrays, row: int) -> Pattern:
        ft = self.for_fleet(fleet)
        return ft.patterns[int(ft.pid[row])]


def _single_raw(
    tables: TopologyTables, req: GpuRequest, fleet: FleetArrays, idx: IntA, elig: BoolA
) -> tuple[FloatA, FloatA]:
    """Single-GPU pods: (raw per row, loss per slot) where loss is +inf on slots the pod cannot use."""
    loss = tables.slot_loss(fleet, idx, whole_free(fleet, idx))
    loss = np.where(elig, loss, np.inf)
    best = loss.min(axis=1) if loss.shape[1] else np.full(idx.shape[0], np.inf)
    return np.where(np.isfinite(best), 1.0 - best, np.nan), loss


class TopologyScore:
    """Prefer nodes whose usable GPUs form the best-connected group; keep single pods off intact groups."""

    name = "topology"

    def __init__(self, args: TopologyArgs) -> None:
        self.args = args
        self.tables = TopologyTables(args.qualities(), args.worst_link_share)

    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        if not req.wants_gpu or idx.size == 0:
            return np.ones(idx.shape[0], dtype=np.float64)
        elig = cycle_eligible(req, fleet, idx, ctx)
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
            q, s = best_set(pat.lq, cols, req.count, self.args.worst_link_share)
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


class TopologyPicker:
    """Choose the best-connected usable set for multi-GPU pods; for one GPU, the slot that breaks the least."""

    name = "topology"

    def __init__(self, args: TopologyArgs) -> None:
        self.args = args
        self.tables = TopologyTables(args.qualities(), args.worst_link_share)

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
            candidates = [best_set(pat.lq, cols, req.count, share)[1]]
        for s in candidates:
            if need_clique and not all(pat.nvl[a, b] for a, b in itertools.combinations(s, 2)):
                continue
            rest = free_bits
            for c in s:
                rest &= ~(1 << c)
            key = (round(set_quality(pat.lq, s, share), 9), round(pat.capacity(rest, share), 9))
            if best_key is None or key > best_key:
                best_key, best = key, s
        if best is None:
            return None
        return tuple(int(gidx[j]) for j in best)
