"""The per-GPU temperature trend, in °C per minute, from the snapshots a :class:`TemperatureTrend` has seen.

Each snapshot's temperatures are kept (at most :data:`MAX_SAMPLES`, none older than ``window_s``); a new snapshot's
trend is its temperatures against the oldest kept sample no older than ``window_s`` and at least ``min_apart_s``
before it, GPU slot by GPU slot (a slot whose GPU index changed, or a node the sample did not have, gets 0).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..model import FleetArrays

FloatA = npt.NDArray[np.float64]

#: Seconds of samples a trend is computed over (the oldest kept sample within this window is the base).
DEFAULT_TREND_WINDOW_S = 300.0
#: Least seconds between a sample and the snapshot it is a base for (shorter spans are noise).
DEFAULT_MIN_TREND_S = 10.0
#: Samples kept at most, whatever the window.
MAX_SAMPLES = 256


@dataclass(frozen=True, slots=True)
class _Sample:
    taken_at: float
    names: tuple[str, ...]
    index: dict[str, int]
    temp: FloatA
    gpu_index: npt.NDArray[np.int32]


class TemperatureTrend:
    """Remembers snapshots' temperatures and fills in each new snapshot's trend (:meth:`fill`)."""

    def __init__(self, window_s: float = DEFAULT_TREND_WINDOW_S, min_apart_s: float = DEFAULT_MIN_TREND_S) -> None:
        if not window_s > 0:
            raise ValueError(f"trend_window_s must be > 0, got {window_s!r}")
        if not 0 <= min_apart_s <= window_s:
            raise ValueError(f"min_trend_s must lie in 0..trend_window_s ({window_s:g}), got {min_apart_s!r}")
        self.window_s = window_s
        self.min_apart_s = min_apart_s
        self._history: deque[_Sample] = deque(maxlen=MAX_SAMPLES)

    def fill(self, a: FleetArrays, now: float) -> None:
        """Fill ``a.trend`` (of a snapshot not yet published) where the source reported none (0), and keep ``a``'s
        temperatures as a sample for later snapshots."""
        sample = _Sample(now, a.names, a.index, a.temp.copy(), a.gpu_index.copy())
        trend = self._against_history(sample)
        if trend is not None:
            a.trend[...] = np.where(a.trend != 0.0, a.trend, trend)
        if a.names:  # an empty snapshot is no base for a trend (a fresh install's first refreshes have no nodes)
            self._history.append(sample)
        while self._history and now - self._history[0].taken_at > self.window_s:
            self._history.popleft()

    def _against_history(self, cur: _Sample) -> FloatA | None:
        base = next((s for s in self._history if cur.taken_at - s.taken_at <= self.window_s), None)
        if base is None or cur.taken_at - base.taken_at < self.min_apart_s:
            return None
        minutes = (cur.taken_at - base.taken_at) / 60.0
        if not cur.names:
            return None
        if base.names == cur.names:
            prev_temp, prev_idx = base.temp, base.gpu_index
            known = np.ones(len(cur.names), dtype=np.bool_)
        else:
            rows = np.array([base.index.get(n, -1) for n in cur.names], dtype=np.int64)
            known = rows >= 0
            rows = np.where(known, rows, 0)
            prev_temp, prev_idx = base.temp[rows], base.gpu_index[rows]
        g = min(cur.temp.shape[1], prev_temp.shape[1])
        out = np.zeros_like(cur.temp)
        same = known[:, None] & (prev_idx[:, :g] == cur.gpu_index[:, :g]) & (cur.gpu_index[:, :g] >= 0)
        out[:, :g] = np.where(same, (cur.temp[:, :g] - prev_temp[:, :g]) / minutes, 0.0)
        return out
