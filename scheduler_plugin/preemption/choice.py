"""The cheapest set of victims that frees a placement passing kelvin's filters (pure).

Feasibility is the framework's own: every set of units considered becomes one variant row of the node with those
units' GPUs released (:func:`.overlay.released_rows`), and :meth:`Framework.filter` judges all variants of a batch
in one call: GPU count on one NVLink/PCIe group as the pod asks, memory share on one GPU, model, heat, staleness.

Cost, compared in this order (kube-scheduler's rules first, then the work lost):

1. never a pod of equal or higher priority, nor one with ``kelvin.dev/evictable: "false"`` (its unit is protected);
2. fewest PodDisruptionBudget violations: the victims kube-scheduler says violate one, plus, over the budgets kelvin
   lists itself (:mod:`.pdb`), the victims of the set each budget matches beyond its ``disruptionsAllowed`` (counted
   for the set as a whole, as kube-scheduler does: two victims under a budget that allows one make one violation);
3. fewest pods stopped (a gang counts all its members, on every node);
4. least progress lost: GPU-seconds since each victim's last checkpoint (a fresh ``kelvin.dev/checkpoint-done`` costs
   little), then the lowest highest-priority among the victims.

kube-scheduler's count: the set must give back at least the whole GPUs (``nvidia.com/gpu``) and shared-GPU slots
(``kelvin.dev/shared-gpu``) that kube-scheduler's own victims on the node free (``must_free``): its resource fit
counts them, and a set that frees memory on a GPU but no slot would leave the pod unbound and preempt again.

Search: releasing more never makes a node fit less, so the first feasible set in cost order is the cheapest. Sets
that cannot free enough capacity by a cheap necessary test (whole GPUs free, or one GPU with the share free) are
skipped before the framework judges the rest.
With at most :data:`EXACT_MAX_UNITS` evictable units on the node (a node has 8-16 GPUs; whole-GPU pods and gangs
stay under it) every subset is enumerated in cost order and judged in batches until one fits: exact. With more
(many memory-pool shares), the exact search runs over the :data:`EXACT_MAX_UNITS` cheapest units, and a greedy one
over all: the shortest cost-ordered prefix that fits, then units dropped, most expensive first, while it still fits;
the cheaper answer of the two is kept (bounded: at most ``2**EXACT_MAX_UNITS + units**2`` variants). When the exact
search over the cheapest finds a single unit, that is the cheapest of all (any cheaper set would be a single cheaper
unit, among the cheapest too) and the greedy search is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..model import MILLI_PER_GPU, FleetArrays, GpuRequest
from ..policies.base import BoolA
from ..policies.framework import Framework
from .overlay import released_rows, unit_release
from .pdb import violations
from .victims import Candidate, GangCost, Unit, build_units, kube_count

EXACT_MAX_UNITS = 12
"""Up to this many evictable units, every subset is considered (4,095 variants at most)."""

BATCH = 512
"""Variants judged per framework call."""

FIRST_BATCH = 64
"""Variants judged in the first call of a search."""

Cost = tuple[int, int, float, int]


@dataclass(frozen=True, slots=True)
class Choice:
    """The victims chosen on one node."""

    units: tuple[Unit, ...]
    gpus: tuple[int, ...] | None
    """The GPUs the preemptor would get once they are gone (the framework's picker)."""
    exact: bool
    """Every subset was considered (else the bounded search of the module docstring)."""
    evaluated: int
    """Variants judged."""
    allowed: tuple[int, ...] = ()
    """``disruptionsAllowed`` of the budgets kelvin listed (what the units' ``budget_hits`` index)."""

    @property
    def victims(self) -> tuple[Candidate, ...]:
        return tuple(c for u in self.units for c in u.members)

    @property
    def cost(self) -> Cost:
        return set_cost(self.units, self.allowed)

    @property
    def pdb_violations(self) -> int:
        return set_pdb_violations(self.units, self.allowed)


def set_pdb_violations(units: Iterable[Unit], allowed: Sequence[int] = ()) -> int:
    """PDB violations of evicting ``units`` together."""
    us = list(units)
    return sum(u.flagged for u in us) + violations((b for u in us for b in u.budget_hits), allowed)


def set_cost(units: Iterable[Unit], allowed: Sequence[int] = ()) -> Cost:
    us = list(units)
    return (
        set_pdb_violations(us, allowed),
        sum(u.victims for u in us),
        sum(u.lost_gpu_seconds for u in us),
        max((u.max_priority for u in us), default=-(2**31)),
    )


class _Judge:
    """Judges sets of units (indices into ``units``) on node ``row`` by the framework's filters."""

    def __init__(
        self,
        framework: Framework,
        fleet: FleetArrays,
        row: int,
        req: GpuRequest,
        units: Sequence[Unit],
        now: float,
        allowed: Sequence[int] = (),
        must_free: tuple[int, int] = (0, 0),
    ) -> None:
        self.framework, self.fleet, self.row, self.req, self.units, self.now = framework, fleet, row, req, units, now
        # what each unit gives back as kube-scheduler counts it: whole GPUs (nvidia.com/gpu), shared slots
        self.must_free = must_free
        self.counted = np.array([counted(u) for u in units], dtype=np.int64).reshape(len(units), 2)
        # only the budgets this node's units fall under, as columns 0..B-1 (a cluster may list thousands)
        used = sorted({b for u in units for b in u.budget_hits})
        col = {b: i for i, b in enumerate(used)}
        self.allowed = np.array([allowed[b] for b in used], dtype=np.float64)
        self.hits = np.zeros((len(units), len(used)), dtype=np.float64)
        for i, u in enumerate(units):
            for b in u.budget_hits:
                self.hits[i, col[b]] += 1
        self.evaluated = 0
        g = fleet.max_gpus
        rel = [unit_release(fleet, row, (m.assignment for m in u.members)) for u in units]
        self.milli = np.array([r.milli for r in rel], dtype=np.int64).reshape(len(units), g)
        self.mem = np.array([r.mem for r in rel], dtype=np.int64).reshape(len(units), g)
        self.tenants = np.array([r.tenants for r in rel], dtype=np.int64).reshape(len(units), g)

    def _bits(self, sets: Sequence[Sequence[int]]) -> npt.NDArray[np.int64]:
        bits = np.zeros((len(sets), len(self.units)), dtype=np.int64)
        for i, s in enumerate(sets):
            bits[i, list(s)] = 1
        return bits

    def enough(self, bits: npt.NDArray[np.int64]) -> BoolA:
        """A necessary condition of the fit filter, cheap to test on every row of ``bits``: enough whole GPUs free
        (whole-GPU pods), or one GPU with the share's thousandths and memory free (a share)."""
        f, row, req = self.fleet, self.row, self.req
        present = f.gpu_present[row]
        free_milli = f.free_milli[row].astype(np.int64) + bits @ self.milli  # (K, G)
        if not req.shared:
            out = ((free_milli >= MILLI_PER_GPU) & present).sum(axis=1) >= req.count
        else:
            demand = req.demand_milli(f.mem_total[row]).astype(np.int64)
            ok = (free_milli >= demand) & present
            if req.memory_bytes is not None:
                ok &= f.free_mem[row] + bits @ self.mem >= req.memory_bytes
            out = ok.any(axis=1)
        if self.must_free != (0, 0):  # a set of victims frees at least what kube-scheduler's count needs
            freed = bits @ self.counted  # (K, 2)
            out &= (bits.sum(axis=1) == 0) | ((freed >= np.array(self.must_free, dtype=np.int64)).all(axis=1))
        return np.asarray(out, dtype=np.bool_)

    def _variants(self, bits: npt.NDArray[np.int64]) -> FleetArrays:
        return released_rows(self.fleet, self.row, bits @ self.milli, bits @ self.mem, bits @ self.tenants)

    def fits_bits(self, bits: npt.NDArray[np.int64]) -> BoolA:
        """Per row of ``bits`` (variants x units, 1 where the unit is released): whether the pod fits."""
        ok = np.zeros(bits.shape[0], dtype=np.bool_)
        maybe = np.flatnonzero(self.enough(bits))
        for lo in range(0, maybe.size, BATCH):
            at = maybe[lo : lo + BATCH]
            sub = self._variants(bits[at])
            ctx = self.framework.context(sub, self.now)
            passed = self.framework.filter(self.req, sub, np.arange(at.size, dtype=np.int64), ctx).passed
            ok[at[passed]] = True
            self.evaluated += at.size
        return ok

    def fits(self, sets: Sequence[Sequence[int]]) -> BoolA:
        return self.fits_bits(self._bits(sets))

    def first_fit_bits(self, bits: npt.NDArray[np.int64]) -> int | None:
        """Index of the first row of ``bits`` (in order) that fits, judging batch by batch (a first small batch:
        in cost order the cheap sets, often enough, come first)."""
        lo, size = 0, FIRST_BATCH
        while lo < bits.shape[0]:
            hit = np.flatnonzero(self.fits_bits(bits[lo : lo + size]))
            if hit.size:
                return lo + int(hit[0])
            lo, size = lo + size, BATCH
        return None

    def first_fit(self, sets: Sequence[Sequence[int]]) -> int | None:
        return self.first_fit_bits(self._bits(sets))

    def pick(self, chosen: Sequence[int]) -> tuple[int, ...] | None:
        sub = self._variants(self._bits([chosen]))
        return self.framework.pick(self.req, sub, 0, self.framework.context(sub, self.now))


def counted(unit: Unit) -> tuple[int, int]:
    """What evicting ``unit``'s members on the node gives back as kube-scheduler counts it (:func:`.victims.kube_count`
    summed)."""
    counts = [kube_count(m.assignment) for m in unit.members]
    return sum(w for w, _ in counts), sum(s for _, s in counts)


def _exact(judge: _Judge, pool: Sequence[int]) -> list[int] | None:
    """The cheapest subset of ``pool`` (unit indices) that fits, the empty set included, every subset considered in
    cost order."""
    n = len(pool)
    units = judge.units
    masks = np.arange(0, 2**n, dtype=np.int64)
    sel = (masks[:, None] >> np.arange(n, dtype=np.int64)) & 1  # (M, n)
    weights = sel.astype(np.float64)
    pdb = weights @ np.array([units[u].flagged for u in pool], dtype=np.float64)
    if judge.allowed.size:
        hits = judge.hits[list(pool)]
        pdb += np.maximum(0.0, weights @ hits - judge.allowed).sum(axis=1)
    victims = weights @ np.array([units[u].victims for u in pool], dtype=np.float64)
    lost = weights @ np.array([units[u].lost_gpu_seconds for u in pool], dtype=np.float64)
    prios = np.array([units[u].max_priority for u in pool], dtype=np.float64)
    prio = np.where(sel > 0, prios, -np.inf).max(axis=1) if n else np.full(1, -np.inf)
    order = np.lexsort((prio, lost, victims, pdb))
    bits = np.zeros((masks.size, len(units)), dtype=np.int64)
    bits[:, list(pool)] = sel[order]
    bits = bits[judge.enough(bits)]  # keeps the cost order
    hit = judge.first_fit_bits(bits)
    return None if hit is None else [int(u) for u in np.flatnonzero(bits[hit])]


def _greedy(judge: _Judge, pool: Sequence[int]) -> list[int] | None:
    """The shortest cost-ordered prefix of ``pool`` that fits, then pruned: the most expensive unit whose removal
    still fits is dropped, until none can be."""
    if not pool:
        return None
    units = judge.units
    order = sorted(pool, key=lambda u: units[u].cost())
    prefixes = [order[: k + 1] for k in range(len(order))]
    hit = judge.first_fit(prefixes)
    if hit is None:
        return None
    chosen = list(prefixes[hit])
    while len(chosen) > 1:
        trials = [[u for u in chosen if u != drop] for drop in chosen]
        ok = judge.fits(trials)
        removable = [chosen[i] for i in np.flatnonzero(ok).tolist()]
        if not removable:
            break
        drop = max(removable, key=lambda u: units[u].cost())
        chosen.remove(drop)
    return chosen


def choose_victims(  # noqa: PLR0913
    framework: Framework,
    fleet: FleetArrays,
    row: int,
    req: GpuRequest,
    candidates: Iterable[Candidate],
    now: float,
    *,
    gangs: Mapping[str, GangCost] | None = None,
    exact_max: int = EXACT_MAX_UNITS,
    pick: bool = True,
    allowed: Sequence[int] = (),
    must_free: tuple[int, int] = (0, 0),
) -> Choice | None:
    """The cheapest units to evict from node ``row`` so that ``req`` passes the framework's filters there, or None
    when no set of evictable lower-priority units does.

    ``fleet`` is the fleet as the cycle sees it (the caller applies the assumed-allocation ledger first);
    ``candidates`` the pods on the node holding GPUs there (any priority: protected ones are never chosen);
    ``gangs`` the fleet-wide cost of each gang (:func:`.victims.gang_costs`). A Choice with no units means the pod
    fits without evicting anyone kelvin knows of. ``pick``: also ask the framework's picker which GPUs the pod would get
    (one more framework call; the extender's verb skips it: kube-scheduler binds later, through filter and bind).
    ``allowed``: the ``disruptionsAllowed`` of each PodDisruptionBudget kelvin listed (the candidates' ``budgets``
    index it). ``must_free``: the whole GPUs and shared-GPU slots (:func:`counted`) a non-empty set must give back:
    what kube-scheduler's own victims free by its count (its fit filter must pass too, or the pod does not bind)."""
    units = build_units(candidates, req.priority, gangs, allowed)
    judge = _Judge(framework, fleet, row, req, units, now, allowed, must_free)
    pool = [i for i, u in enumerate(units) if not u.protected and any(m.assignment.gpu_indices for m in u.members)]
    if len(pool) <= exact_max:
        best = _exact(judge, pool)  # the empty set first: no victim at all when the pod fits already
        exact = True
    elif judge.fits([[]])[0]:
        best, exact = [], True
    else:
        cheapest = sorted(pool, key=lambda u: units[u].cost())[:exact_max]
        best = _exact(judge, cheapest)
        # One unit among the cheapest is the cheapest of all: a cheaper set would be one cheaper unit, which is
        # among the cheapest too and would have been found first. Otherwise the greedy search may do better.
        exact = best is not None and len(best) == 1
        if not exact:
            found = [s for s in (best, _greedy(judge, pool)) if s]
            best = min(found, key=lambda s: set_cost((units[u] for u in s), allowed)) if found else None
    if best is None:
        return None
    chosen = sorted(best)
    return Choice(
        units=tuple(units[u] for u in chosen),
        gpus=judge.pick(chosen) if pick else None,
        exact=exact,
        evaluated=judge.evaluated,
        allowed=tuple(allowed),
    )
