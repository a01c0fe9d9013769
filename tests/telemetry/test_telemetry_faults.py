"""Telemetry faults (issue 14, items 7-10) against the real PrometheusSource and a fake Prometheus on 127.0.0.1: a
fresh install with no data yet, an answer trickled byte by byte, samples stamped in the future, implausible values
and labels that are not strings."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fake_prometheus import FakePrometheus
from prometheus_client import CollectorRegistry

from scheduler_plugin.extender.app import build_extender
from scheduler_plugin.extender.service import Extender
from scheduler_plugin.policies.policy_file import PolicyConfig
from scheduler_plugin.settings import Settings
from scheduler_plugin.telemetry.cache import CacheSettings, SnapshotCache, TelemetryMetrics
from scheduler_plugin.telemetry.prometheus import KELVIN_QUERIES, PrometheusSource

GPU_POD = {
    "metadata": {"name": "p1", "namespace": "default", "uid": "uid-p1"},
    "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
}


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def prom() -> Iterator[FakePrometheus]:
    with FakePrometheus().running() as fake:
        yield fake


def extender(prom: FakePrometheus, clock: Clock, max_age_s: float = 30.0) -> tuple[Extender, PrometheusSource]:
    source = PrometheusSource(prom.url, metrics="kelvin", timeout_s=2, clock=clock)
    policy = PolicyConfig.from_mapping({"telemetry": {"onStale": "deny", "maxAgeSeconds": max_age_s}})
    ext = build_extender(
        Settings(refresh_interval_s=5, max_telemetry_age_s=max_age_s), policy=policy, source=source, clock=clock
    )
    return ext, source


def passing(ext: Extender, names: list[str]) -> list[str]:
    body = json.dumps({"Pod": GPU_POD, "Nodes": None, "NodeNames": names}).encode()
    result = ext.filter(body)
    assert not result.get("Error"), result
    return list(result["NodeNames"] or [])


# -- item 7: a fresh install ---------------------------------------------------------------------------------------


async def test_a_fresh_install_places_pods_in_the_first_refresh_after_data_arrives(
    prom: FakePrometheus, caplog: pytest.LogCaptureFixture
) -> None:
    """Prometheus has no kelvin series yet for a while (empty snapshots, warmed without error), then the exporters'
    series arrive: the very next refresh succeeds and the pod passes. The empty snapshot used to stay the trend's
    base for trend_window_s (IndexError in every refresh for 300 s), and warming it failed."""
    clock = Clock()
    ext, source = extender(prom, clock)
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(4):  # 15 s without data: more than min_trend_s apart
                assert await ext.cache.refresh_once(), ext.cache.last_error
                assert len(ext.cache.snapshot.nodes) == 0
                clock.t += 5
            prom.set_gpus(clock.t, {"gpu-node-1": 8})
            started = time.perf_counter()
            assert await ext.cache.refresh_once(), ext.cache.last_error
            took = time.perf_counter() - started
        assert passing(ext, ["gpu-node-1"]) == ["gpu-node-1"]
        assert ext.cache.readiness().ready
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
        assert took < 2.0
        # and the trend works from there on: a second refresh with data, 5 s later, still passes the pod
        clock.t += 5
        prom.set_gpus(clock.t, {"gpu-node-1": 8})
        assert await ext.cache.refresh_once(), ext.cache.last_error
        assert passing(ext, ["gpu-node-1"]) == ["gpu-node-1"]
    finally:
        await source.close()


# -- item 8: a deadline per refresh --------------------------------------------------------------------------------


def _cache(source: PrometheusSource, clock: Any, registry: CollectorRegistry, **kw: Any) -> SnapshotCache:
    return SnapshotCache(source, CacheSettings(**kw), clock=clock, metrics=TelemetryMetrics(registry, "prometheus"))


async def test_a_trickled_answer_fails_the_refresh_within_the_query_timeout(prom: FakePrometheus) -> None:
    """One byte every 0.5 s never trips httpx's per-read timeout (2 s): the refresh used to hang (40 s and more).
    Now the whole answer of each query must come within timeout_s; the old snapshot stays."""
    prom.set_gpus(time.time(), {"gpu-node-1": 2})
    source = PrometheusSource(prom.url, metrics="kelvin", timeout_s=2)
    registry = CollectorRegistry()
    cache = _cache(source, time.time, registry, refresh_interval_s=5, max_age_s=30)
    try:
        assert await cache.refresh_once()
        good = cache.snapshot
        prom.trickle_s = 0.5
        started = time.perf_counter()
        ok = await asyncio.wait_for(cache.refresh_once(), 15)  # the test fails instead of hanging
        took = time.perf_counter() - started
    finally:
        prom.trickle_s = 0
        await source.close()
    assert not ok and took < 2.0 + 1.0, took
    assert cache.snapshot is good and len(good.nodes) == 1
    assert cache.last_error is not None and "did not finish within 2 s (prometheus_timeout_s)" in cache.last_error
    assert registry.get_sample_value("kelvin_telemetry_refresh_total", {"source": "prometheus", "result": "error"}) == 1
    assert "is failing" in cache.readiness().reason


async def test_slow_queries_together_fail_the_refresh_at_its_deadline(prom: FakePrometheus) -> None:
    """Each query answers within its timeout (0.4 s of 2 s), but the 18 queries, 4 at a time, take about 2 s
    together: the refresh deadline (1 s) cancels the refresh as a whole."""
    prom.set_gpus(time.time(), {"gpu-node-1": 2})
    source = PrometheusSource(prom.url, metrics="kelvin", timeout_s=2)
    registry = CollectorRegistry()
    cache = _cache(source, time.time, registry, refresh_interval_s=5, max_age_s=30, refresh_deadline_s=1.0)
    try:
        assert await cache.refresh_once()
        good = cache.snapshot
        prom.delay_s = 0.4
        started = time.perf_counter()
        ok = await asyncio.wait_for(cache.refresh_once(), 15)
        took = time.perf_counter() - started
        prom.delay_s = 0
        assert await cache.refresh_once(), cache.last_error  # the source still works after a cancelled refresh
    finally:
        prom.delay_s = 0
        await source.close()
    assert not ok and 1.0 <= took < 1.0 + 0.5, took
    assert cache.snapshot is not good
    errors = registry.get_sample_value("kelvin_telemetry_refresh_total", {"source": "prometheus", "result": "error"})
    assert errors == 1


async def test_the_refresh_deadline_is_refused_when_not_a_positive_number() -> None:
    source = PrometheusSource("http://127.0.0.1:9", metrics="kelvin")
    try:
        for bad in (0.0, -1.0, float("inf"), float("nan")):
            with pytest.raises(ValueError, match="refresh_deadline_s must be a finite number > 0"):
                CacheSettings(refresh_deadline_s=bad)
    finally:
        await source.close()


# -- item 9: samples stamped in the future -------------------------------------------------------------------------


async def test_a_node_stamped_a_day_ahead_goes_stale_once_its_series_vanish(
    prom: FakePrometheus, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    ext, source = extender(prom, clock, max_age_s=6)
    try:
        with caplog.at_level(logging.WARNING, logger="scheduler_plugin.telemetry.prometheus"):
            for _ in range(3):
                prom.set_gpus(clock.t, {"gpu-node-1": 8, "gpu-node-2": 8}, seen=clock.t + 86400)
                assert await ext.cache.refresh_once(), ext.cache.last_error
                assert passing(ext, ["gpu-node-1", "gpu-node-2"]) == ["gpu-node-1", "gpu-node-2"]
                clock.t += 1
            for _ in range(7):  # node 1's series vanish; node 2 is on time again
                clock.t += 1
                prom.set_gpus(clock.t, {"gpu-node-2": 8})
                assert await ext.cache.refresh_once(), ext.cache.last_error
    finally:
        await source.close()
    assert passing(ext, ["gpu-node-1", "gpu-node-2"]) == ["gpu-node-2"]
    node1 = next(n for n in ext.cache.snapshot.nodes if n.name == "gpu-node-1")
    assert node1.observed_at == 1_800_000_000.0 + 2  # clamped to the local clock when last seen
    warned = [r.getMessage() for r in caplog.records if "in the future" in r.getMessage()]
    assert len(warned) == 2 and all("86400 s in the future" in w for w in warned)  # once per node, naming it
    assert {w.split("node ")[1].split("'")[0] for w in warned} == {"gpu-node-1", "gpu-node-2"}
    assert source.bad_samples["future_timestamp"] == 2


# -- item 10: implausible values and labels ------------------------------------------------------------------------


async def test_an_implausible_memory_total_drops_one_gpu_names_it_once_and_recovers(
    prom: FakePrometheus, caplog: pytest.LogCaptureFixture
) -> None:
    """A memory total of 1e30 bytes: that GPU is left out (one warning naming the query, the series and the value,
    counted), the rest of the fleet is placed, and the next refresh after the value is fixed has the GPU back."""
    clock = Clock()
    ext, source = extender(prom, clock)
    bad = {
        ("total", "gpu-node-1"): [
            {
                "metric": {"node": "gpu-node-1", "gpu": str(g), "uuid": f"GPU-1-{g}", "model": "NVIDIA H100 80GB HBM3"},
                "value": [clock.t, "1e30" if g == 0 else str(80 * 2**30)],
            }
            for g in range(8)
        ]
    }
    try:
        with caplog.at_level(logging.WARNING, logger="scheduler_plugin.telemetry.prometheus"):
            for _ in range(3):
                prom.set_gpus(clock.t, {"gpu-node-1": 8, "gpu-node-2": 8}, overrides=bad)
                assert await ext.cache.refresh_once(), ext.cache.last_error
                clock.t += 1
        nodes = {n.name: n for n in ext.cache.snapshot.nodes}
        assert [g.index for g in nodes["gpu-node-1"].gpus] == [1, 2, 3, 4, 5, 6, 7]
        assert len(nodes["gpu-node-2"].gpus) == 8
        assert passing(ext, ["gpu-node-1", "gpu-node-2"]) == ["gpu-node-1", "gpu-node-2"]
        prom.set_gpus(clock.t, {"gpu-node-1": 8, "gpu-node-2": 8})
        assert await ext.cache.refresh_once(), ext.cache.last_error
        assert len({n.name: n for n in ext.cache.snapshot.nodes}["gpu-node-1"].gpus) == 8  # back at once
    finally:
        await source.close()
    warned = [r.getMessage() for r in caplog.records if "dropped series" in r.getMessage()]
    assert len(warned) == 1, warned  # rate-limited: one warning for three refreshes
    assert KELVIN_QUERIES["total"] in warned[0] and "'gpu': '0'" in warned[0] and "'1e30'" in warned[0]
    assert "outside 0..9.0072e+15 bytes" in warned[0]
    assert source.bad_samples["out_of_range"] >= 1


async def test_a_label_that_is_not_a_string_drops_that_series_only(
    prom: FakePrometheus, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    ext, source = extender(prom, clock)
    odd = {("used", "gpu-node-1"): [{"metric": {"node": "gpu-node-1", "gpu": 0}, "value": [clock.t, "1"]}]}
    prom.set_gpus(clock.t, {"gpu-node-1": 1, "gpu-node-2": 1}, overrides=odd)
    try:
        with caplog.at_level(logging.WARNING, logger="scheduler_plugin.telemetry.prometheus"):
            assert await ext.cache.refresh_once(), ext.cache.last_error
    finally:
        await source.close()
    assert [n.name for n in ext.cache.snapshot.nodes] == ["gpu-node-2"]
    warned = [r.getMessage() for r in caplog.records if "label values must be strings" in r.getMessage()]
    assert len(warned) == 1 and "'gpu': 0" in warned[0] and KELVIN_QUERIES["used"] in warned[0]
    assert source.bad_samples["bad_labels"] == 1


@pytest.mark.parametrize(
    ("signal", "value", "why"),
    [
        ("temp", "10000", "outside -50..200 °C"),
        ("temp", "NaN", "not a finite number"),
        ("power", "-5", "outside 0..100000 W"),
        ("util", "3", "outside 0..1 (a ratio)"),
        ("numa", "1e12", "outside -1..4095"),
    ],
)
async def test_each_signal_is_checked_against_its_range(
    prom: FakePrometheus, caplog: pytest.LogCaptureFixture, signal: str, value: str, why: str
) -> None:
    clock = Clock()
    source = PrometheusSource(prom.url, metrics="kelvin", clock=clock)
    item = {"metric": {"node": "n1", "gpu": "0"}, "value": [clock.t, value]}
    prom.set_gpus(clock.t, {"n1": 1, "n2": 1}, overrides={(signal, "n1"): [item]})
    try:
        with caplog.at_level(logging.WARNING, logger="scheduler_plugin.telemetry.prometheus"):
            nodes = {n.name: n for n in await source.fetch()}
    finally:
        await source.close()
    assert set(nodes) == {"n1", "n2"}  # the node stays, without that signal
    warned = [r.getMessage() for r in caplog.records if "dropped series" in r.getMessage()]
    assert len(warned) == 1 and why in warned[0] and repr(value) in warned[0]
