"""The priority policy (scheduler_plugin/policies/priority): free NVLink groups, the score that keeps preemptible pods
off them, the reserve that refuses a node, learning the protected mix, args validation, framework wiring."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from scheduler_plugin.model import GpuRequest
from scheduler_plugin.policies import Framework, PolicyConfig
from scheduler_plugin.policies.base import CycleContext, RejectionKind
from scheduler_plugin.policies.priority import PriorityArgs, PriorityScore
from scheduler_plugin.policies.priority.groups import Wiring, capacity, loss
from scheduler_plugin.policies.reasons import ReservedForPriority
from scheduler_plugin.policies.registry import PolicyConfigError
from tests.fleet_helpers import NOW, dgx, fleet, gpu, node, request, shared, whole

HIGH, SPOT = 100, 0
SIZES = ((8, 1 / 3), (4, 1 / 3), (2, 1 / 3))


def p_ctx() -> CycleContext:
    return CycleContext(now=NOW)


def islands(name: str, *, assignments: tuple[Any, ...] = ()) -> Any:
    """8 GPUs in two 4-GPU NVLink islands (0-3, 4-7)."""
    isl = [(0, 1, 2, 3), (4, 5, 6, 7)]
    gpus = [gpu(i, switch=f"sw{i // 2}", numa=i // 4, nvlink=[j for j in isl[i // 4] if j != i]) for i in range(8)]
    return node(name, gpus, assignments=assignments)


def wiring_of(nd: Any) -> Wiring:
    f = fleet(nd)
    return Wiring.of(f.nvlink[0], f.gpu_present[0])


def pod(count: int = 1, priority: int = SPOT, **kw: Any) -> GpuRequest:
    return replace(request(count, **kw), priority=priority)


def plugin(**args: Any) -> PriorityScore:
    return PriorityScore(PriorityArgs.model_validate({"protectFrom": HIGH, "groupSizes": [8, 4, 2], **args}))


def test_capacity_counts_disjoint_nvlink_cliques() -> None:
    nvswitch, isl = wiring_of(dgx("a")), wiring_of(islands("b"))
    full = 0xFF
    assert [capacity(nvswitch, k, full) for k in (1, 2, 4, 8)] == [8, 4, 2, 1]
    assert [capacity(isl, k, full) for k in (1, 2, 4, 8)] == [8, 4, 2, 0]
    # GPUs 3 and 4 free with 0-2: no 4-clique across the islands
    assert capacity(isl, 4, 0b0001_1111) == 1 and capacity(isl, 4, 0b0001_1110) == 0
    assert capacity(isl, 2, 0b0001_1000) == 0  # 3 and 4 are not linked


def test_loss_is_the_least_over_every_choice_of_gpus() -> None:
    isl = wiring_of(islands("b"))
    # island A intact, one GPU free in island B: a 1-GPU pod takes that one and breaks nothing
    assert loss(isl, 0b0001_1111, 1, SIZES) == 0.0
    # both islands intact: one GPU breaks one 4-group (4 GPUs) and one pair (2 GPUs) at best
    assert loss(isl, 0xFF, 1, SIZES) == pytest.approx((4 + 2) / 3)
    assert loss(isl, 0b1, 2, SIZES) == float("inf")


def test_the_score_prefers_a_broken_node_for_a_preemptible_pod() -> None:
    f = fleet(islands("intact"), islands("broken", assignments=(whole("x", 4, 5, 6),)), dgx("dgx"))
    p = plugin()
    idx = np.arange(3, dtype=np.int64)
    raw = p.score(pod(1), f, idx, p_ctx())
    assert raw[1] == 1.0  # GPU 7 breaks nothing
    assert raw[0] < 1.0 and raw[2] < raw[0]  # the 8-GPU NVSwitch node loses its whole-node group too
    # a protected pod (priority >= protectFrom) has no preference
    assert p.score(pod(1, HIGH), f, idx, p_ctx()).tolist() == [1.0, 1.0, 1.0]


def test_a_share_breaks_nothing_where_a_gpu_is_shared_already() -> None:
    f = fleet(islands("a"), islands("b", assignments=(shared("s", 0, mem_gib=20),)))
    lost = plugin().losses(pod(1, memory="10Gi"), f, np.arange(2, dtype=np.int64))
    assert lost[0] > 0 and lost[1] == 0.0


def test_learned_mix_is_off_until_a_protected_pod_is_seen() -> None:
    p = PriorityScore(PriorityArgs(protect_from=HIGH))
    f = fleet(islands("a"), islands("b", assignments=(whole("x", 0),)))
    idx = np.arange(2, dtype=np.int64)
    assert p.sizes() == () and p.score(pod(1), f, idx, p_ctx()).tolist() == [1.0, 1.0]
    p.observe(pod(1, SPOT))  # not protected: not learned
    assert p.sizes() == ()
    for k in (4, 4, 4, 8):
        p.observe(pod(k, HIGH, topology="nvlink-required"))
    assert p.sizes() == ((4, 0.75), (8, 0.25))
    raw = p.score(pod(1), f, idx, p_ctx())
    assert raw[1] > raw[0]  # b's island A is broken already: GPU 1-3 are the place


def test_the_reserve_refuses_breaking_groups_below_it() -> None:
    """One intact NVSwitch node (8 GPUs: value 8/3 + 8/3 + 8/3 = 8) and one with a single GPU left free: a spot pod
    may take the lone GPU; the intact node is refused while breaking it leaves less than the reserve."""
    nodes = (dgx("intact"), dgx("broken", assignments=(whole("x", *range(7)),)))
    f = fleet(*nodes)
    idx = np.arange(2, dtype=np.int64)
    strict = plugin(reserveGpus=8)
    assert strict.restricts()
    assert strict.filter(pod(1), f, idx, p_ctx()).tolist() == [False, True]
    assert strict.filter(pod(1, HIGH), f, idx, p_ctx()).tolist() == [True, True]  # protected pods are never refused
    (why,) = strict.reasons(pod(1), f, idx[:1], p_ctx())
    assert isinstance(why, ReservedForPriority) and why.kind is RejectionKind.RESERVED and not why.unresolvable
    assert "keeps 8 for higher priorities (8.0 free)" in why.reason
    # a reserve the fleet can afford: breaking the intact node leaves 8 - loss >= 2
    assert plugin(reserveGpus=2).filter(pod(1), f, idx, p_ctx()).tolist() == [True, True]
    assert not plugin().restricts()


def test_framework_runs_the_reserve_as_a_filter_only_when_configured() -> None:
    f = fleet(dgx("intact"), dgx("broken", assignments=(whole("x", *range(7)),)))
    rows = np.arange(2, dtype=np.int64)
    plain = Framework.from_config(PolicyConfig())
    assert all(not isinstance(x, PriorityScore) for x in plain.plugins)
    assert plain.filter(pod(1), f, rows, plain.context(f, NOW)).passed.tolist() == [0, 1]
    cfg = PolicyConfig.from_mapping(
        {"scoring": {"priority": {"weight": 0, "args": {"protectFrom": HIGH, "groupSizes": [8], "reserveGpus": 8}}}}
    )
    fw = Framework.from_config(cfg)
    out = fw.filter(pod(1), f, rows, fw.context(f, NOW))
    assert out.passed.tolist() == [1]
    assert out.rejected[0].kind is RejectionKind.RESERVED
    assert fw.pick(pod(1), f, 0, fw.context(f, NOW)) is None  # pick agrees with filter
    assert fw.filter(pod(8, HIGH), f, rows, fw.context(f, NOW)).passed.tolist() == [0]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({}, "scoring.priority.args.protectFrom: Field required"),
        ({"protectFrom": 1, "groupSizes": []}, "scoring.priority.args.groupSizes"),
        ({"protectFrom": 1, "groupSizes": [4, 4]}, "must be distinct"),
        ({"protectFrom": 1, "groupSizes": [0]}, "must be 1..16"),
        ({"protectFrom": 1, "reserveGpus": -1}, "scoring.priority.args.reserveGpus"),
    ],
)
def test_bad_args_name_the_field(args: dict[str, Any], words: str) -> None:
    cfg = PolicyConfig.from_mapping({"scoring": {"priority": {"weight": 1, "args": args}}})
    with pytest.raises(PolicyConfigError, match=words.replace(".", r"\.")):
        Framework.from_config(cfg)
