"""Cooling quality learned from telemetry: each GPU's thermal resistance, degrees Celsius above idle per added watt.

A GPU in a poorly cooled chassis (a clogged filter, a failed fan, a hot aisle) looks like any other while it idles: a
degree or two warmer, well inside the inlet drift between racks. Under load it settles much hotter. What tells it
apart is how far its temperature rises per watt it draws, which is what a datasheet's thermal resistance describes::

    r = (temp - idle temp) / (power - idle power)        # measured only once the temperature has settled

:class:`CoolingEstimator` learns ``r`` per GPU from successive fleet readings, in the background (the snapshot cache
calls it once per refresh; the thermal scenario once per step), never on the request path:

* while a GPU idles with a settled temperature, its idle temperature and idle power are followed (EWMA): the baseline
  that the rise under load is measured from, so inlet drift between racks cancels out;
* while it carries load (``minAddedWatts`` above its idle power) with a settled temperature (trend within
  ``settled_c_per_min``: right after a load step the temperature is still climbing and the ratio would read low),
  each reading is one sample of ``r``, averaged with an EWMA;
* while it idles again, the learned ``r`` is kept: cooling quality belongs to the chassis, not to the job.

A GPU never seen idle measures from its node's idle GPUs, else from the fleet's typical idle GPU of its model. A GPU
never seen loaded gets a cautious prior: the ``prior_percentile`` (default 100: the worst) of the ``r`` learned so
far for its model, so it counts as one of the worse-cooled until it has shown otherwise. (With the median as prior,
a badly cooled node that has not yet run a job looks as good as the best, and a scheduler that packs fills it with an
8-GPU job; with the cautious prior, unknown nodes are used once the known good ones are full, and learned then.)
Without any learned GPU of its model, or without power readings, the estimate is NaN and the thermal policy falls
back to the temperature alone. Per GPU it also counts the readings ``r`` was learned from and when the first was
(``FleetArrays.cooling_samples`` / ``cooling_since``), so that ``kelvin explain`` can say whether a figure is learned
or the assumed prior.

Pure numpy over the (nodes x GPU slots) arrays of :class:`~scheduler_plugin.model.FleetArrays`; rows are matched to
the previous reading by node name and GPU index, so nodes may come and go.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import numpy.typing as npt

from ..model import FleetArrays

FloatA = npt.NDArray[np.float64]
BoolA = npt.NDArray[np.bool_]


def _per_model(values: FloatA, model_id: npt.NDArray[np.int32], percentile: float = 50.0) -> FloatA:
    """(N, G): the ``percentile`` of the finite ``values`` of each GPU's model (NaN where a model has none)."""
    out = np.full(values.shape, np.nan)
    for m in np.unique(model_id[model_id >= 0]):
        mask = model_id == m
        known = values[mask & np.isfinite(values)]
        if known.size:
            out[mask] = float(np.percentile(known, percentile))
    return out


def _ewma(old: FloatA, sample: FloatA, alpha: float, where: BoolA) -> FloatA:
    """``old`` moved ``alpha`` of the way to ``sample`` where ``where`` (the sample itself where ``old`` is NaN)."""
    moved = np.where(np.isnan(old), sample, old + alpha * (sample - old))
    return np.where(where, moved, old)


class CoolingEstimator:
    """Per-GPU thermal resistance (°C per watt above idle), learned across successive readings of a fleet."""

    def __init__(
        self,
        *,
        alpha: float = 0.2,
        idle_below_util: float = 0.05,
        settled_c_per_min: float = 1.5,
        min_added_watts: float = 100.0,
        max_c_per_w: float = 1.0,
        prior_percentile: float = 100.0,
    ) -> None:
        for name, v in (("alpha", alpha), ("settled_c_per_min", settled_c_per_min)):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        if not 0 <= prior_percentile <= 100:
            raise ValueError(f"prior_percentile must be within 0..100, got {prior_percentile!r}")
        if not min_added_watts > 0:
            raise ValueError(f"min_added_watts must be > 0, got {min_added_watts!r}")
        self.alpha = alpha
        self.idle_below_util = idle_below_util
        self.settled_c_per_min = settled_c_per_min
        self.min_added_watts = min_added_watts
        self.max_c_per_w = max_c_per_w
        self.prior_percentile = prior_percentile
        self._names: tuple[str, ...] = ()
        self._gpu_index: npt.NDArray[np.int32] = np.zeros((0, 0), dtype=np.int32)
        self._idle_temp: FloatA = np.zeros((0, 0))
        self._idle_power: FloatA = np.zeros((0, 0))
        self._r: FloatA = np.zeros((0, 0))
        self._samples: FloatA = np.zeros((0, 0))
        self._since: FloatA = np.zeros((0, 0))

    def _aligned(self, fleet: FleetArrays) -> tuple[FloatA, ...]:
        """The kept state (idle temperature, idle power, ``r``, samples of ``r``, time of the first sample) laid out
        on ``fleet``'s rows and slots (NaN for GPUs not seen before)."""
        kept = (self._idle_temp, self._idle_power, self._r, self._samples, self._since)
        shape = fleet.gpu_present.shape
        if self._names == fleet.names and self._r.shape == shape and np.array_equal(self._gpu_index, fleet.gpu_index):
            return kept
        out = tuple(np.full(shape, np.nan) for _ in kept)
        old_rows = np.array([{n: i for i, n in enumerate(self._names)}.get(n, -1) for n in fleet.names], dtype=np.int64)
        g = min(shape[1], self._r.shape[1]) if self._r.size else 0
        if g and (old_rows >= 0).any():
            new_rows = np.nonzero(old_rows >= 0)[0]
            src = old_rows[new_rows]
            same = (self._gpu_index[src, :g] == fleet.gpu_index[new_rows, :g]) & (fleet.gpu_index[new_rows, :g] >= 0)
            for dst, old in zip(out, kept, strict=True):
                dst[new_rows, :g] = np.where(same, old[src, :g], np.nan)
        return out

    def update(self, fleet: FleetArrays) -> FloatA:
        """Learn from one reading; return the (N, G) estimate, NaN where unknown (and for padding)."""
        idle_temp, idle_power, r, samples, since = self._aligned(fleet)
        present = fleet.gpu_present
        temp, power = fleet.temp, fleet.power
        valid = present & np.isfinite(power) & np.isfinite(temp)
        settled = np.abs(fleet.trend) <= self.settled_c_per_min
        idle = valid & settled & (fleet.util < self.idle_below_util)
        idle_temp = _ewma(idle_temp, temp, self.alpha, idle)
        idle_power = _ewma(idle_power, power, self.alpha, idle)
        with warnings.catch_warnings():  # nodes without an idle GPU yet are expected (all-NaN rows)
            warnings.simplefilter("ignore", RuntimeWarning)
            node_temp = np.nanmedian(np.where(present, idle_temp, np.nan), axis=1, keepdims=True)
            node_power = np.nanmedian(np.where(present, idle_power, np.nan), axis=1, keepdims=True)
        base_temp = np.where(np.isnan(idle_temp), node_temp, idle_temp)
        base_power = np.where(np.isnan(idle_power), node_power, idle_power)
        base_temp = np.where(np.isnan(base_temp), _per_model(idle_temp, fleet.model_id), base_temp)
        base_power = np.where(np.isnan(base_power), _per_model(idle_power, fleet.model_id), base_power)
        added = power - base_power
        loaded = valid & settled & np.isfinite(base_temp) & (added >= self.min_added_watts)
        with np.errstate(all="ignore"):
            sample = np.clip((temp - base_temp) / added, 0.0, self.max_c_per_w)
        r = _ewma(r, sample, self.alpha, loaded)
        samples = np.where(loaded, np.nan_to_num(samples) + 1, samples)
        since = np.where(loaded & np.isnan(since), fleet.observed_at[:, None], since)
        self._names, self._gpu_index = fleet.names, fleet.gpu_index.copy()
        self._idle_temp, self._idle_power, self._r = idle_temp, idle_power, r
        self._samples, self._since = samples, since
        prior = _per_model(np.where(present, r, np.nan), fleet.model_id, self.prior_percentile)
        est = np.where(np.isnan(r), prior, r)
        return np.asarray(np.where(present, est, np.nan), dtype=np.float64)

    def provenance(self, fleet: FleetArrays) -> tuple[npt.NDArray[np.int32], FloatA]:
        """(N, G) how many readings the estimate of each GPU of ``fleet`` (the one last passed to :meth:`update`) was
        learned from (0: not learned, the estimate is the prior or unknown) and when the first was (``observed_at``
        of its node; NaN when not learned)."""
        _, _, _, samples, since = self._aligned(fleet)
        present = fleet.gpu_present
        n = np.where(present, np.nan_to_num(samples), 0).astype(np.int32)
        return n, np.where(present & (n > 0), since, np.nan)

    def fill(self, fleet: FleetArrays) -> None:
        """Learn from ``fleet`` and write the estimate into its ``thermal_resistance`` column where the source did
        not report one, and where it comes from into ``cooling_samples`` (readings it was learned from; 0 for the
        assumed prior, -1 where the source reported it) and ``cooling_since``. Call it while building the arrays,
        before anyone reads them."""
        est = self.update(fleet)
        reported = np.isfinite(fleet.thermal_resistance)
        samples, since = self.provenance(fleet)
        fleet.thermal_resistance = np.where(reported, fleet.thermal_resistance, est)
        fleet.cooling_samples = np.where(reported, -1, samples).astype(np.int32)
        fleet.cooling_since = np.where(reported, np.nan, since)
