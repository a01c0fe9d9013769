"""Assembling the extender: settings + policy file -> framework, telemetry source, snapshot cache, binder, FastAPI app.

:func:`build_extender` validates everything that can be wrong in the configuration and raises
:class:`StartupError` whose message names the field; the CLI prints it and exits without a traceback.
:func:`create_app` wraps an :class:`Extender` in a FastAPI app whose lifespan starts and stops the snapshot cache.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from .. import __version__, sources
from ..kubeapi import KubeClient, KubeConfig, KubeError
from ..policies.framework import Framework
from ..policies.ledger import AssumedLedger
from ..policies.plugins import PRODUCTION
from ..policies.policy_file import PolicyConfig
from ..policies.registry import PolicyConfigError, Registry
from ..settings import ConfigError, Settings
from ..simulator.simulated_fleet import FleetSpecError, SimulatedFleetSource
from ..telemetry.assignments import AssignedSource
from ..telemetry.cache import CacheSettings, SnapshotCache, TelemetryMetrics
from ..telemetry.source import TelemetrySource
from .binder import Binder, KubeBinder, LocalBinder, NoApiBinder
from .metrics import ExtenderMetrics
from .node_labels import NodeLabelLister
from .pdb_lister import PdbLister
from .routes import ExtenderApp, install_health_routes, install_routes
from .service import Extender

App = TypeVar("App", bound=FastAPI)


class StartupError(RuntimeError):
    """Configuration that stops the extender from starting; the message names the field or file."""


def load_policy(settings: Settings) -> PolicyConfig:
    if settings.policy_file is None:
        return PolicyConfig()
    try:
        return PolicyConfig.from_yaml(settings.policy_file)
    except PolicyConfigError as exc:
        raise StartupError(f"policy_file (KELVIN_POLICY_FILE): {exc}") from None


def build_source(settings: Settings) -> TelemetrySource:
    try:
        return sources.build_source(settings)
    except FleetSpecError as exc:
        raise StartupError(f"fleet_file (KELVIN_FLEET_FILE): {exc}" if settings.fleet_file else str(exc)) from None
    except (ConfigError, ValueError, KubeError) as exc:
        raise StartupError(f"source (KELVIN_SOURCE={settings.source}): {exc}") from None


def kube_client(settings: Settings) -> KubeClient | None:
    """A client when an API server is configured (explicit URL, kubeconfig, or in-cluster); else None."""
    if not (
        settings.kube_server
        or settings.kubeconfig
        or os.environ.get("KUBECONFIG")
        or os.environ.get("KUBERNETES_SERVICE_HOST")
    ):
        return None
    try:
        return KubeClient(KubeConfig.load(settings.kubeconfig, settings.kube_server))
    except (KubeError, OSError) as exc:
        field = "kube_server (KELVIN_KUBE_SERVER)" if settings.kube_server else "kubeconfig (KELVIN_KUBECONFIG)"
        raise StartupError(f"{field}: {exc}") from None


def build_extender(
    settings: Settings,
    *,
    policy: PolicyConfig | None = None,
    source: TelemetrySource | None = None,
    binder: Binder | None = None,
    clock: Callable[[], float] = time.time,
    registry: CollectorRegistry | None = None,
    plugins: Registry = PRODUCTION,
    freeze_gc: bool = False,
) -> Extender:
    """Everything the service needs, validated. Raises :class:`StartupError` naming the bad field. ``plugins`` is
    the policy registry the policy's names are looked up in: the production one (the demo's comparison run passes
    the simulator's). ``freeze_gc``: for the long-lived server process (``kelvin extender``), see
    :attr:`CacheSettings.freeze_gc`."""
    policy = policy if policy is not None else load_policy(settings)
    ledger = AssumedLedger(policy.ledger.ttl_seconds)
    try:
        framework = Framework.from_config(policy, ledger=ledger, plugins=plugins)
    except PolicyConfigError as exc:
        where = f"policy_file {settings.policy_file}" if settings.policy_file else "policy"
        raise StartupError(f"{where}: {exc}") from None
    if source is None:
        source = build_source(settings)
    pdbs: PdbLister | None = None
    node_labels: NodeLabelLister | None = None
    if binder is None:
        client = kube_client(settings)
        if client is not None:
            binder = KubeBinder(client)
            pdbs = PdbLister(client)
            if policy.gang.levels:
                node_labels = NodeLabelLister(client, [lv.label for lv in policy.gang.levels])
            if not isinstance(source, SimulatedFleetSource):
                source = AssignedSource(source, client, list_interval_s=settings.refresh_interval_s)
        elif isinstance(source, SimulatedFleetSource):
            binder = LocalBinder()
        else:
            binder = NoApiBinder(
                "no Kubernetes API configured (set KELVIN_KUBECONFIG or KELVIN_KUBE_SERVER, or run in a cluster)"
            )
    registry = registry if registry is not None else CollectorRegistry()
    metrics = ExtenderMetrics(registry)
    cache = SnapshotCache(
        source,
        CacheSettings(
            refresh_interval_s=settings.refresh_interval_s,
            max_age_s=settings.max_telemetry_age_s,
            freeze_gc=freeze_gc,
        ),
        ledger=ledger,
        metrics=TelemetryMetrics(registry, source.name),
        clock=clock,
        on_publish=lambda snap: framework.warm(snap.arrays),
    )
    if isinstance(source, SimulatedFleetSource):  # its fetch builds 40,000 objects: in slices, around requests
        source.pause = cache.gate.pause
    return Extender(
        settings=settings,
        policy=policy,
        framework=framework,
        ledger=ledger,
        cache=cache,
        source=source,
        binder=binder,
        metrics=metrics,
        clock=clock,
        plugins=plugins,
        pdbs=pdbs,
        node_labels=node_labels,
    )


def create_app(ext: Extender, *, metrics: bool = True) -> ExtenderApp:
    """The verbs app; it owns the extender's lifespan (snapshot refresh). With ``metrics`` it also serves /readyz
    and /metrics (one listener for everything: tests, the demo, ``metrics_port: 0``); without, they are served by
    :func:`create_metrics_app` on the metrics listener. /healthz is served on both."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await ext.cache.start()
        if ext.pdbs is not None:
            await ext.pdbs.start()
        if ext.node_labels is not None:
            await ext.node_labels.start()
        try:
            yield
        finally:
            if ext.node_labels is not None:
                await ext.node_labels.stop()
            if ext.pdbs is not None:
                await ext.pdbs.stop()
            await ext.cache.stop()
            await ext.source.close()
            await ext.binder.close()

    app = _bare_app(ExtenderApp, "kelvin extender", lifespan=lifespan)
    app.state.extender = ext
    install_routes(app, ext, health=metrics)
    return app


def _bare_app(cls: type[App], title: str, **kwargs: Any) -> App:
    """A FastAPI app (of class ``cls``) with no OpenAPI schema or docs pages, and no redirect of "/filter/" to
    "/filter" (a 307 that kube-scheduler would not follow with its body): kelvin serves exactly its routes, anything
    else is a 404."""
    return cls(
        title=title,
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,
        **kwargs,
    )


def create_metrics_app(ext: Extender) -> FastAPI:
    """/healthz, /readyz and /metrics only, for the metrics listener (``metrics_host:metrics_port``): what probes
    and Prometheus reach, while the verbs stay on loopback. It shares ``ext`` and the event loop with the verbs app
    and has no lifespan of its own."""
    app = _bare_app(FastAPI, "kelvin extender metrics")
    app.state.extender = ext
    install_health_routes(app, ext)
    return app
