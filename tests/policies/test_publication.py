"""The learned workload published in steps (policies/fragmentation/publication.py): the same object while the
learned mix stays within ``republishDrift`` of the published one, a new one once it moved past it."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_plugin.model import GpuRequest
from scheduler_plugin.policies import fragmentation
from scheduler_plugin.policies.base import CycleContext
from scheduler_plugin.policies.fragmentation import FragmentationPolicy, PodShape, WorkloadEstimator
from scheduler_plugin.policies.fragmentation.publication import PublishedWorkload, weight_distance
from scheduler_plugin.policies.plugins import PRODUCTION
from scheduler_plugin.policies.registry import PolicyConfigError

ONE = GpuRequest(count=1, cpu_milli=4000)
HALF = GpuRequest(count=1, milli=500, cpu_milli=2000)
TWO = GpuRequest(count=2, cpu_milli=8000)


def feed(est: WorkloadEstimator | FragmentationPolicy, reqs: list[GpuRequest], tag: str) -> None:
    for i, r in enumerate(reqs):
        est.observe(GpuRequest(count=r.count, milli=r.milli, cpu_milli=r.cpu_milli, pod_key=f"ns/{tag}{i}"))


def test_weight_distance_is_the_l1_of_the_normalised_weights() -> None:
    a, b, c = (PodShape(1000, 1000, 1, None), PodShape(500, 500, 1, None), PodShape(0, 0, 0, None))
    assert weight_distance({a: 3.0, b: 1.0}, {a: 0.75, b: 0.25}) == 0.0
    assert weight_distance({a: 1.0, b: 1.0}, {a: 0.75, b: 0.25}) == pytest.approx(0.5)
    assert weight_distance({a: 1.0}, {b: 1.0}) == 2.0  # disjoint mixes: the largest distance
    assert weight_distance({a: 1.0, c: 1.0}, {a: 1.0}) == pytest.approx(1.0)  # a new shape counts whole
    assert weight_distance({}, {a: 1.0}) == 2.0


def test_a_stationary_mix_keeps_the_published_object_and_a_moved_one_gets_a_new_one() -> None:
    est = WorkloadEstimator(prior_weight=0.0, coverage=1.0)
    pub = PublishedWorkload(est, drift=0.05)
    feed(est, [ONE, HALF] * 150, "a")
    first = pub.workload()
    assert first is est.workload()
    feed(est, [ONE, HALF] * 100, "b")  # the same mix: the estimator's workload is new, the published one is not
    assert est.workload() is not first
    assert pub.workload() is first and pub.republished == 1
    # 2-GPU pods: 500 pods seen, k new ones move the mix by 2k / (500 + k): past 0.05 at the 13th
    feed(est, [TWO] * 12, "c")
    assert pub.workload() is first and 2 not in first.count.tolist()
    feed(est, [TWO], "d")
    now = pub.workload()
    assert now is not first and now is est.workload() and 2 in now.count.tolist() and pub.republished == 2
    assert pub.workload() is now  # nothing observed since: O(1), the same object


def test_the_estimator_forgetting_republishes_at_once() -> None:
    """A drift the estimator's test finds is a new mix, however small the L1 so far."""
    est = WorkloadEstimator()  # the default mix at 200 pseudo-pods, tested after the first 25 pods
    pub = PublishedWorkload(est, drift=2.0)  # the L1 alone would never republish
    first = pub.workload()
    feed(est, [TWO] * 25, "a")
    assert est.drifts == 1
    assert pub.workload() is not first and pub.republished == 2


def test_republish_drift_zero_follows_every_pod_and_bad_values_name_the_field() -> None:
    policy = FragmentationPolicy.create(fragmentation.FragmentationArgs(republish_drift=0))
    seen = []
    for i in range(3):
        feed(policy, [ONE, TWO][i % 2 :][:1], f"p{i}")
        seen.append(policy.workload(CycleContext(now=0.0)))
    assert len({id(w) for w in seen}) == 3
    with pytest.raises(PolicyConfigError, match=r"policies\.fragmentation\.republishDrift"):
        PRODUCTION.build("score", "fragmentation", {"republishDrift": 3}, "policies.fragmentation")
    with pytest.raises(ValueError, match="republish_drift"):
        PublishedWorkload(WorkloadEstimator(), drift=-1)


def test_the_plugin_scores_against_the_published_workload() -> None:
    """What the plugin scores against stays the same object across pods of an unchanged mix (on main it was the
    estimator's, new after every pod), so every per-workload memo keeps serving it."""
    policy = FragmentationPolicy.create(fragmentation.FragmentationArgs(prior_weight=0))
    feed(policy, [ONE, HALF] * 100, "a")
    first = policy.workload(CycleContext(now=0.0))
    feed(policy, [ONE, HALF] * 5, "b")
    assert policy.workload(CycleContext(now=0.0)) is first
    assert np.isclose(first.prob.sum(), 1.0)
