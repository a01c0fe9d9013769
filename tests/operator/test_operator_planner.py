"""Pure tests of the strategies, the planner (protections, ranking) and the eviction limits."""

from __future__ import annotations

from dataclasses import replace

from kelvin_operator.handshake import Step, decide
from kelvin_operator.limits import EvictionBudget
from kelvin_operator.planner import plan, protection, restart_cost_s
from kelvin_operator.pods import pod_view
from kelvin_operator.settings import (
    LimitsConfig,
    NoisyConfig,
    PoolConfig,
    PoolMode,
    ProtectionConfig,
    ThermalEvictionConfig,
)
from kelvin_operator.strategies import (
    Candidate,
    Reason,
    ViolationKind,
    memory_pools,
    noisy_neighbours,
    pod_gpus,
    thermal,
)
from opkit import T0, gpu, node, pod, proc

from scheduler_plugin.hotness import HotnessConfig, observe
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.gpu import GpuInfo
from scheduler_plugin.model.times import format_time
from scheduler_plugin.thermal_eviction import UNKNOWN_CLOCKS_RATIO, eviction_pays, slowdown_cost_s

PROT = ProtectionConfig(min_pod_age_s=300)


def cand(p: dict, heat: float = 1.0, reason: Reason = Reason.THERMAL) -> Candidate:
    return Candidate(pod=pod_view(p), reason=reason, heat=heat, detail="test")


# --- protections -------------------------------------------------------------------------------------------------


def test_protections_each_named() -> None:
    cases = {
        "evictable": pod("a", annotations={ann.EVICTABLE: "false"}),
        "system-critical": pod("b", priority_class="system-node-critical"),
        "priority": pod("c", priority=2_000_000_000),
        "DaemonSet": pod("d", owner="DaemonSet"),
        "bare pod": pod("e", owner=None),
        "minimum age": pod("f", age_s=60),
        "protected namespace": pod("g", ns="kube-system"),
    }
    for word, p in cases.items():
        why = protection(pod_view(p), T0, PROT)
        assert why is not None and (word in why or word.lower() in why.lower()), (word, why)
    assert protection(pod_view(pod("ok")), T0, PROT) is None


def test_bare_pods_allowed_when_configured() -> None:
    cfg = PROT.model_copy(update={"allow_bare_pods": True})
    assert protection(pod_view(pod("e", owner=None)), T0, cfg) is None


def test_evictable_true_is_not_protected() -> None:
    assert protection(pod_view(pod("a", annotations={ann.EVICTABLE: "true"})), T0, PROT) is None


# --- ranking -----------------------------------------------------------------------------------------------------


def test_rank_priority_then_heat_then_restart_cost() -> None:
    hi = cand(pod("hi", priority=100), heat=50)
    lo_cool = cand(pod("lo-cool", priority=0), heat=1)
    lo_hot = cand(pod("lo-hot", priority=0), heat=9)
    # same priority and heat: the one that restarted most recently loses least work
    young = cand(pod("young", priority=0, age_s=600), heat=1)
    ranked, protected = plan([hi, lo_cool, lo_hot, young], T0, PROT)
    assert [c.pod.name for c in ranked] == ["lo-hot", "young", "lo-cool", "hi"]
    assert protected == []


def test_checkpoint_done_lowers_restart_cost() -> None:
    old = pod_view(pod("x", age_s=7200, annotations={ann.CHECKPOINT_DONE: format_time(T0 - 30)}))
    assert restart_cost_s(old, T0) == 30
    assert restart_cost_s(pod_view(pod("y", age_s=7200)), T0) == 7200


def test_plan_one_candidate_per_pod_most_urgent_reason() -> None:
    p = pod("p")
    ranked, _ = plan([cand(p, 5, Reason.MEMORY_POOL), cand(p, 1, Reason.THERMAL)], T0, PROT)
    assert len(ranked) == 1 and ranked[0].reason is Reason.THERMAL


def test_plan_sets_protected_aside_with_reason() -> None:
    ranked, protected = plan([cand(pod("ds", owner="DaemonSet")), cand(pod("ok"))], T0, PROT)
    assert [c.pod.name for c in ranked] == ["ok"]
    assert protected[0].candidate.pod.name == "ds" and "DaemonSet" in protected[0].why


# --- limits ------------------------------------------------------------------------------------------------------


def test_limits_per_node_cycle_namespace_total_window() -> None:
    b = EvictionBudget(LimitsConfig(max_per_node_per_cycle=1, max_per_namespace=2, max_total=3, window_s=100))
    b.new_cycle("n1")
    assert b.refusal("n1", "a", 0) is None
    b.record("n1", "a", 0)
    assert "this cycle" in (b.refusal("n1", "a", 0) or "")
    b.new_cycle("n1")
    b.record("n1", "a", 1)
    b.new_cycle("n2")
    assert "namespace a" in (b.refusal("n2", "a", 2) or "")
    assert b.refusal("n2", "b", 2) is None
    b.record("n2", "b", 2)
    b.new_cycle("n3")
    assert "cluster" in (b.refusal("n3", "c", 3) or "")
    # the window slides: after 100 s the first eviction no longer counts
    assert b.refusal("n3", "c", 100.5) is None
    assert b.used(100.5) == 2


def test_zero_limits_refuse_everything() -> None:
    b = EvictionBudget(LimitsConfig(max_per_node_per_cycle=0))
    b.new_cycle("n")
    assert b.refusal("n", "a", 0) is not None


# --- handshake ---------------------------------------------------------------------------------------------------


def test_handshake_steps() -> None:
    assert decide({}, T0, 600).step is Step.REQUEST
    req = {ann.CHECKPOINT_REQUESTED: format_time(T0 - 10)}
    assert decide(req, T0, 600).step is Step.WAIT
    old_done = {**req, ann.CHECKPOINT_DONE: format_time(T0 - 3600)}
    assert decide(old_done, T0, 600).step is Step.WAIT  # a checkpoint from before the request does not count
    done = {**req, ann.CHECKPOINT_DONE: format_time(T0 - 4)}
    d = decide(done, T0, 600)
    assert d.step is Step.EVICT_DONE and abs(d.waited_s - 6) < 1e-3
    late = {ann.CHECKPOINT_REQUESTED: format_time(T0 - 601)}
    assert decide(late, T0, 600).step is Step.EVICT_TIMEOUT
    assert decide({ann.CHECKPOINT_REQUESTED: "yesterday"}, T0, 600).step is Step.REQUEST
    # left over from an earlier hot episode (the node cooled, or a PDB kept blocking): ask for a fresh checkpoint
    stale_done = {ann.CHECKPOINT_REQUESTED: format_time(T0 - 86400), ann.CHECKPOINT_DONE: format_time(T0 - 86340)}
    assert decide(stale_done, T0, 600).step is Step.REQUEST
    assert decide({ann.CHECKPOINT_REQUESTED: format_time(T0 - 1201)}, T0, 600).step is Step.REQUEST
    assert decide({ann.CHECKPOINT_REQUESTED: format_time(T0 - 1199)}, T0, 600).step is Step.EVICT_TIMEOUT


# --- strategies --------------------------------------------------------------------------------------------------


def test_thermal_candidates_only_on_warm_gpus_heat_weighted() -> None:
    nd = node("n1", gpu(0, 88.0), gpu(1, 60.0), gpu(2, 80.0))
    pods = [
        pod_view(pod("on0", gpu_indices="0")),
        pod_view(pod("on1", gpu_indices="1")),
        pod_view(pod("on2", gpu_indices="2")),
        pod_view(pod("cpu", gpus=0)),
    ]
    cfg = HotnessConfig()
    got = {c.pod.name: c.heat for c in thermal(nd, observe(nd, cfg), pods, cfg.cool_celsius)}
    assert set(got) == {"on0", "on2"}
    assert got["on0"] > got["on2"] > 0


def test_pod_gpus_from_process_attribution_and_unknown_placement() -> None:
    nd = node("n1", gpu(0), gpu(1, procs=(proc("p", 3),)))
    assert pod_gpus(pod_view(pod("p")), nd) == (1,)
    assert pod_gpus(pod_view(pod("q")), nd) == (0, 1)  # requests a GPU, placement unknown: any
    assert pod_gpus(pod_view(pod("r", gpus=0)), nd) == ()


def test_noisy_memory_offender_not_victim() -> None:
    nd = node("n1", gpu(0, procs=(proc("big", 30), proc("small", 5))))
    pods = [
        pod_view(pod("big", annotations={ann.GPU_MEMORY: "20Gi"})),
        pod_view(pod("small", annotations={ann.GPU_MEMORY: "20Gi"})),
    ]
    got = noisy_neighbours(nd, pods, NoisyConfig())
    assert [c.pod.name for c in got] == ["big"] and got[0].reason is Reason.NOISY_NEIGHBOR


def test_noisy_compute_offender_and_priority_protection() -> None:
    procs = (proc("hog", 5, sm=0.8), proc("meek", 5, sm=0.1))
    nd = node("n1", gpu(0, util=0.97, procs=procs))
    share = {ann.GPU_SHARE: "400"}
    pods = [pod_view(pod("hog", annotations=share)), pod_view(pod("meek", annotations=share))]
    assert [c.pod.name for c in noisy_neighbours(nd, pods, NoisyConfig())] == ["hog"]
    # the offender has a higher priority than its only victim: it is entitled to the GPU
    pods_hi = [pod_view(pod("hog", priority=100, annotations=share)), pod_view(pod("meek", annotations=share))]
    assert noisy_neighbours(nd, pods_hi, NoisyConfig()) == []
    # a GPU that is not busy has no noisy neighbour
    idle = node("n1", gpu(0, util=0.5, procs=procs))
    assert noisy_neighbours(idle, pods, NoisyConfig()) == []


def test_memory_pool_modes_tolerance_grace_failed_open() -> None:
    nd = node("n1", gpu(0, procs=(proc("p", 21),)))
    pods = [pod_view(pod("p", annotations={ann.GPU_MEMORY: "20Gi"}))]
    within = PoolConfig(tolerance_ratio=0.10, mode=PoolMode.EVICT)
    assert memory_pools(nd, pods, within, {}, T0, False)[0] == []
    cfg = PoolConfig(tolerance_ratio=0.01, mode=PoolMode.EVICT, grace_s=60)
    v, since = memory_pools(nd, pods, cfg, {}, T0, False)
    assert len(v) == 1 and v[0].kind is ViolationKind.OVER_POOL and not v[0].actionable
    v, since = memory_pools(nd, pods, cfg, since, T0 + 61, True)
    assert v[0].actionable and v[0].kind is ViolationKind.FAILED_OPEN and "FAILED OPEN" in v[0].message()
    warn = cfg.model_copy(update={"mode": PoolMode.WARN})
    assert not memory_pools(nd, pods, warn, since, T0 + 1000, False)[0][0].actionable
    # back under the pool: dropped from the grace map
    ok = node("n1", gpu(0, procs=(proc("p", 10),)))
    assert memory_pools(ok, pods, cfg, since, T0 + 2000, False) == ([], {})


def _slowed(g: GpuInfo, ratio: float) -> GpuInfo:
    return replace(g, sm_clock_max_mhz=2000.0, sm_clock_mhz=2000.0 * ratio)


def test_thermal_pays_rule_moves_only_pods_whose_throttling_costs_more_than_a_restart() -> None:
    """Rule pays (the default): a warm GPU that does not throttle moves nobody (the taint is enough); on a throttling
    GPU, a pod moves when its remaining work (estimated as its age) slowed by the clocks costs more than the work since
    its last checkpoint plus a restart."""
    nd = node(
        "n1",
        gpu(0, 86.0),  # hot, not throttling
        _slowed(gpu(1, 90.0, throttled=True), 0.6),
        _slowed(gpu(2, 90.0, throttled=True), 0.6),
        _slowed(gpu(3, 88.0, throttled=True), 0.95),
    )
    ckpt = {ann.CHECKPOINT_DONE: format_time(T0 - 120)}
    pods = [
        pod_view(pod("warm-only", gpu_indices="0", annotations=ckpt)),
        # 1 h old, checkpointed 2 min ago: 60 min at 60 % clocks is 40 min longer, moving costs 2 + 2 min
        pod_view(pod("pays", gpu_indices="1", annotations=ckpt)),
        # 1 h old, never checkpointed: moving throws away the hour, more than the 40 min it would lose
        pod_view(pod("no-checkpoint", gpu_indices="2")),
        # 5 % slower: 3 min lost over the hour, less than the 4 min a move costs
        pod_view(pod("barely-slowed", gpu_indices="3", annotations=ckpt)),
    ]
    cfg = HotnessConfig()
    obs = observe(nd, cfg)
    rule = ThermalEvictionConfig()
    assert rule.rule == "pays"
    got = thermal(nd, obs, pods, cfg.cool_celsius, T0, rule)
    assert [c.pod.name for c in got] == ["pays"]
    assert "throttled to 60% clocks" in got[0].detail
    warm = ThermalEvictionConfig(rule="warm")
    assert {c.pod.name for c in thermal(nd, obs, pods, cfg.cool_celsius, T0, warm)} == {p.name for p in pods}
    assert {c.pod.name for c in thermal(nd, obs, pods, cfg.cool_celsius)} == {p.name for p in pods}  # no rule: warm


def test_a_throttling_gpu_without_clocks_counts_as_slowed() -> None:
    """A GPU that reports thermal throttling but no SM clocks (a source without the clock series) is not taken for
    full speed: rule pays moves a checkpointed pod off it, at the assumed ratio."""
    nd = node("n1", gpu(0, 90.0, throttled=True))  # no clocks reported
    assert nd.gpus[0].sm_clock_max_mhz == 0
    ckpt = {ann.CHECKPOINT_DONE: format_time(T0 - 120)}
    pods = [pod_view(pod("slowed", gpu_indices="0", annotations=ckpt))]
    cfg = HotnessConfig()
    got = thermal(nd, observe(nd, cfg), pods, cfg.cool_celsius, T0, ThermalEvictionConfig())
    assert [c.pod.name for c in got] == ["slowed"]
    assert f"throttled to {UNKNOWN_CLOCKS_RATIO:.0%} clocks" in got[0].detail


def test_eviction_pays_weighs_the_slowdown_against_the_work_lost() -> None:
    assert not eviction_pays(3600.0, 1.0, 0.0, 0.0)  # full clocks: staying costs nothing
    assert eviction_pays(3600.0, 0.5, 600.0, 120.0)  # an hour at half speed: an hour more, against 12 min
    assert not eviction_pays(600.0, 0.5, 600.0, 120.0)  # 10 min more against 12 min
    assert slowdown_cost_s(600.0, 0.5) == 600.0
