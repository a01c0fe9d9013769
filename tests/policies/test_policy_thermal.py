"""Thermal score and its temperature predicates."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from scheduler_plugin.model import FleetArrays, GpuNode, GpuRequest, ThrottleReason
from scheduler_plugin.policies.base import CycleContext
from scheduler_plugin.policies.framework import Framework
from scheduler_plugin.policies.policy_file import PolicyConfig
from scheduler_plugin.policies.thermal import (
    ThermalArgs,
    ThermalScore,
    headroom_c,
    predicted_temp,
    throttle_odds,
)
from scheduler_plugin.telemetry.cooling import CoolingEstimator
from tests.fleet_helpers import NOW, fleet, gpu, node, request

SCORE = ThermalScore(ThermalArgs())


def raw(req: GpuRequest, *nodes: GpuNode, args: ThermalArgs | None = None) -> list[float]:
    f = fleet(*nodes)
    s = SCORE if args is None else ThermalScore(args)
    return [round(x, 4) for x in s.score(req, f, np.arange(f.n_nodes), CycleContext(now=NOW)).tolist()]


def one(**kw: object) -> GpuNode:
    return node("a", [gpu(0, **kw)])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "expect"),
    [
        ({"temp": 50, "slowdown": 87}, 1.0),  # 37 °C of headroom: more than the comfortable 25
        ({"temp": 62, "slowdown": 87}, 1.0),  # exactly 25
        ({"temp": 77, "slowdown": 87}, 0.4),  # 10 / 25
        ({"temp": 87, "slowdown": 87}, 0.0),
        ({"temp": 70, "slowdown": 87, "trend": 1.0}, round(12 / 25, 4)),  # 70 + 1 °C/min * 5 min = 75
        ({"temp": 70, "slowdown": 87, "trend": -3.0}, round(17 / 25, 4)),  # cooling is not credited ahead
        ({"temp": 50, "throttle": int(ThrottleReason.SW_THERMAL_SLOWDOWN)}, 0.0),
        ({"temp": 50, "throttle": int(ThrottleReason.SW_POWER_CAP), "clock": (1000.0, 2000.0)}, 0.25),
        ({"temp": 50, "throttle": int(ThrottleReason.GPU_IDLE), "clock": (300.0, 2000.0)}, 1.0),
    ],
)
def test_single_gpu_quality(kw: dict[str, object], expect: float) -> None:
    assert raw(request(1), one(**kw)) == [expect]


def test_hot_node_scores_low_before_it_throttles() -> None:
    cool, warm, hot = raw(request(1), one(temp=55), one(temp=75), one(temp=84))
    assert cool > warm > hot
    assert SCORE.normalize(np.array([hot]))[0] < 2.0


def test_node_worst_gpu_counts() -> None:
    calm = node("a", [gpu(0, temp=50), gpu(1, temp=50)])
    neighbour_hot = node("b", [gpu(0, temp=50), gpu(1, temp=85)])
    a, b = raw(request(1), calm, neighbour_hot)
    assert a == 1.0
    assert b == round(0.7 * 1.0 + 0.3 * (2 / 25), 4)


def test_multi_gpu_uses_best_usable_gpus() -> None:
    n = node("a", [gpu(0, temp=50), gpu(1, temp=72), gpu(2, temp=77)])
    # best two usable: 1.0 and 0.6; the node's worst: 0.4
    assert raw(request(2), n) == [round(0.7 * 0.8 + 0.3 * 0.4, 4)]


def test_args_change_the_scale() -> None:
    assert raw(request(1), one(temp=77), args=ThermalArgs(comfortable_headroom_celsius=10)) == [1.0]
    assert raw(request(1), one(temp=70, trend=1.0), args=ThermalArgs(horizon_seconds=0)) == [round(17 / 25, 4)]


def test_predicates_on_scalars_and_arrays() -> None:
    assert headroom_c(80.0, 87.0) == 7.0
    assert predicted_temp(70.0, 2.0, 300) == 80.0
    temps = np.array([50.0, 90.0])
    assert predicted_temp(temps, np.array([1.0, -1.0]), 60).tolist() == [51.0, 89.0]


def test_explain_mentions_trend_and_throttle() -> None:
    f = fleet(one(temp=70, trend=1.5, throttle=int(ThrottleReason.SW_POWER_CAP), clock=(1000.0, 2000.0)))
    (line,) = SCORE.explain(request(1), f, 0, CycleContext(now=NOW))
    assert "70.0 °C, trend +1.5 °C/min -> 77.5 °C in 5 min" in line
    assert "clocks slowed (sw_power_cap, at 50%)" in line


def cooled(name: str, *, r: float | None, temp: float = 40.0, power: float | None = 70.0, **kw: object) -> GpuNode:
    """A one-GPU node with a cooling quality (thermal resistance) and a power reading."""
    g = replace(gpu(0, temp=temp, **kw), power_watts=power, thermal_resistance_c_per_w=r)  # type: ignore[arg-type]
    return node(name, [g])


#: A busy GPU of the same model: the fleet's power under load (700 W) comes from it.
BUSY = cooled("busy", r=0.065, temp=70.0, power=700.0, util=0.9)


@pytest.mark.parametrize(
    ("r", "expect"),
    [
        (0.06, round((87 - (40 + 0.06 * 630)) / 15, 4)),  # settles at 77.8 °C under load: 9.2 °C left of 15
        (0.09, 0.0),  # settles at 96.7 °C: past slowdown
        (0.02, 1.0),  # 52.6 °C: more than 15 °C left, and 47 °C left now
        (None, 1.0),  # cooling unknown: judged on the temperature now
    ],
)
def test_idle_gpu_is_judged_by_where_its_cooling_takes_it_under_load(r: float | None, expect: float) -> None:
    scores = raw(request(1), cooled("a", r=r), BUSY)
    assert scores[0] == expect
    assert scores[1] == round(17 / 25, 4)  # the busy GPU adds no power: judged at 70 °C now


def test_poorly_cooled_idle_node_scores_low_before_it_is_loaded() -> None:
    good, poor, _ = raw(request(1), cooled("good", r=0.06), cooled("poor", r=0.085), BUSY)
    assert good > 0.5 > poor  # both idle at 40 °C: only their cooling tells them apart


def test_no_prediction_without_power_or_busy_gpus() -> None:
    # no busy GPU of the model: nothing says what a pod draws
    assert raw(request(1), cooled("a", r=0.09)) == [1.0]
    # no power readings
    assert raw(request(1), cooled("a", r=0.09, power=None), replace(BUSY)) == [1.0, round(17 / 25, 4)]


def test_a_gpu_cooling_down_is_judged_from_where_it_is_heading() -> None:
    # a job just ended: 70 °C and falling 20 °C/min at idle power; heading for 50 °C, then +0.05 * 630 W
    hot_but_cooling = cooled("a", r=0.05, temp=70.0, trend=-20.0)
    expect = round((87 - (50 + 0.05 * 630)) / 15, 4)
    assert raw(request(1), hot_but_cooling, BUSY)[0] == expect
    assert raw(request(1), hot_but_cooling, BUSY, args=ThermalArgs(settle_seconds=0))[0] == 0.0


def test_load_power_percentile_and_headroom_args() -> None:
    half = cooled("half", r=0.065, temp=60.0, power=385.0, util=0.5)
    a = cooled("a", r=0.08)
    assert raw(request(1), a, BUSY, half)[0] == 0.0  # the highest power under load, 700 W: 90.4 °C
    # median of the busy GPUs' power (385, 700) = 542.5 W: +0.08 * 472.5 W = 77.8 °C
    assert raw(request(1), a, BUSY, half, args=ThermalArgs(load_power_percentile=50))[0] == round(9.2 / 15, 4)
    b = cooled("b", r=0.06)  # 77.8 °C at 700 W: 9.2 °C left, more than 5
    assert raw(request(1), b, BUSY, args=ThermalArgs(loaded_headroom_celsius=5))[0] == 1.0


def test_explain_shows_the_prediction_under_load() -> None:
    f = fleet(cooled("a", r=0.06), BUSY)
    (line,) = SCORE.explain(request(1), f, 0, CycleContext(now=NOW))
    assert "under load 77.8 °C (cooling 0.060 °C/W reported by telemetry, 9.2 °C below slowdown)" in line
    (plain,) = SCORE.explain(request(1), fleet(one(temp=50)), 0, CycleContext(now=NOW))
    assert "under load" not in plain


def test_explain_says_above_slowdown_when_past_it() -> None:
    # 90 °C now with slowdown at 87: 3.0 °C above; idle at 40 °C with r = 0.09 settles at 96.7 °C under load
    (hot,) = SCORE.explain(request(1), fleet(one(temp=90)), 0, CycleContext(now=NOW))
    assert "3.0 °C above slowdown 87 °C" in hot and "below" not in hot
    (line,) = SCORE.explain(request(1), fleet(cooled("a", r=0.09), BUSY), 0, CycleContext(now=NOW))
    assert "47.0 °C below slowdown 87 °C" in line
    assert "under load 96.7 °C (cooling 0.090 °C/W reported by telemetry, 9.7 °C above slowdown)" in line
    assert "-" not in line.split("under load")[1]


def learning_fleet(at: float) -> FleetArrays:
    """An idle GPU never loaded and a settled busy one of the same model, read at ``at``."""
    idle = cooled("idle", r=None)
    busy = replace(BUSY, gpus=(replace(BUSY.gpus[0], thermal_resistance_c_per_w=None),), observed_at=at)
    return fleet(replace(idle, observed_at=at), busy)


def test_explain_says_whether_the_cooling_figure_is_learned_or_assumed() -> None:
    est = CoolingEstimator()
    for at in (NOW - 60, NOW):  # two readings a minute apart
        f = learning_fleet(at)
        est.fill(f)
    assert f.cooling_samples.tolist() == [[0], [2]]
    ctx = CycleContext(now=NOW)
    (idle,) = SCORE.explain(request(1), f, 0, ctx)
    assert "(cooling 0.048 °C/W assumed (the worst learned for its model" in idle
    (busy,) = SCORE.explain(request(1), f, 1, ctx)
    assert "(cooling 0.048 °C/W learned from 2 readings under load since 60 s ago" in busy


# --- holding a pod rather than placing it where it would throttle (holdRunSeconds) ---------------------------------


def held(req: GpuRequest, *nodes: GpuNode, now: float = NOW, args: ThermalArgs | None = None) -> list[bool]:
    f = fleet(*nodes)
    s = SCORE if args is None else ThermalScore(args)
    return [bool(x) for x in s.filter(req, f, np.arange(f.n_nodes), CycleContext(now=now))]


def pending(count: int, waited_s: float) -> GpuRequest:
    return replace(request(count), pending_since=NOW - waited_s)


def test_a_pod_waits_rather_than_run_where_it_would_throttle() -> None:
    poor, good = cooled("poor", r=0.09), cooled("good", r=0.06)  # under load 96.7 °C / 77.8 °C
    # waited 10 min of the 60 min of throttling a run there would cost: only the well-cooled node takes it
    assert held(pending(1, 600), poor, good, BUSY) == [False, True, True]
    # waited as long as the throttling it would avoid: it takes the poorly cooled node rather than wait on
    assert held(pending(1, 3600), poor, good, BUSY) == [True, True, True]
    assert held(pending(1, 600), poor, BUSY, args=ThermalArgs(hold_run_seconds=300)) == [True, True]
    assert held(pending(1, 0), poor, BUSY, args=ThermalArgs(hold_run_seconds=0)) == [True, True]
    # a pod whose waiting time is unknown is never held; nor is a pod without GPUs
    assert held(request(1), poor, BUSY) == [True, True]
    assert held(replace(request(0), pending_since=NOW), poor, BUSY) == [True, True]


def test_a_node_never_loaded_is_held_by_the_fleet_share_of_throttling_gpus() -> None:
    est = CoolingEstimator()
    for at in (NOW - 60, NOW):
        f = learning_fleet(at)  # the busy GPU learns r = 0.048: it would not throttle under load
        est.fill(f)
    odds = throttle_odds(f, ThermalArgs())
    assert odds.tolist() == [0.0, 0.0]  # the idle GPU is unknown: the fleet's share, 0 of 1 learned
    poor2 = node("poor2", [replace(cooled("p", r=0.09).gpus[0], index=i) for i in range(2)])
    hot = fleet(cooled("poor", r=0.09), cooled("good", r=0.06), BUSY, cooled("unknown", r=0.06), poor2)
    hot.cooling_samples[3] = 0  # its figure is only the prior: the share of known nodes, 2 of 4 (GPUs: 3 of 5)
    assert throttle_odds(hot, ThermalArgs()).tolist() == [1.0, 0.0, 0.0, 0.5, 1.0]
    ctx = CycleContext(now=NOW)
    keep = SCORE.filter(pending(1, 1000), hot, np.arange(5), ctx).tolist()
    assert keep == [False, True, True, False, False]  # held 1,800 s from the unknown node, 3,600 s from poor ones
    assert SCORE.filter(pending(1, 1800), hot, np.arange(5), ctx).tolist() == [False, True, True, True, False]


def test_the_framework_holds_the_pod_and_says_why() -> None:
    fw = Framework.from_config(PolicyConfig())
    f = fleet(cooled("poor", r=0.09), BUSY)
    ctx = fw.context(f, NOW)
    out = fw.filter(pending(1, 600), f, np.arange(2), ctx)
    assert out.passed.tolist() == [1]
    assert out.rejected[0].reason == (
        "its GPUs would throttle under load: the pod has waited 600 s of the 3600 s of throttling that placing it "
        "here is expected to cost"
    )
    assert fw.filter(request(1), f, np.arange(2), fw.context(f, NOW)).passed.tolist() == [0, 1]
