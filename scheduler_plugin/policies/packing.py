"""Packing plan: which GPU shares should end up together, from the optimal fractional packing of the workload.

FGD's gradient is myopic: it scores the fleet as if the next pod were the last. It puts a 0.32 GPU pod next to a
0.47 one (leaving 0.21 that almost nothing fits) because that is less fragmented *now* than opening a fresh GPU,
while the workload keeps sending 0.47 pods that would have filled that gap to 0.94.

The plan looks further. For the shared-GPU part of the target workload (shares of one GPU and their frequencies) it
solves the *arc-flow* linear programme of bin packing (Valério de Carvalho, 1999): GPU fill levels 0..B are nodes,
placing a share of size s on a GPU filled to level u is an arc u -> u + s, leaving the rest of a GPU empty is a free
arc u -> B, and the programme routes the workload's shares through GPUs using as few GPUs as possible. The LP's dual
prices every placement: the *reduced cost* of an arc is how many GPUs (per unit of flow) a packing that insists on
that placement loses against the optimal one. Placements of the optimal packing cost 0; a 0.32 share on a 0.47 GPU
costs more than on a 0.65 one or on a fresh GPU.

The fragmentation policy uses the reduced cost as its first criterion for shared pods (FGD's quantised gradient
decides among equally good placements, and CPU, memory, model and multi-GPU fit still come from FGD's measure).
Whole-GPU pods are not affected: they always go on a fresh GPU.

Shares are counted in units of ``UNIT`` thousandths (10: 1 % of a GPU); a share is rounded up to a unit and a free
share down, so the plan never assumes a fit the GPU does not have. The LP has (B + 1) nodes and about B arcs per
distinct share size: a few thousand columns, solved by HiGHS (scipy) in milliseconds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ..model import MILLI_PER_GPU

log = logging.getLogger(__name__)

FloatA = npt.NDArray[np.float64]
IntA = npt.NDArray[np.int64]

UNIT = 10
"""Thousandths of a GPU per plan unit."""
LEVELS = MILLI_PER_GPU // UNIT
DEFAULT_REPLAN_DRIFT = 0.05
"""Re-solve when the share distribution moved this far (L1 distance) from the one the plan was solved for."""
COST_STEP = 0.01
"""Reduced costs are compared in hundredths of a GPU: smaller differences are numerical noise of the LP."""


def size_units(milli: IntA) -> IntA:
    """Shares in plan units, rounded up (a 0.115 GPU share needs 12 units)."""
    # np.minimum/np.maximum: np.clip's values without its per-call dispatch (every shared pod's placements)
    return np.minimum(np.maximum(-(-np.asarray(milli, dtype=np.int64) // UNIT), 1), LEVELS)


def free_units(milli: IntA) -> IntA:
    """Free shares in plan units, rounded down."""
    return np.minimum(np.maximum(np.asarray(milli, dtype=np.int64) // UNIT, 0), LEVELS)


@dataclass(frozen=True, slots=True)
class PackingPlan:
    """The reduced cost of every (fill level, share size) placement, from the arc-flow LP of a share distribution."""

    sizes: IntA
    """(S,) distinct share sizes the plan was solved for, in units."""
    weights: FloatA
    """(S,) their relative frequencies (sum 1)."""
    cost: FloatA
    """(LEVELS + 1, LEVELS + 1) reduced cost of placing a share of ``size`` units on a GPU filled to ``level`` units
    (``cost[level, size]``), in GPUs per placement; ``inf`` where it does not fit. Sizes the plan was not solved for
    get the cost of the next larger planned size (the LP's prices are monotone enough for that to be a safe guess)."""
    gpus_per_share_gpu: float
    """GPUs the optimal fractional packing uses per GPU of shared demand (1.0 = no waste at all)."""
    _penalty: FloatA = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # a placement that does not fit (inf) prices 0, here once rather than per call
        rounded = np.round(self.cost / COST_STEP)
        object.__setattr__(self, "_penalty", np.where(np.isfinite(rounded), rounded, 0.0))

    def penalty(self, free_before: IntA, demand: IntA) -> FloatA:
        """Reduced cost of each placement, in hundredths of a GPU (0 for a placement of the optimal packing).

        ``free_before`` and ``demand`` are thousandths (arrays of the same shape): the GPU's free share before the
        placement and the share placed on it."""
        level = LEVELS - free_units(free_before)
        size = size_units(demand)
        return np.asarray(self._penalty[level, size], dtype=np.float64)

    def distance(self, sizes: IntA, weights: FloatA) -> float:
        """L1 distance between this plan's share distribution and another one (0 = same, 2 = disjoint)."""
        a = np.zeros(LEVELS + 1)
        b = np.zeros(LEVELS + 1)
        np.add.at(a, self.sizes, self.weights)
        np.add.at(b, sizes, weights / max(float(weights.sum()), 1e-12))
        return float(np.abs(a - b).sum())


def share_distribution(milli: IntA, prob: FloatA) -> tuple[IntA, FloatA]:
    """(distinct sizes in units, their normalised weights) of the shares ``milli`` (< one GPU) with weights ``prob``."""
    milli = np.asarray(milli, dtype=np.int64)
    prob = np.asarray(prob, dtype=np.float64)
    keep = (milli > 0) & (milli < MILLI_PER_GPU) & (prob > 0)
    if not keep.any():
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    units = size_units(milli[keep])
    sizes, inv = np.unique(units, return_inverse=True)
    w = np.bincount(inv, weights=prob[keep])
    return sizes.astype(np.int64), w / w.sum()


def load_solver() -> None:
    """Import the LP solver (scipy's HiGHS): 1-2 s of CPU, which a policy that plans pays when it is built rather
    than inside its first shared pod's request (or a simulator's first trace replay)."""
    import scipy.optimize
    import scipy.sparse  # noqa: F401


def solve(sizes: IntA, weights: FloatA) -> PackingPlan | None:
    """The packing plan of a share distribution (``None`` if there are no shares or the LP solver fails)."""
    from scipy.optimize import linprog  # imported here: only the fragmentation policy needs scipy
    from scipy.sparse import coo_array

    sizes = np.asarray(sizes, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float64)
    if len(sizes) == 0:
        return None
    b = LEVELS
    # Columns: item arcs (u -> u + s) for every planned size, then loss arcs (u -> B) for u in 1..B-1.
    item_u = np.concatenate([np.arange(0, b - s + 1) for s in sizes])
    item_s = np.concatenate([np.full(b - s + 1, k) for k, s in enumerate(sizes)])
    item_v = item_u + sizes[item_s]
    loss_u = np.arange(1, b)
    tail = np.concatenate([item_u, loss_u])
    head = np.concatenate([item_v, np.full(len(loss_u), b)])
    n_cols = len(tail)
    cols = np.arange(n_cols)
    cost = (tail == 0).astype(np.float64)  # a GPU is used when something is placed on an empty one
    # Rows 0..B-2: flow conservation at levels 1..B-1 (in - out = 0); rows B-1..: each size's flow = its weight.
    rows: list[IntA] = []
    cidx: list[IntA] = []
    vals: list[FloatA] = []
    inner_head = (head >= 1) & (head <= b - 1)
    rows.append(head[inner_head] - 1)
    cidx.append(cols[inner_head])
    vals.append(np.ones(int(inner_head.sum())))
    inner_tail = (tail >= 1) & (tail <= b - 1)
    rows.append(tail[inner_tail] - 1)
    cidx.append(cols[inner_tail])
    vals.append(-np.ones(int(inner_tail.sum())))
    rows.append(b - 1 + item_s)
    cidx.append(np.arange(len(item_u)))
    vals.append(np.ones(len(item_u)))
    a = coo_array(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cidx))), shape=(b - 1 + len(sizes), n_cols)
    ).tocsr()
    rhs = np.concatenate([np.zeros(b - 1), weights])
    try:
        res = linprog(cost, A_eq=a, b_eq=rhs, bounds=(0, None), method="highs")
    except (ValueError, RuntimeError) as exc:  # pragma: no cover - defensive: HiGHS reports failures via status
        log.warning("packing plan: LP solver failed: %s", exc)
        return None
    if res.status != 0 or res.eqlin is None:
        log.warning("packing plan: LP not solved (%s)", res.message)
        return None
    reduced = np.maximum(cost - a.T @ np.asarray(res.eqlin.marginals, dtype=np.float64), 0.0)
    item_cost = reduced[: len(item_u)]
    finish = completion_cost(b, item_u, item_v, item_cost, loss_u, reduced[len(item_u) :])
    table = np.full((b + 1, b + 1), np.inf)
    # A placement's price: its arc's reduced cost plus what finishing the GPU from the level it lands on costs more
    # than finishing it from where it was (:func:`completion_cost`).
    table[item_u, sizes[item_s]] = np.maximum(item_cost + finish[item_v] - finish[item_u], 0.0)
    # Unplanned sizes take the prices of the next larger planned size (fits wherever that one fits, and more).
    planned = np.zeros(b + 1, dtype=np.bool_)
    planned[sizes] = True
    nxt = b + 1
    for s in range(b, 0, -1):
        if planned[s]:
            nxt = s
        elif nxt <= b:
            table[: b - s + 1, s] = np.where(np.isfinite(table[: b - s + 1, nxt]), table[: b - s + 1, nxt], 0.0)
    demand = float((sizes * weights).sum()) / b
    return PackingPlan(sizes, weights, table, float(res.fun) / demand if demand > 0 else 1.0)


def completion_cost(b: int, item_u: IntA, item_v: IntA, item_cost: FloatA, loss_u: IntA, loss_cost: FloatA) -> FloatA:
    """(b + 1,) per fill level: the cheapest sum of reduced costs of arcs that take a GPU from that level to full
    (more shares, then the loss arc), 0 at ``b`` and for an empty GPU (it may stay empty).

    The LP's duals are degenerate: many arcs outside every optimal packing still get a reduced cost of 0. A 0.23
    share on a GPU holding 0.59 is one (openb trace): the arc itself is free, but it leaves 0.18, which only rare
    shares fill, so every way of finishing that GPU costs 0.08 GPU. An arc's reduced cost alone missed that, and
    the plan let such placements tie with optimal ones."""
    finish = np.full(b + 1, np.inf)
    finish[b] = 0.0
    finish[loss_u] = loss_cost  # stop here: leave the rest of the GPU empty
    for level in range(b - 1, 0, -1):  # an arc only goes up: every level above is final when this one is reached
        at = item_u == level
        if at.any():
            finish[level] = min(finish[level], float((item_cost[at] + finish[item_v[at]]).min()))
    finish[0] = 0.0
    return np.asarray(np.where(np.isfinite(finish), finish, 0.0), dtype=np.float64)


class PlanCache:
    """The plan of the latest share distribution, re-solved only when the distribution drifts."""

    __slots__ = ("_last", "_plan", "_tried", "drift", "solves")

    def __init__(self, drift: float = DEFAULT_REPLAN_DRIFT) -> None:
        self.drift = drift
        self._plan: PackingPlan | None = None
        self._tried: tuple[bytes, bytes] | None = None
        self._last: tuple[IntA, FloatA, PackingPlan | None] | None = None
        self.solves = 0

    def plan(self, milli: IntA, prob: FloatA, *, drift: float | None = None) -> PackingPlan | None:
        """The plan for shares ``milli`` with weights ``prob``. The same two array objects as the last call (a
        workload is immutable, and asked for on every placement) get the same answer without any work.

        ``drift`` overrides the cache's threshold for this call: a background caller passes a smaller one, so the
        plan is usually re-solved there before a request would have to."""
        last = self._last
        if drift is None and last is not None and last[0] is milli and last[1] is prob:
            return last[2]
        out = self._plan_for(milli, prob, self.drift if drift is None else drift)
        self._last = (milli, prob, out)
        return out

    def _plan_for(self, milli: IntA, prob: FloatA, drift: float) -> PackingPlan | None:
        sizes, weights = share_distribution(milli, prob)
        if len(sizes) == 0:
            return None
        current = self._plan
        if current is not None and current.distance(sizes, weights) <= drift:
            return current
        key = (sizes.tobytes(), np.round(weights, 6).tobytes())
        if current is None and self._tried == key:
            return None  # this distribution already failed to solve
        self._tried = key
        self.solves += 1
        new = solve(sizes, weights)
        if new is not None:
            self._plan = new
        return new if new is not None else current
