"""Thermal: hot nodes score low well before they throttle.

Per GPU, the temperature is predicted ``horizonSeconds`` ahead from its trend (never below the current temperature:
cooling is not rewarded in advance) and its quality is the headroom left below the slowdown threshold, as a share of
``comfortableHeadroomCelsius``::

    q = clip((slowdown - max(temp, temp + trend * horizon)) / comfortable, 0, 1)

The trend is judged only on GPUs already within ``trendFromHeadroomCelsius`` (default: the comfortable headroom) of
slowdown, as the operator's hotness check does (``predictMinCelsius``): a GPU that just got a job rises fast from idle,
and a straight line through that start overshoots where it settles, so a cool node that just took a pod would score
as badly as one about to throttle.

Cooling quality: a badly cooled GPU looks like any other while idle and gives itself away only by how far it heats
per watt. Where the snapshot knows a GPU's thermal resistance ``r`` (°C per watt above idle, learned by
:mod:`scheduler_plugin.telemetry.cooling` or reported by the source) and its power, the temperature it would settle
at under a pod is predicted, and the quality is the lower of the two::

    loaded = temp + trend * settle + r * (P_load - power)     # P_load: loadPowerPercentile of busy GPUs' power
    q = min(q, clip((slowdown - loaded) / loadedHeadroom, 0, 1))

so a poorly cooled node scores low before it is loaded, and the scheduler does not fill it first.

A GPU whose temperature is unknown (NaN: the source has no reading) has q = 0. Active thermal throttling sets q
to 0; any other clock slowdown (power cap, hardware slowdown, power brake) multiplies
it by ``throttlePenalty`` and by the clock ratio (SM clock / max). A node's raw score mixes the GPUs the pod would get
(the mean of the best ``count`` usable GPUs, or of all its GPUs when fewer are usable) with the node's worst GPU
(heat spreads inside a chassis, and a job on a hot node shares its fans and PSUs)::

    raw = (1 - nodeShare) * mean(best usable q) + nodeShare * min(q over the node)

Normalised absolutely (``normalize.unit``): raw 1 is 10 points on every node, so a hot fleet scores low everywhere.

Holding a pod rather than running it throttled (``holdRunSeconds``): a score cannot make a pod wait, and when the only
nodes with room are poorly cooled ones (kept whole because the score avoids them) the next big pod takes one and
throttles for its whole run. So the policy also refuses nodes, pricing both outcomes in GPU-seconds per GPU of the
pod (its size cancels): placed on a node whose GPUs are predicted to settle under load at or above slowdown (less
``holdHeadroomCelsius``, 0 by default), the pod
throttles for its run (``holdRunSeconds``, the run a pending pod is assumed to have ahead); waiting costs the time
it waits. The node's odds of throttling are ``p``: the share of its GPUs with a learned cooling figure that would
throttle under load (cooling belongs to the chassis), or for a node none of whose GPUs has been learned, the mean of
that share over the nodes with a learned GPU (the prior's own figure is the worst learned, not evidence about this
node). A
pod that has waited ``w`` seconds (``GpuRequest.pending_since``) is refused a node while::

    w < p * holdRunSeconds

so a pod waits for a well-cooled node at most as long as the throttling it expects to avoid (the rent-or-buy bound:
never more than twice the cost of the better choice in hindsight), and takes a poorly cooled node once it has waited
that long. A pod whose waiting time is unknown, or a fleet with nothing learned, is never held.

The predicates below (:func:`headroom_c`, :func:`predicted_temp`) are pure functions on scalars and arrays alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, overload

import numpy as np
from pydantic import Field

from ..model import SLOWDOWN_MASK, THERMAL_THROTTLE_MASK, FleetArrays, GpuRequest, throttle_reason_names
from ..model.snapshot import IndexKey
from .base import BoolA, CycleContext, FloatA, IntA, Rejection, RejectionKind
from .eligibility import STATIC_COLUMNS, GpuLimits, cycle_eligible, eligible_gpus, few_rows, limits_of
from .normalize import unit
from .policy_file import CamelModel
from .row_memo import RowMemo


@overload
def headroom_c(temp: float, slowdown: float) -> float: ...
@overload
def headroom_c(temp: FloatA, slowdown: FloatA | float) -> FloatA: ...
def headroom_c(temp: float | FloatA, slowdown: float | FloatA) -> float | FloatA:
    """Degrees Celsius left below the slowdown threshold (negative when above it)."""
    return slowdown - temp


@overload
def predicted_temp(temp: float, trend_c_per_min: float, horizon_s: float) -> float: ...
@overload
def predicted_temp(temp: FloatA, trend_c_per_min: FloatA, horizon_s: float) -> FloatA: ...
def predicted_temp(temp: float | FloatA, trend_c_per_min: float | FloatA, horizon_s: float) -> float | FloatA:
    """Linear prediction of the temperature ``horizon_s`` seconds ahead from the trend (°C/min)."""
    return temp + trend_c_per_min * (horizon_s / 60.0)


class ThermalArgs(CamelModel):
    comfortable_headroom_celsius: float = Field(25.0, gt=0, le=100)
    """Headroom below slowdown at which a GPU gets the full score."""
    horizon_seconds: float = Field(300.0, ge=0, le=3600)
    """How far ahead the temperature trend is extrapolated."""
    throttle_penalty: float = Field(0.5, ge=0, le=1)
    """Multiplier for a GPU whose clocks are slowed for a non-thermal reason (power cap, hw slowdown)."""
    node_share: float = Field(0.3, ge=0, le=1)
    """Weight of the node's worst GPU against the GPUs the pod would get."""
    trend_from_headroom_celsius: float | None = Field(None, ge=0, le=100)
    """The trend counts only for GPUs at most this far below slowdown; default ``comfortableHeadroomCelsius``."""
    loaded_headroom_celsius: float = Field(15.0, gt=0, le=100)
    """Headroom below slowdown, predicted under load from the GPU's cooling quality, at which it gets the full score;
    the quality is the lower of the now and the under-load one."""
    load_power_percentile: float = Field(100.0, ge=0, le=100)
    """The load a pod is assumed to add: this percentile of the power that busy GPUs of the same model draw now
    (default the highest: a pod may run flat out)."""
    settle_seconds: float = Field(60.0, ge=0, le=3600)
    """Thermal time constant used to read where a GPU is heading at its present power: ``temp + trend * settle``
    (a GPU whose job just ended is still hot but is cooling towards its idle temperature)."""
    busy_above_util: float = Field(0.05, ge=0, lt=1)
    """A GPU counts as busy (for the typical power under load) above this utilisation."""
    hold_headroom_celsius: float = Field(0.0, ge=0, le=30)
    """For holding a pod: a GPU predicted under load to settle within this of slowdown counts as one that would
    throttle (the prediction is a few degrees off: one reading's trend over ``settleSeconds``, the inlet drifting over
    a run, a pod's own intensity). 0: at or above slowdown only (4, the operator's hot line on an H100, was measured
    no better: docs/simulator.md)."""
    hold_run_seconds: float = Field(3600.0, ge=0, le=86400)
    """The run a pending pod is assumed to have ahead, all of it throttled on a node predicted to throttle under
    load: a pod is refused such a node while it has waited less than this times the node's odds of throttling (0:
    never hold). The default is the operator's ``maxRemainingSeconds``, the most remaining work it assumes a pod has."""

    @property
    def trend_from_headroom(self) -> float:
        t = self.trend_from_headroom_celsius
        return self.comfortable_headroom_celsius if t is None else t


def judged_temp(temp: FloatA, trend: FloatA, slowdown: FloatA, args: ThermalArgs) -> FloatA:
    """The temperature a GPU is judged by: predicted ``horizonSeconds`` ahead when it is already warm (within
    ``trendFromHeadroomCelsius`` of slowdown), never below the current one; else the current one."""
    warm = headroom_c(temp, slowdown) <= args.trend_from_headroom
    return np.where(warm, np.maximum(temp, predicted_temp(temp, trend, args.horizon_seconds)), temp)


def loaded_power_w(fleet: FleetArrays, args: ThermalArgs) -> FloatA:
    """(N, G) the power a GPU is expected to draw under a pod: the ``loadPowerPercentile`` of what busy GPUs of its
    model draw now (NaN for a model with no busy GPU, or without power readings)."""
    out = np.full(fleet.gpu_present.shape, np.nan)
    busy = fleet.gpu_present & np.isfinite(fleet.power) & (fleet.util > args.busy_above_util)
    for m in np.unique(fleet.model_id[busy]):
        mask = fleet.model_id == m
        out[mask] = float(np.percentile(fleet.power[mask & busy], args.load_power_percentile))
    return out


def loaded_temp(fleet: FleetArrays, idx: IntA, args: ThermalArgs) -> FloatA:
    """(n, G) the temperature a GPU is predicted to settle at under a pod's load: where it is heading at its present
    power (``temp + trend * settleSeconds``) plus its thermal resistance times the power the load adds
    (:func:`loaded_power_w` less what it draws now; negative for a GPU drawing more than that). NaN where the cooling
    quality or the power is unknown."""
    heading = fleet.temp[idx] + fleet.trend[idx] * (args.settle_seconds / 60.0)
    added = loaded_power_w(fleet, args)[idx] - fleet.power[idx]
    return np.asarray(heading + fleet.thermal_resistance[idx] * added, dtype=np.float64)


def gpu_quality(fleet: FleetArrays, idx: IntA, args: ThermalArgs) -> FloatA:
    """(n, G) thermal quality 0..1 per GPU (NaN for padding)."""
    slowdown = fleet.slowdown[idx]
    pred = judged_temp(fleet.temp[idx], fleet.trend[idx], slowdown, args)
    q = np.clip(headroom_c(pred, slowdown) / args.comfortable_headroom_celsius, 0.0, 1.0)
    with np.errstate(invalid="ignore"):
        q_loaded = np.clip(headroom_c(loaded_temp(fleet, idx, args), slowdown) / args.loaded_headroom_celsius, 0, 1)
    q = np.where(np.isnan(q_loaded), q, np.minimum(q, q_loaded))
    thr = fleet.throttle[idx]
    slowed = (thr & SLOWDOWN_MASK) != 0
    q = np.where(slowed, q * args.throttle_penalty * fleet.clock_ratio[idx], q)
    q = np.where((thr & THERMAL_THROTTLE_MASK) != 0, 0.0, q)
    q = np.where(np.isnan(fleet.temp[idx]), 0.0, q)  # no temperature reading: no headroom, never a cool GPU
    return np.where(fleet.gpu_present[idx], q, np.nan)


def throttle_odds(fleet: FleetArrays, args: ThermalArgs) -> FloatA:
    """(N,) the odds that a pod's GPUs would throttle under load on each node: the share of the node's GPUs with a
    learned (or reported) cooling figure whose predicted temperature under load (:func:`loaded_temp`) is within
    ``holdHeadroomCelsius`` of slowdown or above; for a node with none, the mean of that share over the nodes with
    one (cooling belongs to the chassis: a poorly cooled node is avoided once known, so few of its GPUs are ever
    learned, and a share of GPUs would under-count it); 0 while nothing is known."""
    rows = np.arange(fleet.n_nodes, dtype=np.int64)
    with np.errstate(invalid="ignore"):
        throttles = loaded_temp(fleet, rows, args) >= fleet.slowdown - args.hold_headroom_celsius  # NaN: False
    known = fleet.gpu_present & (fleet.cooling_samples != 0) & np.isfinite(fleet.thermal_resistance)
    n_known = known.sum(axis=1)
    own = (throttles & known).sum(axis=1) / np.maximum(n_known, 1)
    seen = n_known > 0
    fleet_share = float(own[seen].mean()) if seen.any() else 0.0
    return np.asarray(np.where(seen, own, fleet_share), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class HeldForCooling(Rejection):
    """The pod is held rather than placed where it would throttle (the ``thermal`` policy's ``holdRunSeconds``)."""

    kind: ClassVar[RejectionKind] = RejectionKind.THERMAL
    unresolvable: ClassVar[bool] = True
    """Preempting the node's pods would not cool it: the pod waits for a node where it would not throttle."""
    odds: float
    """The node's odds of throttling under load (:func:`throttle_odds`)."""
    waited_s: float
    hold_s: float
    """How long the pod is held from this node: ``odds * holdRunSeconds``."""

    def words(self) -> str:
        what = "its GPUs" if self.odds >= 1 else f"{self.odds:.0%} odds that its GPUs"
        return (
            f"{what} would throttle under load: the pod has waited {self.waited_s:.0f} s of the {self.hold_s:.0f} s "
            "of throttling that placing it here is expected to cost"
        )

    def need(self) -> str:
        return "the pod waits for a node where it would not throttle"


def versus_slowdown(headroom: float) -> str:
    """``"9.2 °C below slowdown"`` for a headroom of 9.2, ``"4.0 °C above slowdown"`` for -4.0."""
    side = "above" if headroom < 0 else "below"
    return f"{abs(headroom):.1f} °C {side} slowdown"


def cooling_provenance(samples: int, since: float, now: float) -> str:
    """Where a GPU's cooling figure comes from, for explain: learned (from how many readings, since when), the
    assumed prior (the worst learned for its model), or reported by the source (``FleetArrays.cooling_samples``)."""
    if samples < 0:
        return "reported by telemetry"
    if samples == 0:
        return "assumed (the worst learned for its model: this GPU has not been seen settled under load yet)"
    readings = "reading" if samples == 1 else "readings"
    age = f" since {now - since:.0f} s ago" if np.isfinite(since) and now >= since else ""
    return f"learned from {samples} {readings} under load{age}"


#: The columns :func:`gpu_quality` reads (none of them is ever written in place).
QUALITY_COLUMNS = (
    "temp",
    "trend",
    "slowdown",
    "throttle",
    "clock_ratio",
    "gpu_present",
    "power",
    "thermal_resistance",
    "util",
    "model_id",
)

#: The telemetry columns a row's raw score reads: its GPUs' quality and the eligibility of its GPUs for the request
#: (the capacity columns, written in place, are content-checked by the row memo).
SCORE_COLUMNS = tuple(dict.fromkeys((*QUALITY_COLUMNS, *STATIC_COLUMNS, "models")))


@dataclass(frozen=True, slots=True)
class _FlatQuality:
    """A fleet whose present GPUs all have one thermal quality (see :meth:`ThermalScore._flat_of`)."""

    quality: float
    n_present: IntA
    """(N,) present GPUs per row."""


class ThermalScore:
    """Headroom below slowdown, predicted from the trend, with throttling penalised."""

    name = "thermal"

    def __init__(self, args: ThermalArgs) -> None:
        self.args = args
        self._quality_key = IndexKey[tuple[FloatA, FloatA]]("thermal.quality", QUALITY_COLUMNS)
        self._odds_key = IndexKey[FloatA]("thermal.throttle_odds", (*QUALITY_COLUMNS, "cooling_samples"))
        self._rows_key = IndexKey[RowMemo]("thermal.score_rows", SCORE_COLUMNS, limit=64)
        """Snapshot index: the raw score of every row per request shape (:class:`~.row_memo.RowMemo`)."""
        self._flat_key = IndexKey[_FlatQuality | None]("thermal.flat", QUALITY_COLUMNS)
        """Snapshot index: the one quality every GPU of the fleet has, if they all have the same (:meth:`_flat_of`)."""

    def _quality_of(self, fleet: FleetArrays) -> tuple[FloatA, FloatA]:
        """(N, G) quality of every GPU and (N,) the worst per node: telemetry only, so once per snapshot."""
        q = gpu_quality(fleet, np.arange(fleet.n_nodes, dtype=np.int64), self.args)
        present = fleet.gpu_present
        with np.errstate(invalid="ignore"):
            node_min = np.where(present.any(axis=1), np.where(present, q, np.inf).min(axis=1), np.nan)
        return q, node_min

    def _flat_of(self, fleet: FleetArrays) -> _FlatQuality | None:
        """The quality every present GPU has, when they all have the same finite one (a fleet without temperature
        readings, such as a replayed trace: every GPU 0): then the score tells no node from another and a row's raw
        score depends only on whether it has the pod's GPU count (:meth:`_flat_raw`). ``None`` otherwise."""
        q, _ = fleet.derive(self._quality_key, self._quality_of)
        present = fleet.gpu_present
        values = q[present]
        if not values.size or not np.isfinite(values[0]) or not (values == values[0]).all():
            return None
        return _FlatQuality(float(values[0]), present.sum(axis=1))

    def _flat_raw(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, flat: _FlatQuality) -> FloatA:
        """:meth:`_raw` on a fleet of one GPU quality ``flat.quality``: every row with at least the pod's GPU count
        scores what :meth:`_raw` gives such a row (the mean of ``k`` equal qualities, rounded as it rounds them),
        whichever of its GPUs the pod could get; a row with fewer GPUs scores NaN (as there)."""
        k = max(1, req.count)
        c = flat.quality
        pod_part = c if k == 1 else float(np.full((1, k), c).mean(axis=1)[0])
        share = self.args.node_share
        value = (1 - share) * pod_part + share * c
        return np.where(flat.n_present[idx] >= k, value, np.nan)

    def prepare(self, fleet: FleetArrays) -> None:
        fleet.derive(self._quality_key, self._quality_of)
        fleet.derive(self._flat_key, self._flat_of)
        if self.restricts():
            fleet.derive(self._odds_key, self._odds_of)

    def _odds_of(self, fleet: FleetArrays) -> FloatA:
        return throttle_odds(fleet, self.args)

    # --- holding a pod rather than placing it where it would throttle (RestrictsPlacement) ---------------------------

    def restricts(self) -> bool:
        return self.args.hold_run_seconds > 0

    def _hold(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> tuple[float, FloatA]:
        """How long the pod has waited, and how long each node of ``idx`` holds it (0: not held)."""
        if not req.wants_gpu or req.pending_since is None or not self.restricts():
            return 0.0, np.zeros(idx.shape[0])
        odds = fleet.derive(self._odds_key, self._odds_of)[idx]
        return max(0.0, ctx.now - req.pending_since), odds * self.args.hold_run_seconds

    def filter(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> BoolA:
        waited, hold = self._hold(req, fleet, idx, ctx)
        return np.asarray(waited >= hold, dtype=np.bool_)

    def reasons(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> list[Rejection]:
        rows = np.asarray(rows, dtype=np.int64)
        waited, hold = self._hold(req, fleet, rows, ctx)
        run = self.args.hold_run_seconds
        return [HeldForCooling(h / run if run else 0.0, waited, h) for h in hold.tolist()]

    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        """The raw score of each row: a function of the row alone (its GPUs' quality, a snapshot's, and which of them
        the pod could get now), so for many candidates it is read from the shape's row memo (the rows charged since
        recomputed); for a few, computed."""
        if idx.size == 0:
            return np.zeros(0)
        if not req.wants_gpu:
            return fleet.derive(self._quality_key, self._quality_of)[1][idx]
        flat = fleet.derive(self._flat_key, self._flat_of)
        if flat is not None:
            return self._flat_raw(req, fleet, idx, flat)
        if few_rows(idx.size, fleet):
            return self._raw(req, fleet, idx, cycle_eligible(req, fleet, idx, ctx))
        limits = limits_of(ctx)
        shape = (req.count, req.milli, req.memory_bytes, req.models, req.max_temperature, limits)
        memo = fleet.derive(self._rows_key, lambda _: RowMemo(), shape)
        (raw,) = memo.values(fleet, ctx, lambda f, rows: (self._rows(req, f, rows, limits, ctx),))
        return np.asarray(raw[idx], dtype=np.float64)

    def _rows(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, limits: GpuLimits, ctx: CycleContext) -> FloatA:
        """The raw score of ``rows`` for the row memo: every row from the cycle's mask (shared with the fit filter),
        a few from their own."""
        if rows.size == fleet.n_nodes:
            return self._raw(req, fleet, rows, cycle_eligible(req, fleet, rows, ctx))
        return self._raw(req, fleet, rows, eligible_gpus(req, fleet, rows, limits))

    def _raw(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, elig: BoolA) -> FloatA:
        """The raw score of the ``idx`` rows of a pod wanting GPUs, ``elig`` the GPUs it could get there."""
        q_all, node_min_all = fleet.derive(self._quality_key, self._quality_of)
        node_min = node_min_all[idx]
        q = q_all[idx]
        present = fleet.gpu_present[idx]
        k = max(1, req.count)
        # a node without enough usable GPUs (only when scored unfiltered) is judged on all of its GPUs
        elig = np.where((elig.sum(axis=1) >= k)[:, None], elig, present)
        if k == 1:  # the best usable GPU
            best1 = np.fmax.reduce(np.where(elig, q, -np.inf), axis=1)  # NaN quality is skipped, as by the sort
            pod_part = np.where(np.isfinite(best1), best1, np.nan)
        else:
            best = -np.sort(-np.where(elig, q, -np.inf), axis=1)[:, :k]
            pod_part = np.where(
                np.isfinite(best).all(axis=1), np.where(np.isfinite(best), best, 0).mean(axis=1), np.nan
            )
        share = self.args.node_share
        return np.asarray((1 - share) * pod_part + share * node_min, dtype=np.float64)

    def normalize(self, raw: FloatA) -> FloatA:
        return unit(raw)

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> list[str]:
        idx = np.array([row], dtype=np.int64)
        q = gpu_quality(fleet, idx, self.args)[0]
        loaded = loaded_temp(fleet, idx, self.args)[0]
        h = self.args.horizon_seconds
        lines = []
        for j in range(fleet.max_gpus):
            if not fleet.gpu_present[row, j]:
                continue
            t, tr, s = float(fleet.temp[row, j]), float(fleet.trend[row, j]), float(fleet.slowdown[row, j])
            if headroom_c(t, s) <= self.args.trend_from_headroom:
                pred = max(t, predicted_temp(t, tr, h))
                ahead = f"trend {tr:+.1f} °C/min -> {pred:.1f} °C in {h / 60:g} min"
            else:
                pred = t
                ahead = f"trend {tr:+.1f} °C/min not judged (cool)"
            line = (
                f"gpu {int(fleet.gpu_index[row, j])}: {t:.1f} °C, {ahead}; "
                f"{versus_slowdown(headroom_c(pred, s))} {s:.0f} °C; quality {q[j]:.2f}"
            )
            if np.isfinite(loaded[j]):
                where = cooling_provenance(
                    int(fleet.cooling_samples[row, j]), float(fleet.cooling_since[row, j]), ctx.now
                )
                line += (
                    f"; under load {loaded[j]:.1f} °C (cooling {fleet.thermal_resistance[row, j]:.3f} °C/W {where}, "
                    f"{versus_slowdown(headroom_c(float(loaded[j]), s))})"
                )
            thr = int(fleet.throttle[row, j]) & SLOWDOWN_MASK
            if thr:
                line += f"; clocks slowed ({', '.join(throttle_reason_names(thr))}, at {fleet.clock_ratio[row, j]:.0%})"
            lines.append(line)
        return lines
