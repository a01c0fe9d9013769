"""Build the telemetry source that the settings name (``source``: simulated, prometheus or scrape)."""

from __future__ import annotations

from .kubeapi import KubeClient, KubeConfig
from .settings import Settings
from .simulator.simulated_fleet import FleetSpec, SimulatedFleetSource
from .telemetry.prometheus import PrometheusSource
from .telemetry.scrape import ScrapeSource
from .telemetry.source import TelemetrySource


def simulated_source(settings: Settings) -> SimulatedFleetSource:
    """The simulated fleet of ``fleet_file``, or a uniform one from the ``fleet_*`` settings. Raises
    :class:`~scheduler_plugin.simulator.simulated_fleet.FleetSpecError` naming the field."""
    if settings.fleet_file is not None:
        return SimulatedFleetSource(FleetSpec.from_yaml(settings.fleet_file))
    return SimulatedFleetSource(
        FleetSpec.uniform(settings.fleet_nodes, settings.fleet_gpus_per_node, settings.fleet_model, settings.fleet_seed)
    )


def build_source(settings: Settings) -> TelemetrySource:
    """The configured source. Raises ``ValueError`` (or ``KubeError``) with the offending setting named."""
    if settings.source == "simulated":
        return simulated_source(settings)
    if settings.source == "prometheus":
        # forget a vanished node after 10 staleness windows (at least 10 minutes)
        return PrometheusSource(
            settings.prometheus_url,
            metrics=settings.prometheus_metrics,
            timeout_s=settings.prometheus_timeout_s,
            forget_after_s=max(600.0, 10 * settings.max_telemetry_age_s),
        )
    if settings.source == "scrape":
        kube = KubeClient(KubeConfig.load(kubeconfig=settings.kubeconfig, server=settings.kube_server))
        return ScrapeSource(
            kube,
            service=settings.scrape_service,
            namespace=settings.scrape_namespace,
            port=settings.scrape_port,
            timeout_s=min(settings.refresh_interval_s, 10.0),
            forget_after_s=max(600.0, 10 * settings.max_telemetry_age_s),
        )
    raise ValueError(f"source (KELVIN_SOURCE): unknown source {settings.source!r}; use simulated, prometheus or scrape")
