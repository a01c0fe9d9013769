"""The learned workload, published in steps: the same :class:`Workload` object until the learned mix has moved.

Every per-workload memo of the fragmentation policies (the per-node scores, F per node and after a placement, the
usable capacity of live scarcity, the shape groups, the priced workload, the packing plan) keys on the workload's
identity. The estimator's histogram moves with every pod, and a workload rebuilt from it after every pod would make
each of them compute the whole fleet afresh on every request. The scores only need the mix to within its own noise:
so the policies score against a *published* workload, which is rebuilt only when the learned mix has moved
materially from the one it was published from:

* the L1 distance between the normalised shape weights of the histogram now and at publication exceeds
  ``republishDrift`` (a new shape counts with its whole weight; early on, when every pod moves the mix by about
  2 / pods seen, this republishes every few pods; in a stationary mix of thousands of pods, every few hundred);
* or the estimator's drift test has forgotten older pods since (:attr:`WorkloadEstimator.drifts`).

What the published workload lags the learned one by is at most ``republishDrift`` in L1 of the shape weights. A
shape's mean host memory is the one at publication (it moves with the shape's pods, which the L1 counts).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from .workload import PodShape, Workload, WorkloadEstimator

DEFAULT_REPUBLISH_DRIFT = 0.05


def weight_distance(weights: Mapping[PodShape, float], basis: Mapping[PodShape, float]) -> float:
    """L1 distance between ``weights`` normalised to sum 1 and ``basis`` (already normalised); a shape missing from
    either side counts with its whole share. 2.0 (the largest) when ``weights`` is empty."""
    total = sum(weights.values())
    if total <= 0:
        return 2.0
    scale = 1.0 / total
    dist = sum(abs(v * scale - basis.get(s, 0.0)) for s, v in weights.items())
    return dist + sum(p for s, p in basis.items() if s not in weights)


class PublishedWorkload:
    """The workload of one estimator the policies score against: :meth:`workload` returns the same object until the
    estimator's mix has moved by more than ``drift`` (L1 of the normalised shape weights) from the one it was built
    from, or the estimator has forgotten (a drift its test found). Checks only when the estimator has seen a pod
    since the last call (O(shapes) then; O(1) otherwise)."""

    __slots__ = ("_basis", "_drift", "_drifts", "_estimator", "_lock", "_observed", "_published", "republished")

    def __init__(self, estimator: WorkloadEstimator, drift: float = DEFAULT_REPUBLISH_DRIFT) -> None:
        if not 0 <= drift <= 2:
            raise ValueError(f"republish_drift: must be between 0 and 2, got {drift}")
        self._estimator = estimator
        self._drift = drift
        self._published: Workload | None = None
        self._basis: dict[PodShape, float] = {}
        self._observed = -1
        self._drifts = -1
        self._lock = threading.Lock()
        self.republished = 0
        """How many workloads have been published (the first one included)."""

    @property
    def estimator(self) -> WorkloadEstimator:
        return self._estimator

    def workload(self) -> Workload:
        """The published workload: the estimator's own (:meth:`WorkloadEstimator.workload`) as of the last time its
        mix had moved by more than ``drift``."""
        est = self._estimator
        with self._lock:
            w = self._published
            if w is not None and est.observed == self._observed:
                return w
            weights = est.weights()
            if w is None or est.drifts != self._drifts or weight_distance(weights, self._basis) > self._drift:
                w = self._published = est.workload()
                total = sum(weights.values())
                self._basis = {s: v / total for s, v in weights.items()} if total > 0 else {}
                self._drifts = est.drifts
                self.republished += 1
            self._observed = est.observed
            return w


__all__ = ["DEFAULT_REPUBLISH_DRIFT", "PublishedWorkload", "weight_distance"]
