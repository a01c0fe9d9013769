"""What "hot" means for a GPU node, shared by the extender (do not fill it) and the operator (drain it).

A node **enters** hot when any GPU
- reaches ``hot_celsius``, or
- has thermal throttling active (NVML SW/HW thermal slowdown bits), or
- is predicted by its temperature trend to reach its slowdown temperature (less ``slowdown_margin_celsius``) within
  ``horizon_s`` (judged only from ``predict_min_celsius``, by default ``cool_celsius``: a GPU that just got a job rises
  fast from idle, and a straight line through that start would overshoot where it settles).

It **leaves** hot only after every GPU has stayed below ``cool_celsius`` (with no throttling and no alarming trend)
for ``hold_s`` seconds. The gap between the two thresholds and the hold time are the hysteresis that keeps a node
from flapping between hot and cool around one temperature.

Everything here is pure: ``step(state, observation, now) -> (new state, transition)``. No I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .model.gpu import THERMAL_THROTTLE_MASK, GpuInfo, GpuNode, throttle_reason_names
from .model.snapshot import BoolA, FleetArrays

DEFAULT_HOT_CELSIUS = 83.0
DEFAULT_COOL_CELSIUS = 75.0
DEFAULT_HOLD_S = 300.0
DEFAULT_HORIZON_S = 300.0
DEFAULT_SLOWDOWN_MARGIN_CELSIUS = 2.0
DEFAULT_MIN_TREND_C_PER_MIN = 0.5


class HotnessConfig(BaseModel):
    """Thresholds of the hot-node state machine (the ``hotness:`` section of the policy file)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    hot_celsius: float = Field(DEFAULT_HOT_CELSIUS, gt=0, le=150, description="a GPU at or above this is hot")
    cool_celsius: float = Field(DEFAULT_COOL_CELSIUS, gt=0, le=150, description="every GPU below this to cool down")
    hold_s: float = Field(DEFAULT_HOLD_S, ge=0, description="seconds below cool_celsius before leaving hot")
    horizon_s: float = Field(DEFAULT_HORIZON_S, ge=0, description="how far ahead the trend prediction looks")
    slowdown_margin_celsius: float = Field(
        DEFAULT_SLOWDOWN_MARGIN_CELSIUS, ge=0, description="predict hot when the trend reaches slowdown minus this"
    )
    min_trend_c_per_min: float = Field(
        DEFAULT_MIN_TREND_C_PER_MIN, ge=0, description="rises slower than this never predict hot (noise)"
    )
    throttling_is_hot: bool = Field(True, description="thermal throttling alone makes a node hot")
    predict_min_celsius: float | None = Field(
        None,
        gt=0,
        le=150,
        description="only GPUs at least this warm are judged by their trend (default: cool_celsius); a GPU that "
        "just got a job rises fast from idle, and a straight line through that start overshoots its steady state",
    )

    @property
    def predict_from_celsius(self) -> float:
        return self.cool_celsius if self.predict_min_celsius is None else self.predict_min_celsius

    @model_validator(mode="after")
    def _ordered(self) -> HotnessConfig:
        if self.cool_celsius >= self.hot_celsius:
            raise ValueError(
                f"coolCelsius ({self.cool_celsius}) must be below hotCelsius ({self.hot_celsius}): "
                "the gap between them is the hysteresis"
            )
        return self


class Transition(StrEnum):
    ENTERED = "entered"
    LEFT = "left"


@dataclass(frozen=True, slots=True)
class GpuHeat:
    """Why one GPU counts as hot (``reasons`` empty: it does not)."""

    index: int
    temperature_celsius: float
    reasons: tuple[str, ...]
    warm: bool
    """At or above ``cool_celsius`` (or throttling): keeps a hot node hot and its pods candidates for eviction."""


@dataclass(frozen=True, slots=True)
class Observation:
    """What one telemetry reading says about a node's heat."""

    gpus: tuple[GpuHeat, ...]

    @property
    def triggered(self) -> bool:
        return any(g.reasons for g in self.gpus)

    @property
    def warm(self) -> bool:
        return any(g.warm for g in self.gpus)

    @property
    def warm_gpus(self) -> tuple[int, ...]:
        """GPUs whose pods should move off a hot node: triggering ones and those still at or above cool_celsius."""
        return tuple(g.index for g in self.gpus if g.warm or g.reasons)

    def reason(self) -> str:
        parts = [f"gpu {g.index}: {'; '.join(g.reasons)}" for g in self.gpus if g.reasons]
        return ", ".join(parts) if parts else "all GPUs below the hot threshold"


@dataclass(frozen=True, slots=True)
class NodeHotness:
    """The state of one node. ``cool_since`` is when every GPU last went below ``cool_celsius`` (while hot)."""

    hot: bool = False
    since: float | None = None
    cool_since: float | None = None
    reason: str = ""


def predicted_minutes_to_slowdown(gpu: GpuInfo, cfg: HotnessConfig) -> float | None:
    """Minutes until the trend reaches the slowdown threshold (minus margin); ``None`` when it is not rising."""
    trend = gpu.temperature_trend_c_per_min
    if trend < cfg.min_trend_c_per_min or trend <= 0:
        return None
    target = gpu.slowdown_celsius - cfg.slowdown_margin_celsius
    return max(0.0, (target - gpu.temperature_celsius) / trend)


def gpu_heat(gpu: GpuInfo, cfg: HotnessConfig) -> GpuHeat:
    reasons: list[str] = []
    t = gpu.temperature_celsius
    if t >= cfg.hot_celsius:
        reasons.append(f"{t:.1f} °C >= hot threshold {cfg.hot_celsius:g} °C")
    if cfg.throttling_is_hot and gpu.thermally_throttled:
        names = ",".join(n for n in throttle_reason_names(gpu.throttle_reasons) if "thermal" in n)
        reasons.append(f"thermal throttling active ({names})")
    minutes = predicted_minutes_to_slowdown(gpu, cfg)
    if minutes is not None and minutes * 60.0 <= cfg.horizon_s and cfg.predict_from_celsius <= t < cfg.hot_celsius:
        reasons.append(
            f"trend {gpu.temperature_trend_c_per_min:+.1f} °C/min reaches slowdown "
            f"{gpu.slowdown_celsius:g} °C in {minutes:.1f} min"
        )
    warm = t >= cfg.cool_celsius or gpu.thermally_throttled
    return GpuHeat(index=gpu.index, temperature_celsius=t, reasons=tuple(reasons), warm=warm)


def observe(node: GpuNode, cfg: HotnessConfig) -> Observation:
    return Observation(gpus=tuple(gpu_heat(g, cfg) for g in node.gpus))


def step(
    state: NodeHotness, obs: Observation | None, now: float, cfg: HotnessConfig
) -> tuple[NodeHotness, Transition | None]:
    """Advance one node's state. ``obs=None`` (no fresh telemetry) keeps the state unchanged: absence of data is not
    evidence of cooling, nor of heat."""
    if obs is None:
        return state, None
    if not state.hot:
        if obs.triggered:
            return NodeHotness(hot=True, since=now, cool_since=None, reason=obs.reason()), Transition.ENTERED
        return state, None
    # hot: any trigger or any warm GPU resets the cool-down clock
    if obs.triggered or obs.warm:
        reason = obs.reason() if obs.triggered else state.reason
        return replace(state, cool_since=None, reason=reason), None
    cool_since = state.cool_since if state.cool_since is not None else now
    if now - cool_since >= cfg.hold_s:
        return (
            NodeHotness(
                hot=False,
                since=None,
                cool_since=None,
                reason=f"below {cfg.cool_celsius:g} °C for {now - cool_since:.0f} s",
            ),
            Transition.LEFT,
        )
    return replace(state, cool_since=cool_since), None


def trigger_mask(arrays: FleetArrays, cfg: HotnessConfig) -> BoolA:
    """Vectorised entry rule over a fleet, shape (N, G): the GPUs that would make their node enter hot.

    Same rule as :func:`gpu_heat` (``reasons`` non-empty); the extender uses it to keep pods off nodes about to be
    drained. Padding slots are ``False``.
    """
    hot = arrays.temp >= cfg.hot_celsius
    if cfg.throttling_is_hot:
        hot |= (arrays.throttle & THERMAL_THROTTLE_MASK) != 0
    trend = arrays.trend
    rising = (trend >= cfg.min_trend_c_per_min) & (trend > 0) & (arrays.temp >= cfg.predict_from_celsius)
    target = arrays.slowdown - cfg.slowdown_margin_celsius
    with np.errstate(divide="ignore", invalid="ignore"):
        minutes = np.where(rising, np.maximum(0.0, (target - arrays.temp) / np.where(rising, trend, 1.0)), np.inf)
    hot |= minutes * 60.0 <= cfg.horizon_s
    return np.asarray(hot & arrays.gpu_present, dtype=np.bool_)
