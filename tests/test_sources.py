"""build_source picks the source named in the settings, passing their fields through."""

from __future__ import annotations

import pytest

from scheduler_plugin.settings import Settings
from scheduler_plugin.simulator.simulated_fleet import SimulatedFleetSource
from scheduler_plugin.sources import build_source
from scheduler_plugin.telemetry.prometheus import PrometheusSource
from scheduler_plugin.telemetry.scrape import ScrapeSource


async def test_simulated() -> None:
    source = build_source(Settings(source="simulated", fleet_nodes=3, fleet_gpus_per_node=4))
    assert isinstance(source, SimulatedFleetSource)
    nodes = await source.fetch()
    assert len(nodes) == 3 and all(len(n.gpus) == 4 for n in nodes)
    await source.close()


async def test_prometheus() -> None:
    source = build_source(
        Settings(
            source="prometheus", prometheus_url="http://prom:9090/", prometheus_metrics="dcgm", prometheus_timeout_s=2.5
        )
    )
    assert isinstance(source, PrometheusSource)
    assert (source.url, source.metrics, source.name) == ("http://prom:9090", "dcgm", "prometheus")
    await source.close()


def test_prometheus_url_must_be_http() -> None:
    from scheduler_plugin.settings import ConfigError, load_settings

    with pytest.raises(ConfigError, match=r"prometheus_url \(KELVIN_PROMETHEUS_URL\): .*must be an http\(s\) URL"):
        load_settings(source="prometheus", prometheus_url="prom:9090")


async def test_scrape() -> None:
    source = build_source(
        Settings(
            source="scrape",
            kube_server="http://127.0.0.1:1",
            scrape_service="exp",
            scrape_namespace="gpu",
            scrape_port=9500,
        )
    )
    assert isinstance(source, ScrapeSource)
    assert (source.service, source.namespace, source.port) == ("exp", "gpu", 9500)
    await source.close()
