"""The ``fragmentation`` (kelvin) and ``fgd`` (paper) score and picker plugins."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Self, cast

import numpy as np
from pydantic import Field

from ...model import GIB, MILLI_PER_GPU, FleetArrays, GpuRequest
from ..base import MAX_EXTENDER_PRIORITY, BoolA, CycleContext, FloatA, IntA, StateKey
from ..eligibility import few_rows, limits_of
from ..normalize import minmax
from ..packing import DEFAULT_REPLAN_DRIFT, PackingPlan, PlanCache, load_solver
from ..policy_file import CamelModel
from .gradient import (
    Placements,
    _accessible,
    best_per_row,
    cpu_surplus_factor,
    eligible_gpus,
    fgd_value,
    node_fragmentation,
    placements,
    quantised,
    stranding_change,
    stranding_penalty,
)
from .publication import DEFAULT_REPUBLISH_DRIFT, PublishedWorkload
from .row_stamps import cycle_row_stamps
from .scarcity import DEFAULT_SCARCITY_CAP, by_shape, fleet_scarcity, fleet_usable, weights_for
from .score_memo import Computed, Revalue, ScoreMemo, SoftParts, shape_key
from .workload import (
    DEFAULT_CONFIDENCE_Z,
    DEFAULT_COVERAGE,
    DEFAULT_DRIFT_SIGNIFICANCE,
    DEFAULT_DRIFT_WINDOW_PODS,
    DEFAULT_LEVELS,
    DEFAULT_PRIOR_WEIGHT,
    DEFAULT_STRANDING_WEIGHT,
    PodShape,
    Workload,
    WorkloadEstimator,
    upper_bound_factors,
)

WORKLOAD_KEY: StateKey[Workload] = StateKey("fragmentation.workload")
"""Cycle state: the cycle's target :class:`Workload` (a caller's, e.g. the simulator's from the trace, overrides the
learned one; else the first fragmentation plugin of the cycle writes the learned one)."""

SCORED_KEY: StateKey[tuple[GpuRequest, FleetArrays, Workload, bool, IntA, Placements]] = StateKey(
    "fragmentation.scored"
)
"""Cycle state: the placements the last fragmentation score computed (request, fleet, workload, memory-aware,
candidate rows, placements). A picker in the same cycle (the scorer itself, or kelvin's picker) takes the chosen row's
from them instead of computing them again: placements depend on nothing else, and a cycle does not change the fleet
between score and pick (its eligibility cache assumes it too)."""


SURPLUS_KEY: StateKey[tuple[FleetArrays, tuple[float, float, float], float]] = StateKey("fragmentation.cpu_surplus")
"""Cycle state: (fleet, (the workload's CPU per thousandth of GPU of its GPU shapes and of its CPU-only shapes,
``strandingFullSurplus``), :func:`cpu_surplus_factor`) of the cycle's first use (live scarcity or the stranding
term), which the rest of the cycle reuses: the factor reads only these, so the workload priced by live scarcity,
which keeps them, shares it with the unpriced one."""


SCARCITY_KEY: StateKey[tuple[FleetArrays, Workload, Workload]] = StateKey("fragmentation.scarcity")
"""Cycle state: (fleet, workload, the workload priced by live scarcity) of the cycle's first kelvin score."""


class FragmentationArgs(CamelModel):
    """Arguments of the ``fragmentation`` (kelvin) and ``fgd`` (paper) policies."""

    levels: int = Field(DEFAULT_LEVELS, ge=2, le=100_000, description="steps of the quantised score (FGD: 100)")
    memory_aware: bool = Field(True, description="typical pods must also fit the node's free host memory")
    half_life_pods: float | None = Field(
        None,
        gt=0,
        description="a fixed decay of the learned workload, in pods (unset: forget only when the mix drifts)",
    )
    drift_window_pods: int = Field(
        DEFAULT_DRIFT_WINDOW_PODS,
        ge=50,
        le=1_000_000,
        description="pods per test of the learned mix against the older one (without halfLifePods)",
    )
    drift_significance: float = Field(
        DEFAULT_DRIFT_SIGNIFICANCE,
        gt=0,
        lt=1,
        description="p-value under which a window's mix counts as drifted and older pods are forgotten",
    )
    prior_weight: float = Field(DEFAULT_PRIOR_WEIGHT, ge=0, description="pseudo-pods of the default workload")
    coverage: float = Field(DEFAULT_COVERAGE, gt=0, le=1, description="share of pods the workload's shapes cover")
    confidence_z: float = Field(
        DEFAULT_CONFIDENCE_Z,
        ge=0,
        le=10,
        description="price each learned shape at its probability's upper bound, this many standard deviations up "
        "(kelvin only, not fgd; 0: at the estimate)",
    )
    reference_gpu_memory_gib: float = Field(80, gt=0, description="GPU size for converting memory pools to shares")
    packing_plan: bool = Field(
        True, description="shared pods: prefer placements of the workload's optimal packing (kelvin only, not fgd)"
    )
    stranding_weight: float = Field(
        DEFAULT_STRANDING_WEIGHT,
        ge=0,
        le=1000,
        description="weight of the GPU a node strands for lack of CPU, added to dF (kelvin only; 0 = FGD's measure)",
    )
    stranding_full_surplus: float = Field(
        0.5,
        ge=0,
        le=10,
        description="pods get the full stranding weight once free CPU exceeds what free GPUs need by this share",
    )
    scarcity: bool = Field(
        True,
        description="weigh each shape in F by how few free GPUs can still host it now (kelvin only, not fgd)",
    )
    scarcity_cap: float = Field(
        DEFAULT_SCARCITY_CAP, ge=1, le=1e6, description="the largest live-scarcity weight of a shape"
    )
    replan_drift: float = Field(
        DEFAULT_REPLAN_DRIFT, gt=0, le=2, description="re-solve the packing plan when the share mix moved this far (L1)"
    )
    republish_drift: float = Field(
        DEFAULT_REPUBLISH_DRIFT,
        ge=0,
        le=2,
        description="score against a new learned workload once its shape mix moved this far (L1; 0: every pod)",
    )

    def workload_settings(self) -> tuple[float | None, int, float, float, float, float, float]:
        """The arguments that decide what the workload estimator learns and when it is published."""
        return (
            self.half_life_pods,
            self.drift_window_pods,
            self.drift_significance,
            self.prior_weight,
            self.coverage,
            self.reference_gpu_memory_gib,
            self.republish_drift,
        )


@dataclass(slots=True)
class FragmentationBase:
    """The common base of the ``fragmentation`` and ``fgd`` plugins: the workload they learn and the per-placement
    values they rank by (:meth:`_values` for nodes, :meth:`_pick_values` for the GPUs inside the chosen node)."""

    args: FragmentationArgs
    estimator: WorkloadEstimator
    published: PublishedWorkload
    """The learned workload the plugin scores against, published in steps (:mod:`.publication`)."""
    name: str = "fragmentation"
    plans: PlanCache = field(default_factory=PlanCache)
    learns: bool = True
    """Whether :meth:`observe` feeds the estimator (False once it is a peer's, which learns for both: :meth:`bind`)."""
    memo: ScoreMemo = field(default_factory=ScoreMemo)
    """Per-node scores per request shape (:meth:`score`); values kept placements again by :meth:`_revaluer`."""
    _priced: tuple[Workload, FloatA, Workload] | None = None
    """The last (workload, scarcity weights, priced workload) of :meth:`FragmentationPolicy.scored_workload`."""
    _published: dict[PodShape, float] | None = None
    """Scarcity weights per shape on the last published snapshot (:meth:`FragmentationPolicy.prepare`)."""
    _hedged: tuple[Workload, FloatA | None] | None = None
    """The last (workload, :meth:`FragmentationPolicy.hedge`)."""
    _twin: FragmentationBase | None = None
    """As the picker, the scorer of the same class and arguments it is bound to (:meth:`bind`): its score memo's picks
    are this picker's."""

    @classmethod
    def create(cls, args: FragmentationArgs) -> Self:
        est = WorkloadEstimator(
            half_life_pods=args.half_life_pods,
            drift_window_pods=args.drift_window_pods,
            drift_significance=args.drift_significance,
            prior_weight=args.prior_weight,
            coverage=args.coverage,
            reference_gpu_memory=int(args.reference_gpu_memory_gib * GIB),
        )
        return cls(args, est, PublishedWorkload(est, args.republish_drift), plans=PlanCache(args.replan_drift))

    def __post_init__(self) -> None:
        self.memo.revalue = self._revaluer()

    @property
    def memory_aware(self) -> bool:
        return self.args.memory_aware

    # --- hooks the framework calls ---------------------------------------------------------------------------------

    def bind(self, peers: Sequence[object]) -> None:
        """As the picker, judge by the workload the first fragmentation scorer learns (``peers``: the score
        plugins): one estimator, one histogram, fed once per pod, and one published workload. Shared only when both
        learn alike (same estimator settings), the packing plans too when they re-plan alike; otherwise each learns
        apart."""
        source = next((p for p in peers if isinstance(p, FragmentationBase)), None)
        if source is None or source is self or source.args.workload_settings() != self.args.workload_settings():
            return
        if type(source) is type(self) and source.args == self.args:
            self._twin = source
        self.estimator = source.estimator
        self.published = source.published
        self.learns = False
        if source.args.replan_drift == self.args.replan_drift:
            self.plans = source.plans

    def observe(self, req: GpuRequest) -> None:
        """Count one arriving pod in the learned workload (unless a peer's estimator, fed by that peer)."""
        if self.learns:
            self.estimator.observe(req)

    # --- scoring ----------------------------------------------------------------------------------------------------

    def workload(self, ctx: CycleContext) -> Workload:
        """The cycle's target workload: the caller's (``ctx.state[WORKLOAD_KEY]``), else the one learned so far as
        last published (:mod:`.publication`: the same object until the learned mix has moved). Only reads the
        estimator (it learns in :meth:`observe`)."""
        return ctx.state.compute(WORKLOAD_KEY, self.published.workload)

    def scored_workload(self, fleet: FleetArrays, ctx: CycleContext) -> Workload:
        """The workload F is computed against on ``fleet``: :meth:`workload` (kelvin prices it by live scarcity)."""
        return self.workload(ctx)

    def _values(self, req: GpuRequest, fleet: FleetArrays, pl: Placements, w: Workload, ctx: CycleContext) -> FloatA:
        """Per placement: the value nodes are ranked by (a node scores its best placement's)."""
        raise NotImplementedError

    def _pick_values(
        self, req: GpuRequest, fleet: FleetArrays, pl: Placements, w: Workload, ctx: CycleContext
    ) -> FloatA:
        """Per placement: the value the GPUs inside the chosen node are picked by: :meth:`_picked_by` of the
        :meth:`_values`."""
        return self._picked_by(self._values(req, fleet, pl, w, ctx), pl)

    def _picked_by(self, values: FloatA, pl: Placements) -> FloatA:
        """The pick values of placements ``pl`` valued ``values`` (default: the values; a subclass adds its in-node
        tie-breaks), element by element."""
        return values

    def _valued(
        self, req: GpuRequest, fleet: FleetArrays, pl: Placements, w: Workload, ctx: CycleContext
    ) -> tuple[FloatA, BoolA]:
        """:meth:`_values`, and per placement whether its value read the :meth:`_memo_soft` values (default: none)."""
        return self._values(req, fleet, pl, w, ctx), np.zeros(len(pl.pos), dtype=np.bool_)

    def _valued_parts(
        self, req: GpuRequest, fleet: FleetArrays, pl: Placements, w: Workload, ctx: CycleContext
    ) -> tuple[FloatA, BoolA, tuple[FloatA, ...] | None]:
        """:meth:`_valued`, and what :meth:`_revaluer` values the placements from again when the :meth:`_memo_soft`
        values move (per placement; ``None``: the score memo recomputes those rows instead)."""
        return (*self._valued(req, fleet, pl, w, ctx), None)

    def _revaluer(self) -> Revalue | None:
        """How the score memo values kept placements again from :meth:`_valued_parts` and new :meth:`_memo_soft`
        values (``None``: it recomputes them)."""
        return None

    def _memo_extra(self, req: GpuRequest, fleet: FleetArrays, w: Workload, ctx: CycleContext) -> tuple[Hashable, ...]:
        """What :meth:`_values` reads besides the placements' own node, the request shape and the workload: values
        shared by every node of the cycle. The score memo (:mod:`.score_memo`) keeps a node's score while these
        are the same (``is`` or, for floats, ``==``); a subclass whose values read more must return it here (or in
        :meth:`_memo_soft`)."""
        return ()

    def _memo_soft(self, req: GpuRequest, fleet: FleetArrays, w: Workload, ctx: CycleContext) -> tuple[Hashable, ...]:
        """Values shared by every node of the cycle that only some placements' values read (:meth:`_valued` says
        which): the score memo recomputes, when they change, only the nodes whose kept score read them."""
        return ()

    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        """Each row's best placement's value, from the score memo for the rows not written since this request shape
        was last scored against the same workload and cycle-wide values; computed for the others."""
        w = self.scored_workload(fleet, ctx)
        idx = np.asarray(idx, dtype=np.int64)

        def compute(sel: IntA) -> Computed:
            rows = idx if len(sel) == len(idx) else idx[sel]
            gpus = None
            if req.wants_gpu:  # the cycle's eligibility (shared with the filters)
                if rows is idx or few_rows(len(idx), fleet):  # of every candidate (what the cycle keeps), then ours
                    ok, demand = eligible_gpus(req, fleet, idx, ctx)
                    gpus = (ok, demand) if rows is idx else (ok[sel], demand[sel])
                else:  # the cycle keeps it for every node: gathered for our rows alone (the same values)
                    gpus = eligible_gpus(req, fleet, rows, ctx)
            pl = placements(req, fleet, rows, w, ctx, memory_aware=self.memory_aware, gpus=gpus)
            ctx.state.write(SCORED_KEY, (req, fleet, w, self.memory_aware, rows, pl))
            values, reads, parts = self._valued_parts(req, fleet, pl, w, ctx)
            best, _ = best_per_row(values, pl.pos, len(rows))
            row_reads = np.zeros(len(rows), dtype=np.bool_)
            row_reads[pl.pos[reads]] = True
            picks = _picks(pl, best_per_row(self._picked_by(values, pl), pl.pos, len(rows))[1], fleet.max_gpus)
            if parts is None:
                return best, row_reads, None, picks
            mine = row_reads[pl.pos]  # every placement of a row whose score read the soft values
            return best, row_reads, SoftParts(pl.pos[mine], tuple(a[mine] for a in parts)), picks

        key = (shape_key(req), limits_of(ctx), self.memory_aware)
        extra, soft = self._memo_extra(req, fleet, w, ctx), self._memo_soft(req, fleet, w, ctx)
        return self.memo.scores(key, fleet, idx, w, extra, compute, lambda: cycle_row_stamps(fleet, ctx), soft)

    def _row_placements(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> Placements:
        """The placements of ``req`` on ``row``: from this cycle's :meth:`score` when it scored that row."""
        w = self.scored_workload(fleet, ctx)
        hit = ctx.state.find(SCORED_KEY)
        if hit is not None and hit[0] is req and hit[1] is fleet and hit[2] is w and hit[3] == self.memory_aware:
            at = (hit[4] == row).nonzero()[0]
            if len(at):
                return hit[5].of_row(int(at[0]))
        rows = np.array([row], dtype=np.int64)
        return placements(req, fleet, rows, w, ctx, memory_aware=self.memory_aware)

    def normalize(self, raw: FloatA) -> FloatA:
        return minmax(raw)

    def pick(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> tuple[int, ...] | None:
        """The GPUs of ``row``'s best placement by :meth:`_pick_values`: the one the score memo kept with the row's
        score when it would serve that score now (a bind right after prioritize), else computed for the row."""
        if req.wants_gpu:  # (a CPU-only pod's pick takes no slot: "none taken" would not tell it from no placement)
            kept = (self._twin or self)._kept_pick(req, fleet, row, ctx)
            if kept is not None:
                slots = kept.nonzero()[0]
                return tuple(int(fleet.gpu_index[row, c]) for c in slots.tolist()) if len(slots) else None
        w = self.scored_workload(fleet, ctx)
        pl = self._row_placements(req, fleet, row, ctx)
        _, which = best_per_row(self._pick_values(req, fleet, pl, w, ctx), pl.pos, 1)
        if which[0] < 0:
            return None
        return tuple(int(fleet.gpu_index[row, c]) for c in pl.slots(int(which[0])))

    def _kept_pick(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> BoolA | None:
        """The GPU slots of ``row``'s pick as this plugin's score memo kept it (:meth:`ScoreMemo.picked`), or None."""
        w = self.scored_workload(fleet, ctx)
        key = (shape_key(req), limits_of(ctx), self.memory_aware)
        extra, soft = self._memo_extra(req, fleet, w, ctx), self._memo_soft(req, fleet, w, ctx)
        return self.memo.picked(key, fleet, row, w, extra, lambda: cycle_row_stamps(fleet, ctx), soft)

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> list[str]:
        w = self.scored_workload(fleet, ctx)
        rows = np.array([row], dtype=np.int64)
        acc = _accessible(w, fleet, rows)
        mem = fleet.mem_free_host[rows] if self.memory_aware else None
        before = float(node_fragmentation(fleet.free_milli[rows], fleet.cpu_free[rows], acc, w, mem)[0])
        pl = placements(req, fleet, rows, w, ctx, memory_aware=self.memory_aware)
        lines = [f"fragmentation now {before / MILLI_PER_GPU:.2f} GPU (against {len(w)} typical pod shapes)"]
        if len(pl.pos) == 0:
            return [*lines, "the pod does not fit on any GPU of this node"]
        _, which = best_per_row(self._pick_values(req, fleet, pl, w, ctx), pl.pos, 1)
        i = int(which[0])
        gpus = ", ".join(str(int(fleet.gpu_index[row, c])) for c in pl.slots(i)) or "none"
        lines.append(f"best placement (GPU {gpus}) changes it by {pl.delta[i] / MILLI_PER_GPU:+.3f} GPU")
        return [*lines, *self._explain_extras(req, fleet, pl, w, i)]

    def _explain_extras(self, req: GpuRequest, fleet: FleetArrays, pl: Placements, w: Workload, i: int) -> list[str]:
        return []


def _picks(pl: Placements, which: IntA, gpus: int) -> BoolA:
    """(rows, ``gpus``) the GPU slots of each row's placement ``which`` (none where -1: no placement)."""
    out = np.zeros((len(which), gpus), dtype=np.bool_)
    has = (which >= 0).nonzero()[0]
    out[has] = pl.taken[which[has]]
    return out


def learn(plugins: Iterable[object], req: GpuRequest) -> None:
    """Count one arriving pod in the workload estimators of ``plugins`` (each distinct estimator once; plugins
    without one are skipped). For callers that hold plugins without a framework (the simulator)."""
    seen: set[int] = set()
    for p in plugins:
        if isinstance(p, FragmentationBase) and id(p.estimator) not in seen:
            seen.add(id(p.estimator))
            p.estimator.observe(req)


class FragmentationPolicy(FragmentationBase):
    """kelvin's fragmentation score: FGD's quantised gradient over a memory-aware F; in-node ties to the tightest fit.

    Nodes are ranked by the quantised score alone (``levels`` steps of sigmoid(-dF/1000)): placements whose dF
    differ by less than a step are equally good, and the caller's tie-break decides. Measured on the Alibaba trace,
    ranking by the raw dF instead chases noise and strands more GPUs. Inside the chosen node the GPU is picked by the
    quantised score, then the smallest raw dF, then the least share left on the GPU.

    Shared pods (``packingPlan``, on by default) are first ranked by the placement's reduced cost in the optimal
    packing of the workload's shares (:mod:`.packing`), in hundredths of a GPU: FGD's score only decides among
    placements the plan finds equally good.
    """

    def __post_init__(self) -> None:
        FragmentationBase.__post_init__(self)
        if self.args.packing_plan:
            load_solver()

    def _values(self, req: GpuRequest, fleet: FleetArrays, pl: Placements, w: Workload, ctx: CycleContext) -> FloatA:
        return self._valued(req, fleet, pl, w, ctx)[0]

    def _valued(
        self, req: GpuRequest, fleet: FleetArrays, pl: Placements, w: Workload, ctx: CycleContext
    ) -> tuple[FloatA, BoolA]:
        """The values, and which read the stranding weight: those with a stranding penalty (``weight * 0`` adds
        nothing, whatever the weight, so the others' floats do not depend on it)."""
        values, reads, _ = self._valued_parts(req, fleet, pl, w, ctx)
        return values, reads

    def _valued_parts(
        self, req: GpuRequest, fleet: FleetArrays, pl: Placements, w: Workload, ctx: CycleContext
    ) -> tuple[FloatA, BoolA, tuple[FloatA, ...]]:
        """:meth:`_valued`, and per placement (dF, GPU stranded[, plan price]): :meth:`_value_of` them with the
        stranding weight is the value."""
        stranding = stranding_penalty(req, pl, w)
        penalty = self.plan_penalty(req, pl, w)
        parts = (pl.delta, stranding) if penalty is None else (pl.delta, stranding, penalty)
        return self._value_of(parts, self._memo_soft(req, fleet, w, ctx)), stranding != 0, parts

    def _value_of(self, parts: tuple[FloatA, ...], soft: tuple[Hashable, ...]) -> FloatA:
        """Each placement's value from its (dF, GPU stranded[, plan price]) and ``soft`` (:meth:`_memo_soft`: the
        stranding weight), element by element: what the score memo values kept placements again with."""
        delta, stranding, *penalty = parts
        weight = cast(float, soft[0])
        primary = quantised(delta + weight * stranding, self.args.levels)
        if penalty:
            primary = primary - (self.args.levels + 1) * penalty[0]
        return primary

    def _revaluer(self) -> Revalue:
        return self._value_of

    def _stranding_weight(self, fleet: FleetArrays, w: Workload, ctx: CycleContext) -> float:
        """``strandingWeight`` times the cycle's :func:`cpu_surplus_factor`."""
        return self.args.stranding_weight * self._surplus(fleet, w, ctx)

    def _memo_extra(self, req: GpuRequest, fleet: FleetArrays, w: Workload, ctx: CycleContext) -> tuple[Hashable, ...]:
        return (self._plan(req, w),)

    def _memo_soft(self, req: GpuRequest, fleet: FleetArrays, w: Workload, ctx: CycleContext) -> tuple[Hashable, ...]:
        # the surplus factor moves with the fleet's free CPU (at nearly every arrival once CPU runs short), and only
        # the placements with a stranding penalty read it
        return (self._stranding_weight(fleet, w, ctx),)

    def _picked_by(self, values: FloatA, pl: Placements) -> FloatA:
        """The values, ties broken by the smaller raw dF, then the tightest GPU."""
        return np.asarray(
            values - 1e-3 * np.tanh(pl.delta / MILLI_PER_GPU) + 1e-4 * (1.0 - pl.slot_left / MILLI_PER_GPU),
            dtype=np.float64,
        )

    def scored_workload(self, fleet: FleetArrays, ctx: CycleContext) -> Workload:
        """:meth:`workload` priced by live scarcity (:mod:`.scarcity`), once per cycle; the same object as the last
        cycle's while the weights are the same (the fleet's F memo is kept per workload object).

        While the fleet has no CPU surplus (:meth:`_surplus` 0: its free CPU cannot feed its free GPUs), a shape's
        homes are counted without their free CPU: CPU is then what limits every shape, and weighing the CPU-hungry
        shapes up for their few homes keeps CPU for pods that feed fewer GPUs per core (full size, CPU-only demand
        x2.5, seeds 42-46: 11.10 % of GPUs unallocated, against 11.24 % counting the CPU and fgd's 11.26).

        A learned workload is priced by :meth:`hedge` too (with or without live scarcity): each shape at the upper
        confidence bound of its probability, so a rare shape learned from a few pods is not priced below what it
        may well be."""
        w = self.workload(ctx)
        by_scarcity = self.args.scarcity and bool(w.gpu_shapes.any())
        hedge = self.hedge(w)
        if not by_scarcity and hedge is None:
            return w
        hit = ctx.state.find(SCARCITY_KEY)
        if hit is not None and hit[0] is fleet and hit[1] is w:
            return hit[2]
        if by_scarcity:
            table = self._published
            count_cpu = self._surplus(fleet, w, ctx) > 0
            if table is not None and not fleet_usable(fleet).holds(w, self.memory_aware, count_cpu):
                weights = weights_for(w, table)  # a learned workload: the weights of the last published snapshot
            else:
                stamps = cycle_row_stamps(fleet, ctx)
                weights = fleet_scarcity(
                    w, fleet, self.memory_aware, self.args.scarcity_cap, stamps, count_cpu, self._structural
                )
        else:
            weights = np.ones(len(w), dtype=np.float64)
        if hedge is not None:
            weights = weights * hedge  # a learned workload: each shape at its probability's upper bound
        last = self._priced
        if last is not None and last[0] is w and np.array_equal(last[1], weights):
            priced = last[2]
        else:
            priced = w.priced(weights)
            self._priced = (w, weights, priced)
        ctx.state.write(SCARCITY_KEY, (fleet, w, priced))
        return priced

    @property
    def _structural(self) -> float:
        """What the structural part of a shape's scarcity weight is multiplied by (:func:`.fleet_scarcity`): the
        stranding weight (at least 1). The stranding term steers CPU-hungry pods to CPU-rich nodes at
        ``strandingWeight`` times dF's scale, and those nodes are the few homes of the shapes that need their CPU
        or memory: priced at dF's scale, the homes lost to that steering. Measured on the multi-GPU 20 % variant
        (full size, seed 42), a 4-GPU 60-core pod took an empty 128-core node, the only kind a 120-core 8-GPU pod
        fits, because a 96-core node would have been left 0.45 GPU short of CPU (x 4 = 1,780 thousandths), while
        the home's loss weighed 494 (16 x 0.8 % x 4 GPUs): 4 of the 39 homes went so, 0.5 point of GPUs."""
        return max(1.0, self.args.stranding_weight)

    def hedge(self, w: Workload) -> FloatA | None:
        """(M,) what each shape of a learned ``w`` is priced up by: :func:`~.workload.upper_bound_factors` of its
        :attr:`~.workload.Workload.evidence`, ``confidenceZ`` standard deviations up (``None``: a workload given,
        or ``confidenceZ`` 0). Once per workload object."""
        last = self._hedged
        if last is not None and last[0] is w:
            return last[1]
        z = self.args.confidence_z
        hedge = None if w.evidence is None or z <= 0 else upper_bound_factors(*w.evidence, z)
        self._hedged = (w, hedge)
        return hedge

    def _surplus(self, fleet: FleetArrays, w: Workload, ctx: CycleContext) -> float:
        """:func:`cpu_surplus_factor` of ``fleet``, once per cycle (the score and the pick of a cycle read the same
        fleet)."""
        full_at = self.args.stranding_full_surplus
        key = (w.cpu_per_milli, w.cpu_only_per_milli, full_at)
        hit = ctx.state.find(SURPLUS_KEY)
        if hit is not None and hit[0] is fleet and hit[1] == key:
            return hit[2]
        factor = cpu_surplus_factor(fleet, w, full_at, cycle_row_stamps(fleet, ctx))
        ctx.state.write(SURPLUS_KEY, (fleet, key, factor))
        return factor

    def _explain_extras(self, req: GpuRequest, fleet: FleetArrays, pl: Placements, w: Workload, i: int) -> list[str]:
        out = []
        penalty = self.plan_penalty(req, pl, w)
        if penalty is not None:
            cost = float(penalty[i])
            out.append(
                "packing plan: part of the optimal packing of the workload's shares"
                if cost == 0
                else f"packing plan: {cost / 100:.2f} GPU worse than the optimal packing of the workload's shares"
            )
        change = float(stranding_change(req, pl, w)[i])
        if change and self.args.stranding_weight:
            factor = cpu_surplus_factor(fleet, w, self.args.stranding_full_surplus)
            what = "more" if change > 0 else "fewer"
            note = f"weight x{factor:.2f}" if change > 0 else "not credited: dF counts what using them is worth"
            out.append(
                f"CPU stranding: {abs(change) / MILLI_PER_GPU:.2f} {what} GPU left without CPU to feed it "
                f"(at {w.cpu_per_milli:.1f} millicores per thousandth of GPU; {note})"
            )
        return out

    def prepare(self, fleet: FleetArrays) -> None:
        """When a snapshot is published: re-solve the packing plan off the request path (:meth:`warm_plan`), and
        price the learned workload's shapes by their live scarcity on it (:meth:`scored_workload` looks them up)."""
        self.warm_plan()
        if self.args.scarcity:
            w = self.published.workload()
            if w.gpu_shapes.any():
                count_cpu = cpu_surplus_factor(fleet, w, self.args.stranding_full_surplus) > 0
                weights = fleet_scarcity(
                    w,
                    fleet,
                    self.memory_aware,
                    self.args.scarcity_cap,
                    count_cpu=count_cpu,
                    structural=self._structural,
                )
                self._published = by_shape(w, weights)

    def warm_plan(self) -> None:
        """Re-solve the packing plan for the learned workload off the request path once the share mix has moved
        half of ``replanDrift``."""
        if not self.args.packing_plan:
            return
        w = self.published.workload()
        if w.shares is not None:
            self.plans.plan(*w.shares, drift=self.args.replan_drift / 2)

    def plan_penalty(self, req: GpuRequest, pl: Placements, w: Workload) -> FloatA | None:
        """Each placement's reduced cost in the workload's packing plan (hundredths of a GPU), or ``None``."""
        if not (self.args.packing_plan and req.shared and pl.slot_free is not None and len(pl.pos)):
            return None
        plan = self._plan(req, w)
        if plan is None:
            return None
        return plan.penalty(pl.slot_free, pl.slot_free - pl.slot_left)

    def _plan(self, req: GpuRequest, w: Workload) -> PackingPlan | None:
        """The packing plan a shared pod is ranked by (``None``: none, or not a shared pod)."""
        if not (self.args.packing_plan and req.shared):
            return None
        if w.shares is not None:
            return self.plans.plan(*w.shares)
        shares = w.gpu_shapes & (w.count == 1) & (w.milli < MILLI_PER_GPU)
        return self.plans.plan(w.milli[shares], w.prob[shares])


class FgdPolicy(FragmentationBase):
    """The FGD paper's score, exactly: int(100 * sigmoid(-dF/1000)); inside the node, the first best GPU."""

    @property
    def memory_aware(self) -> bool:
        return False

    def _values(self, req: GpuRequest, fleet: FleetArrays, pl: Placements, w: Workload, ctx: CycleContext) -> FloatA:
        return fgd_value(pl.delta)

    def normalize(self, raw: FloatA) -> FloatA:
        return np.asarray(np.minimum(np.maximum(np.nan_to_num(raw, neginf=0.0), 0), 100) / 100 * MAX_EXTENDER_PRIORITY)
