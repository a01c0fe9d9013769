"""What a running operator holds (kept in kopf's ``memo``): the API client, the telemetry cache, the reconciler and
the metrics server. Started and stopped by the startup/cleanup handlers."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server

from scheduler_plugin.kubeapi import KubeClient, KubeConfig
from scheduler_plugin.model.snapshot import Snapshot
from scheduler_plugin.telemetry.cache import CacheSettings, SnapshotCache, TelemetryMetrics
from scheduler_plugin.telemetry.source import TelemetrySource

from .k8s import OperatorKube
from .metrics import OperatorMetrics
from .reconcile import Reconciler
from .settings import OperatorConfig, WebhookConfig
from .tls import self_signed

log = logging.getLogger("kelvin.operator")


def operator_kube(cfg: OperatorConfig, client: KubeClient) -> OperatorKube:
    """The operator's API edge, as the running operator builds it."""
    return OperatorKube(client)


@dataclass
class Runtime:
    cfg: OperatorConfig
    client: KubeClient
    cache: SnapshotCache
    metrics: OperatorMetrics
    reconciler: Reconciler
    servers: list[Any] = field(default_factory=list)

    @classmethod
    async def start(
        cls,
        cfg: OperatorConfig,
        kube_config: KubeConfig,
        source: TelemetrySource,
        *,
        refresh_interval_s: float = 10.0,
    ) -> Runtime:
        metrics = OperatorMetrics()
        client = KubeClient(kube_config)
        cache = SnapshotCache(
            source,
            CacheSettings(refresh_interval_s=refresh_interval_s, max_age_s=cfg.max_telemetry_age_s),
            metrics=TelemetryMetrics(metrics.registry, source.name),
        )
        await cache.start()
        rt = cls(cfg, client, cache, metrics, Reconciler(cfg, operator_kube(cfg, client), metrics))
        if cfg.metrics_port:
            server, _thread = start_http_server(cfg.metrics_port, addr=cfg.metrics_addr, registry=metrics.registry)
            rt.servers.append(server)
            log.info("metrics on :%d/metrics", cfg.metrics_port)
        return rt

    def snapshot(self) -> Snapshot:
        return self.cache.snapshot

    async def close(self) -> None:
        await self.cache.stop()
        await self.cache.source.close()
        await self.client.close()
        for s in self.servers:
            s.shutdown()


def webhook_cert(cfg: WebhookConfig) -> tuple[Path, Path]:
    """cert-manager's files when configured, else a fresh self-signed pair for ``host`` (and localhost)."""
    if cfg.certfile is not None and cfg.pkeyfile is not None:
        return cfg.certfile, cfg.pkeyfile
    names = [n for n in (cfg.host, "localhost", "127.0.0.1") if n]
    return self_signed(Path(tempfile.mkdtemp(prefix="kelvin-webhook-")), names)
