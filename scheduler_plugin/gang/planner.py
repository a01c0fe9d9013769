"""Plan a whole gang at once: a node and GPUs for every member, in the tightest topology domain, or nothing.

The planner uses the extender's own :class:`~scheduler_plugin.policies.framework.Framework`: its filters say which
nodes can take a member (with the assumed-ledger overlay, so capacity bound or planned moments ago is taken), its
weighted scores order the nodes inside a domain and its GPU picker chooses each member's GPUs, on a working copy of
the capacity that every planned member is charged to (``FleetArrays.with_assumed``). On top of it:

* **all or nothing**: a plan has a placement for every member, or the gang gets a :class:`PlanFailure` with a reason
  ("needs 4 nodes with 8 free GPUs in one rack; the best rack has 3") and holds nothing;
* **topology**: the gang asks ``required=<level>`` (one domain of that level or nothing) or ``preferred=<level>``
  (the innermost level from there outwards at which one domain holds it; default ``preferred=node``). Inside the
  chosen domain, members fill its sub-domains one after the other, the fewest sub-domains first (the largest, then
  the smallest that holds the rest), and ranks are laid out in that order: consecutive ranks share the innermost
  domain, as ring all-reduce wants;
* **best fit of domains**: among the domains that hold the gang, the one it fills most tightly (least free GPU
  capacity left over), so a small job does not break the only empty rack;
* **thermal evenness**: a gang's thermal quality is its *worst* member node's (the thermal policy's per-GPU quality,
  0..1: headroom below slowdown now and predicted under load). Domains whose gang quality reaches
  ``goodThermalQuality`` are preferred; among the rest, the best worst member. A node that is hot or predicted hot
  (the shared ``hotness`` rule, whether or not the extender's hot filter is on) or predicted to run out of headroom
  under load (thermal quality below ``minThermalQuality``: a poorly cooled node) never takes a member.

Pure: no I/O, no clock; the caller passes the fleet, the domains and the cycle context.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from ..hotness import HotnessConfig, trigger_mask
from ..model import MILLI_PER_GPU, FleetArrays, GpuAssignment, GpuRequest
from ..model.claim import claim_of
from ..model.snapshot import IndexKey
from ..policies.base import CycleContext
from ..policies.framework import Framework
from ..policies.thermal import QUALITY_COLUMNS, ThermalArgs, ThermalScore, gpu_quality
from .levels import GangPolicy
from .readers import TopologyAsk
from .topology import Domains, spread

IntA = npt.NDArray[np.int64]
FloatA = npt.NDArray[np.float64]
BoolA = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Member:
    key: str
    """``namespace/name`` of the pod."""
    request: GpuRequest
    index: int | None = None
    """Rank; members without one come after the ranked ones, by key."""


@dataclass(frozen=True, slots=True)
class Gang:
    key: str
    members: tuple[Member, ...]
    topology: TopologyAsk | None = None

    def ordered(self) -> list[Member]:
        """Members in rank order."""
        return sorted(self.members, key=lambda m: (m.index is None, m.index or 0, m.key))


@dataclass(frozen=True, slots=True)
class Placement:
    member: str
    node: str
    row: int
    gpus: tuple[int, ...]
    request: GpuRequest


@dataclass(frozen=True, slots=True)
class GangPlan:
    gang: str
    level: str
    """The level of the one domain the whole gang is in (``cluster`` when it spans several of every level)."""
    domain: str
    placements: tuple[Placement, ...]
    """In rank order."""
    worst_thermal: float
    """The worst member node's thermal quality, 0..1."""
    spread: tuple[int, ...]
    """Per level (innermost first), how many domains the members touch."""
    why: tuple[str, ...] = ()

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(p.node for p in self.placements)

    def describe(self) -> list[str]:
        lines = [f"gang {self.gang}: {len(self.placements)} members in {self.level} {self.domain}", *self.why]
        lines += [f"  {p.member} -> {p.node} GPUs {','.join(map(str, p.gpus)) or '-'}" for p in self.placements]
        return lines


@dataclass(frozen=True, slots=True)
class PlanFailure:
    gang: str
    reason: str
    unresolvable: bool = False
    """True when the gang is larger than the fleet (or the asked level) can ever hold, whatever frees up."""


@dataclass(slots=True)
class _Shape:
    """Members that ask the same, and where they can go."""

    request: GpuRequest
    count: int
    eligible: BoolA  # (N,) passes every filter and is not hot
    slots: IntA  # (N,) how many such members the node holds now (an estimate the real placement checks)
    ever: IntA  # (N,) how many it could hold empty
    score: FloatA  # (N,) the framework's weighted score (NaN where not eligible)


@dataclass(slots=True)
class _Attempt:
    placements: list[Placement]
    worst: float
    leftover: float
    domain: int
    level: int
    why: list[str] = field(default_factory=list)


class GangPlanner:
    """Plans gangs with one framework and the policy's ``gang:`` section. Holds per-snapshot caches only."""

    def __init__(
        self,
        framework: Framework,
        policy: GangPolicy | None = None,
        hotness: HotnessConfig | None = None,
        thermal: ThermalArgs | None = None,
    ) -> None:
        self.fw = framework
        self.policy = policy or GangPolicy()
        hot = framework.hot_filter
        self.hotness = hotness or (hot.cfg if hot is not None else HotnessConfig())
        if thermal is None:
            plugin = next((ws.plugin for ws in framework.scorers if isinstance(ws.plugin, ThermalScore)), None)
            thermal = plugin.args if plugin is not None else ThermalArgs()
        self.thermal = thermal
        self._quality = IndexKey[FloatA]("gang.node_quality", QUALITY_COLUMNS)
        self._hot = IndexKey[BoolA]("gang.hot_nodes", ("temp", "trend", "throttle", "slowdown", "gpu_present"))

    # --- per-snapshot data -------------------------------------------------------------------------------------

    def _node_quality(self, fleet: FleetArrays) -> FloatA:
        q = gpu_quality(fleet, np.arange(fleet.n_nodes, dtype=np.int64), self.thermal)
        present = fleet.gpu_present
        with np.errstate(invalid="ignore"):
            worst = np.where(present, np.nan_to_num(q, nan=0.0), np.inf).min(axis=1)
        return np.asarray(np.where(present.any(axis=1), worst, 0.0), dtype=np.float64)

    def _hot_nodes(self, fleet: FleetArrays) -> BoolA:
        return np.asarray(trigger_mask(fleet, self.hotness).any(axis=1), dtype=np.bool_)

    def node_quality(self, fleet: FleetArrays) -> FloatA:
        """(N,) each node's worst GPU's thermal quality, 0..1."""
        return fleet.derive(self._quality, self._node_quality)

    # --- planning ------------------------------------------------------------------------------------------------

    def _shapes(self, gang: Gang, fleet: FleetArrays, view: FleetArrays, ctx: CycleContext) -> list[_Shape]:
        rows = np.arange(fleet.n_nodes, dtype=np.int64)
        hot = view.derive(self._hot, self._hot_nodes)
        hot = hot | (self.node_quality(view) < self.policy.min_thermal_quality)  # predicted hot under load
        out = []
        for req, count in _shape_counts(gang.members).items():
            passed = self.fw.filter(req, fleet, rows, ctx).passed
            eligible = np.zeros(fleet.n_nodes, dtype=np.bool_)
            eligible[passed] = True
            eligible &= ~hot
            score = np.full(fleet.n_nodes, np.nan)
            ok = np.flatnonzero(eligible)
            if ok.size:
                _, combined = self.fw.prioritize(req, fleet, ok, ctx)
                score[ok] = combined
            per = max(req.count, 1)
            if req.shared:
                slots = eligible.astype(np.int64)
            else:
                whole = ((view.free_milli >= MILLI_PER_GPU) & view.gpu_present).sum(axis=1)
                slots = np.where(eligible, whole // per, 0).astype(np.int64)
            ever = (
                (fleet.gpu_count.astype(np.int64) // per) if not req.shared else (fleet.gpu_count > 0).astype(np.int64)
            )
            out.append(_Shape(req, count, eligible, slots, np.asarray(ever, dtype=np.int64), score))
        return out

    def plan(self, gang: Gang, fleet: FleetArrays, domains: Domains, ctx: CycleContext) -> GangPlan | PlanFailure:
        """Plan every member of ``gang`` or none."""
        if not gang.members:
            return PlanFailure(gang.key, "the gang has no members yet")
        if len(domains.ids[0]) != fleet.n_nodes:
            raise ValueError("domains do not match the fleet's rows")
        ask = gang.topology or TopologyAsk("node", required=False)
        if ask.level not in domains.levels:
            return PlanFailure(
                gang.key, f"topology level {ask.level!r} is not one of {', '.join(domains.levels)}", True
            )
        start = domains.level_index(ask.level)
        if ask.required and not domains.labelled[start]:
            return PlanFailure(gang.key, f"required={ask.level}: no node carries the level's label", True)
        view = self.fw.view(fleet, ctx)
        shapes = self._shapes(gang, fleet, view, ctx)
        quality = self.node_quality(view)
        levels = [start] if ask.required else list(range(start, len(domains.levels)))
        for lv in levels:
            best = self._plan_level(gang, shapes, view, domains, lv, quality, ctx)
            if best is not None:
                rows = [p.row for p in best.placements]
                level_name = domains.levels[best.level]
                why = [
                    f"{ask.describe()}: in one {level_name} ({domains.names[best.level][best.domain]})",
                    f"worst member's thermal quality {best.worst:.2f} (good from {self.policy.good_thermal_quality:g})",
                    f"free GPU capacity left in the {level_name}: {best.leftover:g}",
                    *best.why,
                ]
                return GangPlan(
                    gang=gang.key,
                    level=level_name,
                    domain=domains.names[best.level][best.domain],
                    placements=tuple(best.placements),
                    worst_thermal=best.worst,
                    spread=spread(domains, rows),
                    why=tuple(why),
                )
        return self._failure(gang, shapes, domains, levels[0] if ask.required else start)

    def _plan_level(
        self,
        gang: Gang,
        shapes: list[_Shape],
        view: FleetArrays,
        domains: Domains,
        lv: int,
        quality: FloatA,
        ctx: CycleContext,
    ) -> _Attempt | None:
        col = domains.ids[lv]
        n_dom = domains.count(lv)
        fits = np.ones(n_dom, dtype=np.bool_)
        for s in shapes:
            cap = np.bincount(col, weights=s.slots, minlength=n_dom)
            fits &= cap >= s.count
        cand = np.flatnonzero(fits)
        if cand.size == 0:
            return None
        free = np.where(view.gpu_present, view.free_milli, 0).sum(axis=1) / MILLI_PER_GPU
        usable = np.zeros(view.n_nodes, dtype=np.bool_)
        for s in shapes:
            usable |= s.eligible
        dom_free = np.bincount(col, weights=np.where(usable, free, 0.0), minlength=n_dom)
        need = sum(s.request.count * s.count for s in shapes)
        leftover = dom_free[cand] - need
        order = cand[np.argsort(leftover, kind="stable")]
        good = self.policy.good_thermal_quality
        attempts: list[_Attempt] = []
        for d in order[: self.policy.max_domains_tried]:
            rows = np.flatnonzero((col == d) & usable)
            placed = self._place(gang, shapes, view, domains, lv, rows, quality, ctx)
            if placed is None:
                continue
            worst = min(float(quality[p.row]) for p in placed)
            attempts.append(_Attempt(placed, worst, float(dom_free[d] - need), int(d), lv))
            if worst >= good:
                break  # best-fit order: the first good one is the best fit among the good ones
        if not attempts:
            return None
        good_ones = [a for a in attempts if a.worst >= good]
        if good_ones:
            return min(good_ones, key=lambda a: a.leftover)
        return max(attempts, key=lambda a: (a.worst, -a.leftover))

    def _node_order(self, shapes: list[_Shape], domains: Domains, lv: int, rows: IntA, quality: FloatA) -> list[int]:
        """The rows of one domain in the order members fill them: sub-domain by sub-domain (the fewest: the
        largest first, then the smallest that holds what is left), inside each by sub-sub-domain and so on, nodes
        of good thermal quality first, then by the framework's score."""
        main = max(shapes, key=lambda s: s.count * max(s.request.count, 1))
        need = sum(s.count for s in shapes)
        good = self.policy.good_thermal_quality
        score = np.nan_to_num(main.score[rows], nan=-np.inf)

        def node_key(i: int) -> tuple[bool, float]:
            return (bool(quality[rows[i]] < good), -float(score[i]))

        def order(sub: list[int], level: int, remaining: int) -> list[int]:
            if level <= 0 or len(sub) <= 1:
                return sorted(sub, key=node_key)
            col = domains.ids[level - 1][rows[sub]]
            groups: dict[int, list[int]] = {}
            for i, d in zip(sub, col.tolist(), strict=True):
                groups.setdefault(int(d), []).append(i)
            cap = {d: int(sum(int(main.slots[rows[i]]) for i in g)) for d, g in groups.items()}
            # a sub-domain with a node of poor thermal quality comes after every good one, whatever its size
            poor = {d: any(bool(quality[rows[i]] < good) for i in g) for d, g in groups.items()}
            picked: list[int] = []
            left = dict(groups)
            rem = remaining
            while left:
                holding = [d for d in left if cap[d] >= rem > 0]
                if holding:
                    d = min(holding, key=lambda k: (poor[k], cap[k]))
                else:
                    d = min(left, key=lambda k: (poor[k], -cap[k]))
                picked.append(d)
                rem -= cap[d]
                del left[d]
            out: list[int] = []
            rem = remaining
            for d in picked:
                out += order(groups[d], level - 1, max(min(rem, cap[d]), 0))
                rem -= cap[d]
            return out

        return [int(rows[i]) for i in order(list(range(rows.size)), lv, need)]

    def _place(
        self,
        gang: Gang,
        shapes: list[_Shape],
        view: FleetArrays,
        domains: Domains,
        lv: int,
        rows: IntA,
        quality: FloatA,
        ctx: CycleContext,
    ) -> list[Placement] | None:
        """Every member on ``rows`` (one domain), in rank order, or None. Works on its own copy of the capacity."""
        work = view
        by_shape = {shape_of(s.request): s for s in shapes}
        node_rows = self._node_order(shapes, domains, lv, rows, quality)
        pos = 0
        out: list[Placement] = []
        for m in gang.ordered():
            el = by_shape[shape_of(m.request)].eligible
            placed = False
            i = pos
            while i < len(node_rows):
                r = node_rows[i]
                if el[r]:
                    gpus = self._pick(m.request, work, r, ctx)
                    if gpus is not None:
                        name = work.names[r]
                        work = work.with_assumed({name: [claim_of(m.request, gpus)]})
                        out.append(Placement(m.key, name, r, gpus, m.request))
                        placed = True
                        pos = i  # the next rank tries the same node first
                        break
                i += 1
            if not placed:
                return None
        return out

    def _pick(self, req: GpuRequest, work: FleetArrays, row: int, ctx: CycleContext) -> tuple[int, ...] | None:
        """The framework's filters and picker on the working copy (already overlaid: no second ledger pass)."""
        if not req.wants_gpu:
            return ()
        idx = np.array([row], dtype=np.int64)
        if not all(bool(f.filter(req, work, idx, ctx)[0]) for f in self.fw.filters):
            return None
        return self.fw.picker.pick(req, work, row, ctx)

    # --- reasons -------------------------------------------------------------------------------------------------

    def _failure(self, gang: Gang, shapes: list[_Shape], domains: Domains, lv: int) -> PlanFailure:
        main = max(shapes, key=lambda s: s.count * max(s.request.count, 1))
        level = domains.levels[lv]
        col = domains.ids[lv]
        n_dom = domains.count(lv)
        now = np.bincount(col, weights=main.slots, minlength=n_dom)
        ever = np.bincount(col, weights=main.ever, minlength=n_dom)
        one_per_node = int(main.slots.max(initial=0)) <= 1 and int(main.ever.max(initial=0)) <= 1
        gpus = main.request.count
        what = f"{gpus} free GPU{'s' if gpus != 1 else ''}" if main.request.whole else main.request.describe()
        where = "in the cluster" if level == "cluster" else f"in one {level}"
        best_dom = int(np.argmax(now)) if n_dom else 0
        best = int(now[best_dom]) if n_dom else 0
        if one_per_node:
            need = f"needs {main.count} node{'s' if main.count != 1 else ''} with {what} {where}"
            has = f"has {best}"
        else:
            need = f"needs room for {main.count} members of {what} {where}"
            has = f"has room for {best}"
        if level == "cluster":
            tail = f"the cluster {has} (hot nodes and nodes that fail the filters excluded)"
        else:
            tail = f"the best {level} ({domains.names[lv][best_dom]}) {has}"
        unresolvable = bool(float(ever.max(initial=0)) < main.count)
        reason = f"{need}; {tail}"
        if unresolvable:
            reason += f"; no {level} can ever hold it (at most {int(ever.max(initial=0))} even when empty)"
        return PlanFailure(gang.key, reason, unresolvable)


def assignments(plan: GangPlan) -> dict[str, list[GpuAssignment]]:
    """The plan as ledger entries, node -> assignments (what the extender assumes until the members bind)."""
    out: dict[str, list[GpuAssignment]] = {}
    for p in plan.placements:
        a = claim_of(p.request, p.gpus)
        out.setdefault(p.node, []).append(
            GpuAssignment(p.member, a.gpu_indices, a.milli, a.memory_bytes, a.pod_uid, a.priority)
        )
    return out


def assume(fw: Framework, plan: GangPlan, now: float) -> None:
    """Charge every planned member to the framework's ledger, so no other pod takes the planned capacity."""
    for p in plan.placements:
        fw.assume(p.node, _keyed(p.request, p.member), p.gpus, now)


def _keyed(req: GpuRequest, key: str) -> GpuRequest:
    return req if req.pod_key == key else replace(req, pod_key=key)


def shape_of(req: GpuRequest) -> GpuRequest:
    """The request without the pod's identity and creation time: members asking the same share one shape, even when
    they were created in different seconds (a Job creates its pods one by one)."""
    return replace(req, pod_key="", pod_uid="", pending_since=None)


def _shape_counts(members: Sequence[Member]) -> dict[GpuRequest, int]:
    """Each shape of ``members`` and how many ask it; the shape waits since its earliest member (what the
    framework's filters and scores read of the wait), while :func:`shape_of` keys it."""
    counts = Counter(shape_of(m.request) for m in members)
    since: dict[GpuRequest, float] = {}
    for m in members:
        t = m.request.pending_since
        if t is not None:
            key = shape_of(m.request)
            since[key] = min(t, since.get(key, t))
    return {replace(k, pending_since=since.get(k)): n for k, n in counts.items()}
