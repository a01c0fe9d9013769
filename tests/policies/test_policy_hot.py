"""The hotness filter applies the operator's entry rule, so the scheduler never fills a node about to be drained."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_plugin.hotness import HotnessConfig
from scheduler_plugin.model import ThrottleReason
from scheduler_plugin.policies import Framework, PolicyConfig
from scheduler_plugin.policies.base import CycleContext
from scheduler_plugin.policies.hot import HotNodeFilter
from tests.fleet_helpers import NOW, fleet, gpu, node, request

CFG = HotnessConfig(hot_celsius=83, cool_celsius=75, horizon_s=300, slowdown_margin_celsius=2)


def _fleet() -> tuple[object, ...]:
    cool = node("cool", [gpu(i, temp=60) for i in range(4)])
    hot = node("hot", [gpu(0, temp=84), *[gpu(i, temp=60) for i in range(1, 4)]])
    throttling = node(
        "throttling", [gpu(0, temp=70, throttle=int(ThrottleReason.SW_THERMAL_SLOWDOWN)), *[gpu(i) for i in (1, 2, 3)]]
    )
    rising = node("rising", [gpu(0, temp=78, trend=2.0, slowdown=87), *[gpu(i) for i in (1, 2, 3)]])
    warming_from_idle = node("warming", [gpu(0, temp=45, trend=5.0), *[gpu(i) for i in (1, 2, 3)]])
    return (cool, hot, throttling, rising, warming_from_idle)


@pytest.mark.parametrize(
    ("name", "passes", "words"),
    [
        ("cool", True, ""),
        ("hot", False, "gpu 0 is at 84 °C, at or above the hot threshold 83 °C"),
        ("throttling", False, "gpu 0 is thermally throttling"),
        ("rising", False, "rising 2.0 °C/min: it reaches its slowdown threshold within 300 s"),
        ("warming", True, ""),  # a cool GPU that just got a job is not judged by its trend (same as the operator)
    ],
)
def test_hot_filter_cases(name: str, passes: bool, words: str) -> None:
    f = fleet(*_fleet())  # type: ignore[arg-type]
    filt = HotNodeFilter(CFG)
    row = f.index[name]
    idx = np.array([row], dtype=np.int64)
    ctx = CycleContext(now=NOW)
    assert bool(filt.filter(request(1), f, idx, ctx)[0]) is passes
    if not passes:
        rej = filt.explain(request(1), f, row, ctx)
        assert words in rej.reason and rej.unresolvable and rej.kind == "thermal"
        assert "kelvin.dev/thermal=hot" in rej.reason


def test_pods_without_gpus_and_disabled_filter_pass() -> None:
    f = fleet(*_fleet())  # type: ignore[arg-type]
    idx = np.arange(f.n_nodes, dtype=np.int64)
    ctx = CycleContext(now=NOW)
    assert HotNodeFilter(CFG).filter(request(0), f, idx, ctx).all()
    assert HotNodeFilter(CFG, enabled=False).filter(request(1), f, idx, ctx).all()


def test_framework_uses_the_shared_hotness_section() -> None:
    f = fleet(*_fleet())  # type: ignore[arg-type]
    rows = np.arange(f.n_nodes, dtype=np.int64)
    fw = Framework.from_config(PolicyConfig.from_mapping({"hotness": {"hot_celsius": 83}}))
    out = fw.filter(request(1), f, rows, fw.context(f, NOW))
    passed = {f.names[int(r)] for r in out.passed}
    assert passed == {"cool", "warming"}
    # raising the threshold above the hot GPU lets that node back in; turning the filter off lets all but the
    # throttling one (the fit filter's own hard limit) in
    fw2 = Framework.from_config(PolicyConfig.from_mapping({"hotness": {"hot_celsius": 86}}))
    out2 = fw2.filter(request(1), f, rows, CycleContext(now=NOW))
    assert "hot" in {f.names[int(r)] for r in out2.passed}
    fw3 = Framework.from_config(PolicyConfig.from_mapping({"filters": {"hotNodes": False}}))
    out3 = fw3.filter(request(4), f, rows, CycleContext(now=NOW))
    assert {f.names[int(r)] for r in out3.passed} == {"cool", "hot", "rising", "warming"}


def test_batch_reasons_word_each_row_and_share_alike_ones() -> None:
    """reasons() for many rows at once: each row's own words (the first hot GPU, how many more), and rows whose
    figures are alike share one Rejection object (worded once)."""
    twin = node("hot-twin", [gpu(0, temp=84), *[gpu(i, temp=60) for i in range(1, 4)]])
    two_hot = node("two-hot", [gpu(0, temp=60), gpu(1, temp=90), gpu(2, temp=85), gpu(3, temp=60)])
    f = fleet(*_fleet(), twin, two_hot)  # type: ignore[arg-type]
    filt = HotNodeFilter(CFG)
    rows = np.array([f.index[n] for n in ("hot", "throttling", "hot-twin", "rising", "two-hot")], dtype=np.int64)
    rejs = filt.reasons(request(1), f, rows, CycleContext(now=NOW))
    assert [r.reason.split(";")[0] for r in rejs] == [
        "gpu 0 is at 84 °C, at or above the hot threshold 83 °C",
        "gpu 0 is thermally throttling",
        "gpu 0 is at 84 °C, at or above the hot threshold 83 °C",
        "gpu 0 is at 78 °C and rising 2.0 °C/min: it reaches its slowdown threshold within 300 s",
        "gpu 1 is at 90 °C, at or above the hot threshold 83 °C (and 1 more)",
    ]
    assert rejs[0] is rejs[2]
    assert all(r.unresolvable and r.kind == "thermal" for r in rejs)


def test_hot_reasons_are_worded_once_per_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hot rows' reasons depend on the snapshot only: a second pod's filter looks them up, a new snapshot (other
    telemetry columns) words them again; a row that is not hot still gets its words when explain asks."""
    words: list[int] = []
    real = HotNodeFilter._word

    def counting(self: HotNodeFilter, *key: object) -> object:
        words.append(1)
        return real(self, *key)  # type: ignore[arg-type]

    monkeypatch.setattr(HotNodeFilter, "_word", counting)
    f = fleet(*_fleet())  # type: ignore[arg-type]
    filt = HotNodeFilter(CFG)
    ctx = CycleContext(now=NOW)
    bad = np.array([f.index["hot"], f.index["throttling"], f.index["rising"]], dtype=np.int64)
    first = filt.reasons(request(1), f, bad, ctx)
    assert len(words) == 3
    again = filt.reasons(request(2), f, bad[::-1], ctx)
    assert again == first[::-1] and all(a is b for a, b in zip(again, first[::-1], strict=True))
    assert len(words) == 3  # not worded again
    other = fleet(*_fleet())  # type: ignore[arg-type]
    assert [r.reason for r in filt.reasons(request(1), other, bad, ctx)] == [r.reason for r in first]
    assert len(words) == 6
    cool = filt.reasons(request(1), f, np.array([f.index["cool"], f.index["hot"]], dtype=np.int64), ctx)
    assert cool[1] is first[0] and len(cool) == 2
