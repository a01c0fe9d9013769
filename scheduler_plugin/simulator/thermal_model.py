"""A small, pure thermal model of a GPU: temperature follows load and the node's cooling quality.

Physics kept deliberately simple (a first-order RC model, what a GPU datasheet's thermal resistance describes):

* power follows load: ``P = idle_w + (tdp_w - idle_w) * utilisation``;
* the temperature a GPU settles at is ``ambient + drift + P * thermal_resistance / cooling``
  (``cooling`` is 1.0 for a healthy node and lower for poor cooling: a clogged filter, a failed fan, a hot aisle);
* the temperature moves towards that target with a first-order lag of time constant ``tau_s``:
  ``T(t+dt) = target + (T(t) - target) * exp(-dt / tau_s)`` plus Gaussian noise;
* ``drift`` is a slow random walk of the inlet temperature per node (weather, neighbouring racks);
* at or above ``throttle_onset_c`` the GPU sets the SW thermal-slowdown throttle bit (the HW one 60 % of the way on)
  and its SM clock drops linearly to ``min_clock_ratio`` at ``throttle_floor_c``; near the power limit it sets the SW
  power-cap bit. The onset is a real GPU's "max operating temperature" (where NVML's SW thermal slowdown begins), a
  few degrees below NVML's slowdown threshold (HW slowdown): a different figure of the catalogue
  (:class:`~scheduler_plugin.model.catalogue.SimThermal`).

Every function takes floats or numpy arrays (element-wise), so the simulated fleet steps 40,000 GPUs at once and the
trace simulator can step one node. No I/O, no clocks, no global random state: randomness comes from the caller's
``numpy.random.Generator``.

API (everything else is private)::

    params = ThermalParams()                                  # one GPU model's constants (defaults: H100 SXM-like)
    state = ThermalState.initial(n, params, rng=rng)          # n GPUs at idle temperature, zero drift
    state = step(state, util, cooling, dt_s=5.0, params=params, rng=rng)   # advance dt_s seconds
    settle(util, cooling, params, drift_c=0.0)                # equilibrium state at a constant load
    steady_state_c(util, cooling, params, drift_c=0.0)        # open-loop target temperature at this load
    power_w(util, params, ratio=1.0)                           # power draw at this load (and clock ratio)
    clock_ratio(temp_c, params)                                # SM clock share of max at this temperature
    throttle_bits(temp_c, util, params)                        # NVML clocks-event reason bitmask (int64 array)
    sm_clock_mhz(temp_c, util, params)                         # SM clock under that temperature and load
    PROFILES["H100-SXM-80GB"]                                  # params per catalogue model; profile_for(model)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from ..model.catalogue import CATALOGUE, GpuModelSpec, resolve
from ..model.gpu import ThrottleReason

FloatA = npt.NDArray[np.float64]
IntA = npt.NDArray[np.int64]
ArrayLike = float | FloatA


@dataclass(frozen=True, slots=True)
class ThermalParams:
    """Constants of one GPU model in one chassis."""

    ambient_c: float = 28.0
    """Inlet air temperature at cooling quality 1.0."""
    idle_w: float = 70.0
    tdp_w: float = 700.0
    resistance_c_per_w: float = 0.065
    """Temperature rise per watt at cooling 1.0 (700 W -> +45.5 C: a busy H100 SXM settles near 74 C)."""
    tau_s: float = 60.0
    """Thermal time constant: after ``tau_s`` a step in load has moved the temperature 63 % of the way."""
    noise_c: float = 0.4
    """Standard deviation of the per-step measurement/airflow noise."""
    drift_c_per_sqrt_s: float = 0.02
    """Random-walk speed of the inlet drift (Celsius per square-root second)."""
    drift_limit_c: float = 6.0
    """The drift is kept within +- this."""
    throttle_onset_c: float = 87.0
    """The SM clock starts to drop here (see the module docstring)."""
    throttle_floor_c: float = 92.0
    """The SM clock reaches ``min_clock_ratio`` here."""
    max_clock_mhz: float = 1980.0
    min_clock_ratio: float = 0.45
    """SM clock as a share of max when the GPU reaches ``throttle_floor_c`` (linear from the onset)."""
    power_cap_util: float = 0.97
    """Above this utilisation the GPU runs into its power cap."""

    def with_ambient(self, ambient_c: float) -> ThermalParams:
        return replace(self, ambient_c=ambient_c)


def params_for(spec: GpuModelSpec) -> ThermalParams:
    """The thermal constants of a catalogue model (its :class:`~scheduler_plugin.model.catalogue.SimThermal` figures
    and max SM clock). Raises :class:`ValueError` for a model without thermal figures."""
    t = spec.thermal
    if t is None:
        raise ValueError(f"GPU model {spec.key!r} has no thermal figures in the catalogue")
    return ThermalParams(
        idle_w=t.idle_w,
        tdp_w=t.tdp_w,
        resistance_c_per_w=t.resistance_c_per_w,
        throttle_onset_c=t.throttle_onset_c,
        throttle_floor_c=t.throttle_floor_c,
        max_clock_mhz=spec.sm_clock_max_mhz,
    )


#: Catalogue key -> thermal constants, for every catalogue model with thermal figures.
PROFILES: dict[str, ThermalParams] = {
    key: params_for(spec) for key, spec in CATALOGUE.items() if spec.thermal is not None
}


def profile_for(model: str) -> ThermalParams:
    """The profile of a model the catalogue names (key, alias or NVML name). Raises
    :class:`~scheduler_plugin.model.catalogue.UnknownModelError` for another name or one without thermal figures."""
    return PROFILES[resolve(model, simulated=True).key]


def clock_ratio(temp_c: ArrayLike, params: ThermalParams) -> FloatA:
    """SM clock as a share of max at this temperature: 1 below the throttle onset, falling linearly to
    ``min_clock_ratio`` at the floor."""
    t = np.asarray(temp_c, dtype=np.float64)
    span = max(params.throttle_floor_c - params.throttle_onset_c, 1e-6)
    over = np.clip((t - params.throttle_onset_c) / span, 0.0, 1.0)
    return np.asarray(1.0 - over * (1.0 - params.min_clock_ratio), dtype=np.float64)


def power_w(util: ArrayLike, params: ThermalParams, ratio: ArrayLike = 1.0) -> FloatA:
    """Power draw at this load; a throttled GPU (``ratio`` < 1, see :func:`clock_ratio`) draws less."""
    u = np.clip(np.asarray(util, dtype=np.float64), 0.0, 1.0) * np.asarray(ratio, dtype=np.float64)
    return np.asarray(params.idle_w + (params.tdp_w - params.idle_w) * u, dtype=np.float64)


def steady_state_c(
    util: ArrayLike,
    cooling: ArrayLike,
    params: ThermalParams,
    drift_c: ArrayLike = 0.0,
    ratio: ArrayLike = 1.0,
) -> FloatA:
    """The temperature a GPU at clock ``ratio`` heads for under constant load. ``cooling`` > 0; lower is worse.

    With ``ratio`` 1 (no throttling) this is the open-loop target; :func:`step` feeds the throttled clock back, so a
    GPU with poor cooling levels off between the throttle onset and floor instead of running away.
    """
    c = np.clip(np.asarray(cooling, dtype=np.float64), 0.05, None)
    rise = power_w(util, params, ratio) * params.resistance_c_per_w / c
    return np.asarray(params.ambient_c + np.asarray(drift_c, dtype=np.float64) + rise, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class ThermalState:
    """Temperatures and inlet drifts of a set of GPUs (same shape)."""

    temp_c: FloatA
    drift_c: FloatA

    @classmethod
    def initial(
        cls,
        n: int | tuple[int, ...],
        params: ThermalParams,
        *,
        cooling: ArrayLike = 1.0,
        util: ArrayLike = 0.0,
        rng: np.random.Generator | None = None,
    ) -> ThermalState:
        """GPUs already settled at ``util`` (default idle), with a small random inlet offset when ``rng`` is given."""
        shape = (n,) if isinstance(n, int) else n
        drift = np.zeros(shape) if rng is None else rng.normal(0.0, params.drift_limit_c / 4, size=shape)
        drift = np.clip(drift, -params.drift_limit_c, params.drift_limit_c)
        return settle(util, cooling, params, drift.astype(np.float64))


def settle(util: ArrayLike, cooling: ArrayLike, params: ThermalParams, drift_c: ArrayLike = 0.0) -> ThermalState:
    """GPUs that have run at ``util`` long enough to reach equilibrium, throttling included (no noise)."""
    drift = np.asarray(drift_c, dtype=np.float64)
    shape = np.broadcast_shapes(np.shape(util), np.shape(cooling), drift.shape)
    drift = np.broadcast_to(drift, shape).astype(np.float64)
    state = ThermalState(temp_c=steady_state_c(util, cooling, params, drift) * np.ones(shape), drift_c=drift)
    for _ in range(60):  # damped fixed-point iteration: dt = tau moves 63 % of the way each time
        state = step(state, util, cooling, dt_s=params.tau_s, params=params)
    return state


def step(
    state: ThermalState,
    util: ArrayLike,
    cooling: ArrayLike,
    *,
    dt_s: float,
    params: ThermalParams,
    rng: np.random.Generator | None = None,
) -> ThermalState:
    """Advance ``dt_s`` seconds under ``util`` (0..1) and ``cooling``. Without ``rng``: no noise, no drift."""
    if dt_s < 0 or not math.isfinite(dt_s):
        raise ValueError(f"dt_s must be a finite, non-negative number of seconds, not {dt_s!r}")
    drift = state.drift_c
    if rng is not None and dt_s > 0:
        drift = np.clip(
            drift + rng.normal(0.0, params.drift_c_per_sqrt_s * math.sqrt(dt_s), size=drift.shape),
            -params.drift_limit_c,
            params.drift_limit_c,
        )
    target = steady_state_c(util, cooling, params, drift, clock_ratio(state.temp_c, params))
    alpha = math.exp(-dt_s / params.tau_s) if params.tau_s > 0 else 0.0
    temp = target + (state.temp_c - target) * alpha
    if rng is not None and params.noise_c > 0:
        temp = temp + rng.normal(0.0, params.noise_c, size=temp.shape)
    return ThermalState(temp_c=np.asarray(temp, dtype=np.float64), drift_c=np.asarray(drift, dtype=np.float64))


def throttle_bits(temp_c: ArrayLike, util: ArrayLike, params: ThermalParams) -> IntA:
    """NVML clocks-event reasons: idle below 5 % load, thermal slowdown at/above the onset, power cap near TDP."""
    t = np.asarray(temp_c, dtype=np.float64)
    u = np.broadcast_to(np.asarray(util, dtype=np.float64), t.shape)
    bits = np.zeros(t.shape, dtype=np.int64)
    bits |= np.where(u < 0.05, int(ThrottleReason.GPU_IDLE), 0)
    bits |= np.where(t >= params.throttle_onset_c, int(ThrottleReason.SW_THERMAL_SLOWDOWN), 0)
    bits |= np.where(
        t >= params.throttle_onset_c + 0.6 * (params.throttle_floor_c - params.throttle_onset_c),
        int(ThrottleReason.HW_THERMAL_SLOWDOWN),
        0,
    )
    bits |= np.where(u >= params.power_cap_util, int(ThrottleReason.SW_POWER_CAP), 0)
    return bits


def sm_clock_mhz(temp_c: ArrayLike, util: ArrayLike, params: ThermalParams) -> FloatA:
    """SM clock: max under load below the onset, falling linearly to ``min_clock_ratio`` at the floor; low when
    idle."""
    t = np.asarray(temp_c, dtype=np.float64)
    u = np.broadcast_to(np.asarray(util, dtype=np.float64), t.shape)
    ratio = clock_ratio(t, params)
    idle = u < 0.05
    clock = np.where(idle, params.max_clock_mhz * 0.35, params.max_clock_mhz * ratio)
    return np.asarray(clock, dtype=np.float64)
