"""The hot-node state machine: entry conditions, hysteresis, hold time, prediction, vectorised agreement."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opkit import gpu, node
from pydantic import ValidationError

from scheduler_plugin.hotness import HotnessConfig, NodeHotness, Transition, observe, step, trigger_mask
from scheduler_plugin.model.snapshot import build_arrays

CFG = HotnessConfig(hot_celsius=83, cool_celsius=75, hold_s=300, horizon_s=300, slowdown_margin_celsius=2)


def run(temps: list[float], *, dt: float = 60.0, **kw: float) -> list[tuple[bool, Transition | None]]:
    st_ = NodeHotness()
    out = []
    for i, t in enumerate(temps):
        st_, tr = step(st_, observe(node("n", gpu(0, t, **kw)), CFG), i * dt, CFG)
        out.append((st_.hot, tr))
    return out


def test_enters_hot_at_threshold_and_not_below() -> None:
    assert run([82.9]) == [(False, None)]
    assert run([83.0]) == [(True, Transition.ENTERED)]


def test_throttling_alone_makes_hot() -> None:
    obs = observe(node("n", gpu(0, 60.0, throttled=True)), CFG)
    st_, tr = step(NodeHotness(), obs, 0.0, CFG)
    assert st_.hot and tr is Transition.ENTERED and "thermal throttling" in st_.reason


def test_throttling_ignored_when_disabled() -> None:
    cfg = CFG.model_copy(update={"throttling_is_hot": False})
    st_, tr = step(NodeHotness(), observe(node("n", gpu(0, 60.0, throttled=True)), cfg), 0.0, cfg)
    assert not st_.hot and tr is None


def test_hysteresis_between_thresholds_stays_hot() -> None:
    # 80 °C is below hot (83) but above cool (75): stays hot indefinitely
    seq = run([85.0] + [80.0] * 20)
    assert all(hot for hot, _ in seq)
    assert [tr for _, tr in seq].count(Transition.ENTERED) == 1


def test_leaves_only_after_hold_time_below_cool() -> None:
    # hot, then below cool from t=60; hold 300 s -> leaves at t=360 (index 6), not earlier
    seq = run([85.0] + [70.0] * 8)
    leave = [i for i, (_, tr) in enumerate(seq) if tr is Transition.LEFT]
    assert leave == [6]
    assert all(hot for hot, _ in seq[:6]) and not seq[6][0]


def test_warm_blip_resets_hold_clock() -> None:
    seq = run([85.0, 70, 70, 70, 76, 70, 70, 70, 70, 70, 70])
    leave = [i for i, (_, tr) in enumerate(seq) if tr is Transition.LEFT]
    assert leave == [10]  # cool since index 5 (t=300) -> t=600


def test_prediction_within_horizon() -> None:
    # slowdown 90 - margin 2 = 88; at 78 °C rising 3 °C/min: 3.3 min = 200 s <= 300 s horizon
    st_, tr = step(NodeHotness(), observe(node("n", gpu(0, 78.0, trend=3.0)), CFG), 0.0, CFG)
    assert tr is Transition.ENTERED and "trend" in st_.reason
    # rising 1 °C/min: 10 min > 5 min horizon
    st_, tr = step(NodeHotness(), observe(node("n", gpu(0, 78.0, trend=1.0)), CFG), 0.0, CFG)
    assert tr is None and not st_.hot


def test_slow_noise_trend_never_predicts() -> None:
    cfg = CFG.model_copy(update={"horizon_s": 1e9})
    _, tr = step(NodeHotness(), observe(node("n", gpu(0, 70.0, trend=0.2)), cfg), 0.0, cfg)
    assert tr is None


def test_missing_telemetry_keeps_state() -> None:
    hot = NodeHotness(hot=True, since=0.0, cool_since=10.0)
    assert step(hot, None, 1e6, CFG) == (hot, None)
    assert step(NodeHotness(), None, 1e6, CFG) == (NodeHotness(), None)


def test_config_rejects_inverted_thresholds() -> None:
    with pytest.raises(ValidationError, match="cool_celsius"):
        HotnessConfig(hot_celsius=70, cool_celsius=75)


@settings(max_examples=200, deadline=None)
@given(
    temps=st.lists(st.floats(20, 110), min_size=1, max_size=4),
    trends=st.lists(st.floats(-5, 10), min_size=4, max_size=4),
    throttled=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_vectorised_mask_agrees_with_per_gpu_rule(
    temps: list[float], trends: list[float], throttled: list[bool]
) -> None:
    gpus = [gpu(i, t, trend=trends[i], throttled=throttled[i]) for i, t in enumerate(temps)]
    nd = node("n", *gpus)
    mask = trigger_mask(build_arrays([nd]), CFG)
    per_gpu = [bool(h.reasons) for h in observe(nd, CFG).gpus]
    assert mask[0, : len(gpus)].tolist() == per_gpu


def test_prediction_ignores_cold_start_rise() -> None:
    # an idle GPU that just got a job: 45 °C rising 20 °C/min would "reach" 88 °C in 2 min, but it is below the
    # cool threshold, where a straight line through a first-order rise overshoots
    st_, tr = step(NodeHotness(), observe(node("n", gpu(0, 45.0, trend=20.0)), CFG), 0.0, CFG)
    assert tr is None and not st_.hot
    low = CFG.model_copy(update={"predict_min_celsius": 40.0})
    assert step(NodeHotness(), observe(node("n", gpu(0, 45.0, trend=20.0)), low), 0.0, low)[1] is Transition.ENTERED
