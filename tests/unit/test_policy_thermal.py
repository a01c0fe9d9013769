"""Thermal score and the shared hotness predicates."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_plugin.model import GpuNode, GpuRequest, ThrottleReason
from scheduler_plugin.policies.base import CycleContext
from scheduler_plugin.policies.thermal import (
    ThermalArgs,
    ThermalScore,
    headroom_c,
    hot_now,
    predicted_hot,
    predicted_temp,
)
from tests.unit.fleet_helpers import NOW, fleet, gpu, node, request

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
    assert hot_now(87.0, 87.0, 0) is True
    assert hot_now(80.0, 87.0, int(ThrottleReason.HW_THERMAL_SLOWDOWN)) is True
    assert hot_now(80.0, 87.0, int(ThrottleReason.SW_POWER_CAP)) is False
    assert hot_now(83.0, 87.0, 0, margin_c=5) is True
    assert predicted_hot(80.0, 2.0, 87.0, 300) is True
    assert predicted_hot(80.0, 1.0, 87.0, 300) is False
    temps = np.array([50.0, 90.0])
    assert hot_now(temps, np.array([87.0, 87.0]), np.array([0, 0])).tolist() == [False, True]
    assert predicted_temp(temps, np.array([1.0, -1.0]), 60).tolist() == [51.0, 89.0]


def test_explain_mentions_trend_and_throttle() -> None:
    f = fleet(one(temp=70, trend=1.5, throttle=int(ThrottleReason.SW_POWER_CAP), clock=(1000.0, 2000.0)))
    (line,) = SCORE.explain(request(1), f, 0, CycleContext(now=NOW))
    assert "70.0 °C, trend +1.5 °C/min -> 77.5 °C in 5 min" in line
    assert "clocks slowed (sw_power_cap, at 50%)" in line
