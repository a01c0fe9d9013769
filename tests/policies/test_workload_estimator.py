"""The learned workload (``WorkloadEstimator``): it keeps a mix that does not change and forgets one that does."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_plugin.model import GpuRequest
from scheduler_plugin.policies.fragmentation import PodShape, WorkloadEstimator, drift_pvalue
from scheduler_plugin.policies.plugins import PRODUCTION
from scheduler_plugin.policies.registry import PolicyConfigError

SHARES = (100, 200, 300, 500, 700, 1000)
MIX = (0.30, 0.25, 0.20, 0.12, 0.08, 0.05)


def share_pod(milli: int, key: str) -> GpuRequest:
    return GpuRequest(count=1, milli=milli, cpu_milli=2000, pod_key=key) if milli < 1000 else whole_pod(key)


def whole_pod(key: str) -> GpuRequest:
    return GpuRequest(count=1, cpu_milli=2000, pod_key=key)


def stream(n: int, seed: int) -> list[GpuRequest]:
    picks = np.random.default_rng(seed).choice(len(SHARES), size=n, p=MIX)
    return [share_pod(SHARES[k], f"ns/p{seed}-{i}") for i, k in enumerate(picks)]


def learned(est: WorkloadEstimator) -> dict[int, float]:
    return {s.milli: p for s, p in est.workload().shapes()}


def test_a_stationary_mix_is_learned_from_every_pod_not_the_last_few_thousand() -> None:
    """With the mix unchanged, the estimate is every pod's frequency: the tests never find drift, nothing is
    forgotten. The fixed half-life of 2,000 pods it had before weighed the last pods 16x over the first after
    8,000 and learned a noisier mix (about 5,800 pods' worth)."""
    pods = stream(8000, seed=1)
    est = WorkloadEstimator(prior_weight=0.0, coverage=1.0)
    for r in pods:
        est.observe(r)
    assert est.drifts == 0
    counts = np.bincount([SHARES.index(r.milli or 1000) for r in pods], minlength=len(SHARES)) / len(pods)
    got = learned(est)
    assert all(got[m] == pytest.approx(float(c), abs=1e-12) for m, c in zip(SHARES, counts, strict=True))


def test_the_default_mix_is_forgotten_once_pods_contradict_it() -> None:
    """The 200 pseudo-pods of the default mix count as history: a mix that differs from it is a drift, so the
    prior's weight shrinks window by window instead of staying in the estimate for good (a shape of the prior no
    pod has does not keep its share)."""
    est = WorkloadEstimator(drift_window_pods=500)
    prior_share = dict(est.workload().shapes())[PodShape(64000, 1000, 8, None)]
    for r in stream(4000, seed=2):
        est.observe(r)
    assert est.drifts >= 2
    left = dict(est.workload().shapes()).get(PodShape(64000, 1000, 8, None), 0.0)
    assert left < prior_share * 200 / 4200 / 2  # less than half what never forgetting it would leave


def test_the_first_pods_that_contradict_the_default_mix_outweigh_it() -> None:
    """The first window is 25 pods: a default mix they contradict (its 8-GPU pods are 7 % of it, a quarter of it
    multi-GPU) weighs as much as they do from then on, not 200 pods. Kept at 200 pseudo-pods, it made the first
    thousand decisions protect homes for multi-GPU pods the Alibaba trace's M does not have (0 % of its shapes)."""
    est = WorkloadEstimator()
    for r in stream(100, seed=4):
        est.observe(r)
    assert est.drifts >= 1
    multi = sum(p for s, p in est.workload().shapes() if s.gpus >= 2)
    assert multi < 0.25 * 25 / 125 + 1e-9  # the default mix at 25 pseudo-pods among 125 (200 of 300: 0.167)


def test_a_changed_mix_is_tracked_within_a_few_windows() -> None:
    est = WorkloadEstimator(prior_weight=0.0, coverage=1.0, drift_window_pods=500)
    for r in stream(20_000, seed=3):
        est.observe(r)
    assert est.drifts == 0
    for i in range(2500):  # the cluster now runs 2-GPU pods only
        est.observe(GpuRequest(count=2, cpu_milli=8000, pod_key=f"ns/new{i}"))
    assert est.drifts >= 3
    two = dict(est.workload().shapes())[PodShape(8000, 1000, 2, None)]
    assert two > 0.9  # without forgetting: 2,500 / 22,500 = 0.11


def test_a_fixed_half_life_is_still_available() -> None:
    est = WorkloadEstimator(half_life_pods=10, prior_weight=0.0, coverage=1.0)
    for i in range(100):
        est.observe(share_pod(100, f"ns/a{i}"))
    for i in range(100):
        est.observe(share_pod(500, f"ns/b{i}"))
    assert est.drifts == 0 and learned(est)[500] > 0.99


def test_drift_pvalue_tells_the_same_mix_from_another() -> None:
    a = {PodShape(1000, 100 * k, 1, None): float(n) for k, n in enumerate((400, 300, 200, 100), start=1)}
    same = {s: w / 8 for s, w in a.items()}
    other = {s: w / 8 for s, w in zip(a, (20, 30, 50, 400), strict=True)}
    assert drift_pvalue(a, same) > 0.5
    assert drift_pvalue(a, other) < 1e-9
    assert drift_pvalue({}, same) == 1.0 and drift_pvalue(a, {}) == 1.0
    new_shape = {PodShape(1000, 900, 1, None): 50.0}  # a shape the history never saw, and nothing else
    assert drift_pvalue(a, new_shape) < 1e-9


@pytest.mark.parametrize(
    ("arg", "value"),
    [("halfLifePods", 0), ("driftWindowPods", 10), ("driftSignificance", 0), ("driftSignificance", 1.5)],
)
def test_bad_learning_args_name_the_field(arg: str, value: float) -> None:
    with pytest.raises(PolicyConfigError, match=arg):
        PRODUCTION.build("score", "fragmentation", {arg: value}, "scoring.fragmentation.args")


def test_the_estimator_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="drift_window_pods"):
        WorkloadEstimator(drift_window_pods=0)
    with pytest.raises(ValueError, match="drift_significance"):
        WorkloadEstimator(drift_significance=1.0)
    with pytest.raises(ValueError, match="half_life_pods"):
        WorkloadEstimator(half_life_pods=-1.0)
