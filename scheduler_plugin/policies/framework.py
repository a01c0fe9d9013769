"""The framework: runs the filters, combines the weighted scores, picks GPUs and explains a decision.

One :class:`Framework` is built from a :class:`~scheduler_plugin.policies.policy_file.PolicyConfig` at startup (bad
names or arguments fail there, naming the field). Per cycle it reads an immutable :class:`FleetArrays` plus the
assumed-allocation ledger, which it applies as an overlay (``FleetArrays.with_assumed``) so that pods bound in the
last seconds count against capacity before telemetry shows them.

Scores: every policy's raw score is normalised to 0..10 by the policy; the framework takes the weighted mean
``sum(w_i * s_i) / sum(w_i)`` (a float, returned for tie-breaking) and rounds it to the integer 0..10 the extender
protocol carries, with 10 for the one node it ranks first and at most 9 for every other (:mod:`.choice`: kube-scheduler
draws at random among equal top totals).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from ..model import FleetArrays, GpuAssignment, GpuRequest
from ..model.claim import claim_of
from ..model.snapshot import stale_mask
from .base import (
    MAX_EXTENDER_PRIORITY,
    PLACEMENT_LOG,
    RECENT_PLACEMENTS,
    BindsPeers,
    BoolA,
    CycleContext,
    FloatA,
    GpuPicker,
    IntA,
    ObservesPods,
    PreparesSnapshot,
    PreScorePlugin,
    Rejection,
    RestrictsPlacement,
    ScorePlugin,
)
from .choice import NodeOrder, single_best
from .cpu_pack import PackScore
from .eligibility import LIMITS_KEY
from .fit import FitFilter, TelemetryFilter
from .hot import HotNodeFilter
from .ledger import AssumedLedger
from .normalize import finite
from .plugins import PRODUCTION
from .policy_file import CpuOnlyPolicy, PolicyConfig, TelemetryPolicy
from .registry import PolicyConfigError, Registry


class BatchFilter(Protocol):
    name: str

    def filter(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> BoolA: ...

    def reasons(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> list[Rejection]: ...


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    passed: IntA
    """Rows that passed every filter, in the order given."""
    rejected_rows: IntA = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """The rows that failed, those of the first filter first (each filter's in the order given)."""
    rejections: Sequence[Rejection] = ()
    """Why each of :attr:`rejected_rows` failed (the first filter that rejected it), in the same order."""

    @property
    def rejected(self) -> dict[int, Rejection]:
        """Row -> why it failed."""
        return dict(zip(self.rejected_rows.tolist(), self.rejections, strict=True))


@dataclass(frozen=True, slots=True)
class WeightedScore:
    name: str
    plugin: ScorePlugin
    weight: float


@dataclass(slots=True)
class FilterVerdict:
    filter: str
    passed: bool
    reason: str | None = None
    unresolvable: bool = False


@dataclass(slots=True)
class PolicyVerdict:
    policy: str
    raw: float | None
    """The policy's raw score (None when it has no data for the node)."""
    normalized: float
    """0..10, among the candidates explained with."""
    weight: float
    reasons: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Explanation:
    node: str
    request: str
    fits: bool
    filters: list[FilterVerdict]
    scores: list[PolicyVerdict]
    score: int | None
    """The integer 0..10 score the extender would send (None when filtered out)."""
    combined: float | None
    """The weighted mean before rounding."""
    gpus: list[int] | None
    """The GPUs the picker would choose (None when it does not fit)."""
    gpu_details: list[str]
    candidates: int
    """How many nodes the scores were normalised among."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _distinct(plugins: tuple[object, ...]) -> tuple[object, ...]:
    """``plugins`` without repeats (one object may be a scorer and the picker), in order."""
    out: dict[int, object] = {}
    for p in plugins:
        out.setdefault(id(p), p)
    return tuple(out.values())


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


class Framework:
    """The scheduling framework: the filters (telemetry staleness, fit, optionally hot nodes), the weighted score
    plugins, the GPU picker and the ledger they charge binds to. Owns its plugins and the assumed-ledger overlay of the
    last fleet it saw (:meth:`view`); what plugins derive from a snapshot lives in the snapshot's own index
    (``FleetArrays.derived``, filled by :meth:`warm` when the snapshot is published). It knows no plugin by name: it
    loops over them and calls the optional hooks each one implements (:class:`~.base.BindsPeers` once,
    :class:`~.base.PreparesSnapshot` per snapshot, :class:`~.base.ObservesPods` per pod, :class:`~.base.PreScorePlugin`
    per cycle). Built once at startup by :meth:`from_config` (or by hand in tests and the simulator) and kept for the
    process's life; it holds no request state, each cycle's state lives in the :class:`CycleContext` the caller makes
    with :meth:`context`. Not thread-safe: the extender calls it from its event loop only (one verb at a time,
    :mod:`scheduler_plugin.extender.turns`); the ledger it holds is thread-safe on its own."""

    def __init__(
        self,
        *,
        telemetry: TelemetryPolicy,
        fit: FitFilter,
        scorers: Sequence[WeightedScore],
        picker: GpuPicker,
        ledger: AssumedLedger | None = None,
        hot: HotNodeFilter | None = None,
        cpu_only: Sequence[WeightedScore] = (),
    ) -> None:
        self.telemetry = telemetry
        self.fit = fit
        self.stale_filter = TelemetryFilter(telemetry.max_age_seconds, telemetry.on_stale)
        self.hot_filter = hot
        filters: list[BatchFilter] = [self.stale_filter, fit]
        if hot is not None and hot.enabled:
            filters.append(hot)
        # a score plugin that also refuses nodes (the priority policy's reserve) filters after these, at any weight
        restrictors = [ws.plugin for ws in scorers if isinstance(ws.plugin, RestrictsPlacement)]
        filters.extend(p for p in _distinct(tuple(restrictors)) if isinstance(p, RestrictsPlacement) and p.restricts())
        self.filters: tuple[BatchFilter, ...] = tuple(filters)
        self.scorers = tuple(s for s in scorers if s.weight > 0)
        self.cpu_only = tuple(s for s in cpu_only if s.weight > 0)
        """What ranks pods without GPUs (the policy file's ``cpuOnly``); empty: they score 0 everywhere."""
        self.picker = picker
        self.ledger = ledger
        self.plugins: tuple[object, ...] = _distinct(
            (*self.filters, *(ws.plugin for ws in (*self.scorers, *self.cpu_only)), picker)
        )
        """Every plugin once, in order: filters, scorers, the picker."""
        scoring: tuple[object, ...] = tuple(ws.plugin for ws in self.scorers)
        if isinstance(picker, BindsPeers) and all(picker is not p for p in scoring):
            picker.bind(scoring)  # the picker may judge by what the scorers learn
        self._preparers = tuple(p for p in self.plugins if isinstance(p, PreparesSnapshot))
        self._observers = tuple(p for p in self.plugins if isinstance(p, ObservesPods))
        self._pre_scorers = tuple(
            p for p in _distinct(tuple(ws.plugin for ws in self.scorers)) if isinstance(p, PreScorePlugin)
        )
        self._cpu_only_pre_scorers = tuple(
            p for p in _distinct(tuple(ws.plugin for ws in self.cpu_only)) if isinstance(p, PreScorePlugin)
        )
        self._overlay: FleetArrays | None = None
        self._overlay_fleet: FleetArrays | None = None
        """The fleet :attr:`_overlay` overlays."""
        self._overlay_version = -1
        """The ledger's ``version`` whose entries :attr:`_overlay` charges."""
        self._order = NodeOrder()

    @classmethod
    def from_config(
        cls, cfg: PolicyConfig, *, ledger: AssumedLedger | None = None, plugins: Registry = PRODUCTION
    ) -> Framework:
        """Build every plugin through ``plugins`` (the production registry unless the simulator passes its own);
        raises ``PolicyConfigError`` naming the bad field path and the names ``plugins`` knows."""
        fit = plugins.build("filter", "fit", cfg.filters.model_dump(), "filters")
        scorers = []
        for name, sc in cfg.scoring.items():
            try:
                plugins.lookup("score", name)
            except PolicyConfigError as exc:
                raise PolicyConfigError(f"scoring.{name}: {exc}") from None
            plugin = plugins.build("score", name, sc.args, f"scoring.{name}.args")
            scorers.append(WeightedScore(name, plugin, sc.weight))
        try:
            plugins.lookup("picker", cfg.picker)
        except PolicyConfigError as exc:
            raise PolicyConfigError(f"picker: {exc}") from None
        picker = plugins.build("picker", cfg.picker, cfg.picker_args, "pickerArgs")
        return cls(
            telemetry=cfg.telemetry,
            fit=fit,
            scorers=scorers,
            picker=picker,
            ledger=ledger if ledger is not None else AssumedLedger(cfg.ledger.ttl_seconds),
            hot=HotNodeFilter(cfg.hotness, enabled=cfg.filters.hot_nodes),
            cpu_only=cpu_only_scorers(cfg.cpu_only, scorers),
        )

    # --- cycle set-up -------------------------------------------------------------------------------------------

    def warm(self, fleet: FleetArrays) -> None:
        """Fill the snapshot index of ``fleet`` (every plugin's :meth:`~.base.PreparesSnapshot.prepare`: wiring
        patterns, thermal and noise telemetry terms, hot GPUs, the packing plan of the workload learned so far) off
        the hot path.

        Call it when a new snapshot is published; otherwise the first cycle on the new snapshot pays for it.
        """
        for p in self._preparers:
            p.prepare(fleet)

    def context(self, fleet: FleetArrays, now: float) -> CycleContext:
        """A cycle context with per-node staleness computed from ``observed_at`` and the configured max age."""
        ctx = CycleContext(now=now, stale=stale_mask(fleet.observed_at, now, self.telemetry.max_age_seconds))
        self._prepare(ctx)
        return ctx

    def _prepare(self, ctx: CycleContext) -> None:
        """What the framework itself tells every plugin: the fit filter's limits, the ledger's recent placements."""
        ctx.state.setdefault(LIMITS_KEY, self.fit.limits)
        if RECENT_PLACEMENTS not in ctx.state and self.ledger is not None:
            ctx.state.write(RECENT_PLACEMENTS, self.ledger.placements(ctx.now, self.ledger.ttl_s))
            ctx.state.write(PLACEMENT_LOG, self.ledger.placement_log(ctx.now))

    def view(self, fleet: FleetArrays, ctx: CycleContext) -> FleetArrays:
        """``fleet`` with the ledger's live assumed assignments subtracted from free capacity (cached).

        Between two snapshots the ledger changes a few nodes at a time (a bind adds a pod, the TTL or a forget takes
        one away): the cached overlay is updated on the nodes whose lists the ledger replaced since its version
        (:meth:`~.ledger.AssumedLedger.entries_since`), each recharged whole from the snapshot
        (:meth:`~scheduler_plugin.model.FleetArrays.with_assumed_on`: the same arrays as a full rebuild), so a bind or
        an expiry costs the same however many pods the ledger holds. While the ledger has not changed (its
        ``version``: filter, prioritize and bind of one pod), the overlay is returned as it is. A new snapshot, or an
        overlay further behind than the ledger's change log, is rebuilt whole."""
        if self.ledger is None or fleet is self._overlay:
            return fleet
        # expires what reached the TTL first (a change of version); ``changed``: the nodes whose lists changed since
        # the overlay's version (None: too long ago to tell)
        entries, version, changed = self.ledger.entries_since(ctx.now, self._overlay_version)
        if not entries:
            return fleet
        if self._overlay is not None and self._overlay_fleet is fleet and changed is not None:
            if changed:
                self._overlay = self._overlay.with_assumed_on(fleet, entries, sorted(changed))
            self._overlay_version = version
            return self._overlay
        self._overlay = fleet.with_assumed(entries)
        self._overlay_fleet = fleet
        self._overlay_version = version
        return self._overlay

    # --- learning -------------------------------------------------------------------------------------------------

    def observe(self, req: GpuRequest) -> None:
        """Learn one arriving pod: every plugin that learns (:class:`~.base.ObservesPods`, e.g. the fragmentation
        plugins count its shape in their target workload, each estimator once). The only step that changes the learned
        workload: filter, prioritize, pick and explain only read it. The extender calls it from its filter verb, which
        sees every pod kelvin manages, whether it then fits one node, many or none; a pod the scheduler retries (same
        UID) counts once (the estimator remembers the last 20,000 pods it counted). O(1) per pod."""
        for p in self._observers:
            p.observe(req)

    # --- the extender verbs ---------------------------------------------------------------------------------------

    def filter(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> FilterOutcome:
        rows = np.asarray(rows, dtype=np.int64)
        if not req.wants_gpu:
            return FilterOutcome(rows)
        self._prepare(ctx)
        fleet = self.view(fleet, ctx)
        bad_rows: list[IntA] = []
        rejections: list[Rejection] = []
        passed = rows
        for f in self.filters:
            if passed.size == 0:
                break
            ok = f.filter(req, fleet, passed, ctx)
            if not ok.all():
                bad = passed[~ok]
                why = f.reasons(req, fleet, bad, ctx)
                if len(why) != bad.size:
                    raise ValueError(f"filter {f.name}: {len(why)} reasons for {bad.size} rejected rows")
                bad_rows.append(bad)
                rejections.extend(why)
                passed = passed[ok]
        if not bad_rows:
            return FilterOutcome(passed)
        return FilterOutcome(passed, np.concatenate(bad_rows) if len(bad_rows) > 1 else bad_rows[0], rejections)

    def _raw_scores(
        self, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext
    ) -> list[tuple[WeightedScore, FloatA, FloatA]]:
        gpu = req.wants_gpu
        for p in self._pre_scorers if gpu else self._cpu_only_pre_scorers:
            p.pre_score(req, fleet, rows, ctx)
        out = []
        for ws in self.scorers if gpu else self.cpu_only:
            raw = np.asarray(ws.plugin.score(req, fleet, rows, ctx), dtype=np.float64)
            norm = np.asarray(ws.plugin.normalize(raw), dtype=np.float64)
            out.append((ws, raw, norm))
        return out

    @staticmethod
    def _combine(parts: list[tuple[WeightedScore, FloatA, FloatA]], n: int) -> tuple[IntA, FloatA]:
        total_w = sum(ws.weight for ws, _, _ in parts)
        combined = np.zeros(n, dtype=np.float64)
        if total_w <= 0:
            return np.zeros(n, dtype=np.int64), combined
        for ws, _, norm in parts:
            combined += ws.weight * finite(norm, nan=0.0)
        combined /= total_w
        # half up; np.minimum/np.maximum: np.clip's values without its per-call dispatch
        ints = np.minimum(np.maximum(np.floor(combined + 0.5), 0), MAX_EXTENDER_PRIORITY).astype(np.int64)
        return ints, combined

    def prioritize(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> tuple[IntA, FloatA]:
        """(integer 0..10 scores, weighted mean as float for tie-breaking), one per row: the rounded means, 10 for
        the one row ranked first (equal means: by the node names' fixed order, :mod:`.choice`) and at most 9 for the
        others. Pods without GPUs are ranked by :attr:`cpu_only` (0 everywhere when it is empty)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0 or not (req.wants_gpu or self.cpu_only):
            return np.zeros(rows.size, dtype=np.int64), np.zeros(rows.size, dtype=np.float64)
        self._prepare(ctx)
        fleet = self.view(fleet, ctx)
        return self._ranked(fleet, rows, self._raw_scores(req, fleet, rows, ctx))

    def _ranked(
        self, fleet: FleetArrays, rows: IntA, parts: list[tuple[WeightedScore, FloatA, FloatA]]
    ) -> tuple[IntA, FloatA]:
        """:meth:`_combine`'s rounded and weighted means, with the first row alone at 10 when any policy scored."""
        ints, combined = self._combine(parts, rows.size)
        if not parts:
            return ints, combined
        return single_best(ints, combined, self._order.keys(fleet.names)[rows]), combined

    def pick(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> tuple[int, ...] | None:
        """The GPUs (their own indices) the pod gets on node ``row``; None if it does not fit there."""
        if not req.wants_gpu:
            return ()
        self._prepare(ctx)
        fleet = self.view(fleet, ctx)
        idx = np.array([row], dtype=np.int64)
        if not all(f.filter(req, fleet, idx, ctx)[0] for f in self.filters):
            return None
        return self.picker.pick(req, fleet, row, ctx)

    def assume(
        self,
        node: str,
        req: GpuRequest,
        gpus: Sequence[int],
        now: float,
    ) -> GpuAssignment:
        """Record a bind in the ledger (no-op without one) and return the assignment (:func:`claim_of`: charged on
        each GPU by its size when the snapshot is built, so a 20 GiB pool is 250 thousandths of an 80 GiB GPU)."""
        a = claim_of(req, gpus)
        if self.ledger is not None:
            self.ledger.assume(node, a, now)
        return a

    def explain(
        self,
        req: GpuRequest,
        fleet: FleetArrays,
        row: int,
        ctx: CycleContext,
        candidates: IntA | None = None,
    ) -> Explanation:
        """Every filter's verdict and every policy's raw, normalised and weighted score for node ``row``.

        Normalisation is relative for some policies, so pass the rows the node competed with as ``candidates``;
        without them the node is scored alone.
        """
        self._prepare(ctx)
        fleet = self.view(fleet, ctx)
        idx = np.array([row], dtype=np.int64)
        verdicts = []
        fits = True
        for f in self.filters:
            ok = bool(f.filter(req, fleet, idx, ctx)[0]) if req.wants_gpu else True
            if ok:
                verdicts.append(FilterVerdict(f.name, True))
            else:
                fits = False
                rej = f.reasons(req, fleet, idx, ctx)[0]
                verdicts.append(FilterVerdict(f.name, False, rej.reason, rej.unresolvable))
        details = self.fit.gpu_lines(req, fleet, row)
        if not fits:
            return Explanation(fleet.names[row], req.describe(), False, verdicts, [], None, None, None, details, 0)
        cand = idx if candidates is None else np.asarray(candidates, dtype=np.int64)
        if not np.any(cand == row):
            cand = np.concatenate([cand, idx])
        cand = self.filter(req, fleet, cand, ctx).passed
        pos = int(np.nonzero(cand == row)[0][0])
        parts = self._raw_scores(req, fleet, cand, ctx)
        ints, combined = self._ranked(fleet, cand, parts)
        scores = [
            PolicyVerdict(
                ws.name, _finite(float(raw[pos])), float(norm[pos]), ws.weight, ws.plugin.explain(req, fleet, row, ctx)
            )
            for ws, raw, norm in parts
        ]
        picked = self.picker.pick(req, fleet, row, ctx) if req.wants_gpu else ()
        return Explanation(
            node=fleet.names[row],
            request=req.describe(),
            fits=True,
            filters=verdicts,
            scores=scores,
            score=int(ints[pos]),
            combined=float(combined[pos]),
            gpus=None if picked is None else list(picked),
            gpu_details=details,
            candidates=int(cand.size),
        )


def cpu_only_scorers(cfg: CpuOnlyPolicy, scorers: Sequence[WeightedScore]) -> list[WeightedScore]:
    """The ranking of pods without GPUs that ``cfg`` asks for: the ``fragmentation`` scorer's own plugin (the same
    instance, so the workload it learns is one) and best fit (:class:`~.cpu_pack.PackScore`)."""
    out = []
    frag = next((ws.plugin for ws in scorers if ws.name == "fragmentation" and ws.weight > 0), None)
    if frag is not None and cfg.fragmentation_weight > 0:
        out.append(WeightedScore("fragmentation", frag, cfg.fragmentation_weight))
    if cfg.pack_weight > 0:
        out.append(WeightedScore("pack", PackScore(cfg.cpu_scale_cores, cfg.gpu_scale), cfg.pack_weight))
    return out
