"""The learned workload's hedge (``Workload.evidence``, ``upper_bound_factors``, ``FragmentationPolicy.hedge``):
kelvin prices each learned shape at the upper confidence bound of its probability, so a rare shape learned from a few
pods is not priced below what it may well be; a workload given (a trace's M) is priced as given."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_plugin.model import GIB, GpuInfo, GpuNode, GpuRequest, build_arrays
from scheduler_plugin.policies import fragmentation
from scheduler_plugin.policies.base import CycleContext
from scheduler_plugin.policies.fragmentation import (
    WORKLOAD_KEY,
    FgdPolicy,
    FragmentationPolicy,
    PodShape,
    Workload,
    WorkloadEstimator,
    upper_bound_factors,
    workload_of,
)
from scheduler_plugin.policies.fragmentation.plugin import SCARCITY_KEY

ONE = PodShape(8000, 1000, 1, None)
FOUR = PodShape(16_000, 1000, 4, None)
EIGHT = PodShape(64_000, 1000, 8, None)


def node(name: str, gpus: int, cpu: int = 128_000) -> GpuNode:
    infos = tuple(GpuInfo(index=j, uuid=f"{name}-{j}", model="G3", memory_total_bytes=32 * GIB) for j in range(gpus))
    return GpuNode(name, infos, cpu_allocatable_milli=cpu, memory_allocatable_bytes=512 * GIB)


def pod(shape: PodShape, key: str) -> GpuRequest:
    return GpuRequest(count=shape.gpus, cpu_milli=shape.cpu_milli, pod_key=key)


def feed(observe: object, counts: dict[PodShape, int]) -> None:
    assert callable(observe)
    for i, (shape, n) in enumerate(counts.items()):
        for j in range(n):
            observe(pod(shape, f"ns/p{i}-{j}"))


def test_the_upper_bound_factor_is_large_for_few_pods_and_fades_with_many() -> None:
    counts = np.array([0.0, 1.0, 2.0, 8.0, 50.0, 1000.0])
    f = upper_bound_factors(counts, 1_000_000.0, 2.0)
    assert f[0] == 1.0  # a shape never seen is not in the workload: nothing to raise
    assert np.all(f[1:] > 1.0)
    assert np.all(np.diff(f[1:]) < 0)  # the more pods, the surer
    assert f[1] > 4.0 and f[-1] < 1.07  # one pod: the bound is several times the estimate; 1,000 pods: ~1 + 2/sqrt(n)
    assert np.all(upper_bound_factors(counts, 1_000_000.0, 0.0) == 1.0)  # z 0: the estimate itself
    # a shape that is (nearly) every pod cannot be more probable than 1
    whole = upper_bound_factors(np.array([100.0]), 100.0, 2.0)
    assert whole[0] == 1.0


def test_the_upper_bound_is_wilsons() -> None:
    """The Wilson score interval's upper end, z standard deviations up, over the estimate."""
    n, total, z = 6.0, 1000.0, 2.0
    p = n / total
    upper = (p + z * z / (2 * total) + z * np.sqrt(p * (1 - p) / total + z * z / (4 * total * total))) / (
        1 + z * z / total
    )
    assert upper_bound_factors(np.array([n]), total, z)[0] == pytest.approx(upper / p, rel=1e-12)


def hedge_of(w: Workload, z: float = 2.0) -> dict[PodShape, float]:
    assert w.evidence is not None
    return dict(zip((s for s, _ in w.shapes()), upper_bound_factors(*w.evidence, z).tolist(), strict=True))


def test_the_learned_workload_carries_its_pods_and_its_hedge_shrinks_as_they_grow() -> None:
    est = WorkloadEstimator(prior_weight=0.0, coverage=1.0)
    feed(est.observe, {ONE: 90, FOUR: 8, EIGHT: 2})
    w = est.workload()
    assert w.evidence is not None
    counts = dict(zip((s for s, _ in w.shapes()), w.evidence[0].tolist(), strict=True))
    assert counts == {ONE: 90.0, FOUR: 8.0, EIGHT: 2.0} and w.evidence[1] == 100.0
    hedge = hedge_of(w)
    assert hedge[EIGHT] > hedge[FOUR] > hedge[ONE] > 1.0
    more = WorkloadEstimator(prior_weight=0.0, coverage=1.0)
    feed(more.observe, {ONE: 900, FOUR: 80, EIGHT: 20})
    hedge10 = hedge_of(more.workload())
    assert hedge10[EIGHT] < hedge[EIGHT] and hedge10[ONE] < hedge[ONE]  # the same mix, ten times the pods


def test_the_prior_is_no_evidence_and_a_decayed_count_is_the_pods_it_weighs() -> None:
    """The default mix is an assumption (``priorWeight`` says how much to trust it), not pods seen: a shape only the
    prior has counts 0 (priced as the mix says), and before the first pod there is no evidence at all (the scenarios
    that never learn, as the thermal one, score the default mix as before)."""
    est = WorkloadEstimator(prior={EIGHT: 1.0, ONE: 1.0}, prior_weight=4.0, coverage=1.0)
    assert est.workload().evidence is None
    feed(est.observe, {ONE: 20})
    w = est.workload()
    assert w.evidence is not None
    counts = dict(zip((s for s, _ in w.shapes()), w.evidence[0].tolist(), strict=True))
    assert counts == {ONE: pytest.approx(20.0), EIGHT: 0.0} and w.evidence[1] == pytest.approx(20.0)
    assert hedge_of(w)[EIGHT] == 1.0
    forgot = WorkloadEstimator(prior={EIGHT: 1.0, ONE: 1.0}, prior_weight=200.0, coverage=1.0)
    feed(forgot.observe, {ONE: 25})  # contradicts the prior: the first drift window scales it down to 25 pseudo-pods
    assert forgot.drifts == 1
    wf = forgot.workload()
    assert wf.evidence is not None
    cf = dict(zip((s for s, _ in wf.shapes()), wf.evidence[0].tolist(), strict=True))
    assert cf == {ONE: pytest.approx(25.0), EIGHT: 0.0} and wf.evidence[1] == pytest.approx(25.0)
    assert sum(forgot.weights().values()) == pytest.approx(50.0)  # 25 pods and what is left of the prior
    decayed = WorkloadEstimator(half_life_pods=10.0, prior_weight=0.0, coverage=1.0)
    feed(decayed.observe, {EIGHT: 10, ONE: 10})  # the 8-GPU pods came first: they weigh half as much as the 1-GPU
    wd = decayed.workload()
    assert wd.evidence is not None
    c = dict(zip((s for s, _ in wd.shapes()), wd.evidence[0].tolist(), strict=True))
    assert c[ONE] == pytest.approx(sum(2 ** (-k / 10) for k in range(10)))  # in pods of the newest pod's weight
    assert c[EIGHT] == pytest.approx(c[ONE] / 2)
    assert hedge_of(wd)[EIGHT] > hedge_of(wd)[ONE]


def test_no_hedge_for_a_given_workload_nor_without_confidence() -> None:
    given = workload_of([pod(ONE, "a"), pod(EIGHT, "b")])
    assert given.evidence is None
    est = WorkloadEstimator(prior_weight=0.0)
    feed(est.observe, {ONE: 10, EIGHT: 1})
    policy = FragmentationPolicy.create(fragmentation.FragmentationArgs(confidence_z=0))
    assert policy.hedge(est.workload()) is None
    assert FragmentationPolicy.create(fragmentation.FragmentationArgs()).hedge(given) is None
    assert est.workload().priced(np.ones(2)).evidence is None  # a priced copy is not hedged twice


def test_bad_confidence_is_refused_by_the_policy_args() -> None:
    with pytest.raises(ValueError, match="confidence"):
        fragmentation.FragmentationArgs.model_validate({"confidenceZ": -0.5})
    assert fragmentation.FragmentationArgs.model_validate({"confidenceZ": 0}).confidence_z == 0.0


def test_kelvin_prices_a_learned_workload_by_scarcity_times_hedge() -> None:
    fleet = build_arrays([node("big", 8), node("four", 4), node("one", 1)])
    policy = FragmentationPolicy.create(fragmentation.FragmentationArgs(prior_weight=0, coverage=1.0))
    feed(policy.observe, {ONE: 90, FOUR: 8, EIGHT: 2})
    w = policy.published.workload()
    hedge = policy.hedge(w)
    assert hedge is not None
    ctx = CycleContext(now=0.0)
    policy.score(pod(ONE, "ns/x"), fleet, np.arange(fleet.n_nodes), ctx)
    _, base, priced = ctx.state.read(SCARCITY_KEY)
    assert base is w
    unhedged = FragmentationPolicy.create(fragmentation.FragmentationArgs(prior_weight=0, coverage=1.0, confidence_z=0))
    feed(unhedged.observe, {ONE: 90, FOUR: 8, EIGHT: 2})
    ctx0 = CycleContext(now=0.0)
    unhedged.score(pod(ONE, "ns/x"), fleet, np.arange(fleet.n_nodes), ctx0)
    scarce = ctx0.state.read(SCARCITY_KEY)[2]
    np.testing.assert_allclose(priced.prob, scarce.prob * hedge, rtol=1e-12)
    assert policy.hedge(w) is hedge  # once per workload
    # without live scarcity the hedge alone
    plain = FragmentationPolicy.create(fragmentation.FragmentationArgs(prior_weight=0, coverage=1.0, scarcity=False))
    feed(plain.observe, {ONE: 90, FOUR: 8, EIGHT: 2})
    wp = plain.published.workload()
    hp = plain.hedge(wp)
    assert hp is not None
    np.testing.assert_allclose(plain.scored_workload(fleet, CycleContext(now=0.0)).prob, wp.prob * hp)


def test_a_given_workload_is_priced_as_given() -> None:
    """The caller's workload (the simulator's trace M) has no hedge: scored as before, whatever ``confidenceZ``."""
    fleet = build_arrays([node("big", 8), node("four", 4)])
    given = workload_of([pod(ONE, f"a{i}") for i in range(9)] + [pod(EIGHT, "b")], coverage=1.0)
    policy = FragmentationPolicy.create(fragmentation.FragmentationArgs(scarcity=False))
    ctx = CycleContext(now=0.0)
    ctx.state.write(WORKLOAD_KEY, given)
    assert policy.scored_workload(fleet, ctx) is given


def test_fgd_scores_the_learned_estimate_itself() -> None:
    """The paper's scorer is not hedged: its F is FGD's, against the mix as learned."""
    policy = FgdPolicy.create(fragmentation.FragmentationArgs(prior_weight=0, coverage=1.0))
    feed(policy.observe, {ONE: 90, EIGHT: 2})
    fleet = build_arrays([node("big", 8)])
    w = policy.published.workload()
    assert policy.scored_workload(fleet, CycleContext(now=0.0)) is w


def test_a_rare_shape_seen_twice_keeps_its_only_home() -> None:
    """A 1-GPU pod arrives; it can take a GPU on the only node an 8-GPU pod fits, or on the only node a 4-GPU pod
    fits (each 1 GPU short after it). Learned from 100 pods (90 1-GPU, 8 4-GPU, 2 8-GPU), the estimate prices the
    8-GPU shape's loss (7 GPUs x 0.02) below the 4-GPU shape's (3 GPUs x 0.08), and the pod would break the 8-GPU
    node; two pods say little about how rare 8-GPU pods are: at their upper bounds (3.6 x for the 8-GPU shape,
    1.9 x for the 4-GPU one, z 2: 0.50 against 0.46 GPU) the 8-GPU loss costs more and the pod goes to the 4-GPU
    node."""
    fleet = build_arrays([node("eight", 8), node("four", 4)])
    rows = np.arange(fleet.n_nodes)
    req = pod(ONE, "ns/new")
    chosen = {}
    for z in (0.0, 2.0):
        args = fragmentation.FragmentationArgs(
            prior_weight=0, coverage=1.0, scarcity=False, stranding_weight=0, confidence_z=z
        )
        policy = FragmentationPolicy.create(args)
        feed(policy.observe, {ONE: 90, FOUR: 8, EIGHT: 2})
        scores = policy.score(req, fleet, rows, CycleContext(now=0.0))
        chosen[z] = "eight" if scores[0] > scores[1] else "four" if scores[1] > scores[0] else "tie"
    assert chosen == {0.0: "eight", 2.0: "four"}
