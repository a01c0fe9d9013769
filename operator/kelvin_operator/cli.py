"""``kelvin operator``: run the kopf operator. Registered with one line in ``scheduler_plugin/cli.py``.

Configuration errors end the command with exit code 2 and one message naming the field, never a traceback. A
listener that cannot start (the webhook's, /metrics' or kopf's liveness port in use, an address that cannot be bound,
the webhook certificate unusable) ends it with exit code 3, as the extender's failed startup, and one ``error:`` line
naming the setting: the ports are tried before anything starts, and the webhook server reports a later failure to
start (kopf starts it after the startup handler) the same way.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from scheduler_plugin.console import STARTUP_FAILURE, LogLevel, LogLevelOption, fail, setup_logging
from scheduler_plugin.textfile import decode_problem, first_undecodable

if TYPE_CHECKING:
    from .settings import OperatorConfig


def _fail(message: str, code: int = 2) -> NoReturn:
    fail(message, code)


def _listen_problem(cfg: OperatorConfig, liveness: str) -> str | None:
    """Why one of the operator's listeners (webhook, /metrics, kopf's liveness probe) cannot start, else ``None``."""
    from .webhook_server import listen_problem

    if cfg.webhook.enabled and (problem := listen_problem(cfg.webhook.addr, cfg.webhook.port)):
        return problem
    metrics = "metrics_addr/metrics_port (KELVIN_OPERATOR_METRICS_ADDR, KELVIN_OPERATOR_METRICS_PORT, --metrics-port)"
    if cfg.metrics_port and (problem := listen_problem(cfg.metrics_addr, cfg.metrics_port, metrics)):
        return problem
    parts = urllib.parse.urlsplit(liveness)
    try:
        port = parts.port or 80
    except ValueError as exc:
        return f"--liveness {liveness!r}: {exc}"
    if parts.scheme != "http":
        return f"--liveness {liveness!r}: must be an http:// URL (kopf serves the probe over plain HTTP)"
    return listen_problem(parts.hostname or "localhost", port, f"--liveness {liveness!r}")


def operator(
    policy_file: Annotated[
        Path | None, typer.Option(metavar="PATH", help="Policy YAML; its operator: section (env KELVIN_POLICY_FILE).")
    ] = None,
    dry_run: Annotated[
        bool | None, typer.Option("--dry-run/--no-dry-run", help="Log and emit Events only (default off).")
    ] = None,
    interval: Annotated[
        float | None, typer.Option(metavar="SECONDS", help="Seconds between cycles over a node (default 30).")
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(metavar="SOURCE", help="Telemetry source: simulated, prometheus or scrape (env KELVIN_SOURCE)."),
    ] = None,
    kubeconfig: Annotated[
        str | None, typer.Option(metavar="PATH", help="kubeconfig path (default: in-cluster).")
    ] = None,
    kube_server: Annotated[
        str | None, typer.Option(metavar="URL", help="API server URL without credentials (tests).")
    ] = None,
    standalone: Annotated[
        bool | None, typer.Option("--standalone/--peering", help="Skip kopf peering (one replica only).")
    ] = None,
    peering: Annotated[
        str | None, typer.Option(metavar="NAME", help="ClusterKopfPeering name (default kelvin).")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(metavar="PORT", help="/metrics port, 0 to disable (default 8080).")
    ] = None,
    webhook_port: Annotated[
        int | None, typer.Option(metavar="PORT", help="HTTPS admission webhook port (default 9443).")
    ] = None,
    liveness: Annotated[
        str, typer.Option(metavar="URL", help="kopf liveness endpoint.")
    ] = "http://0.0.0.0:8081/healthz",
    log_level: LogLevelOption = LogLevel.info,
) -> None:
    """Run the operator: taint and drain hot nodes, act on noisy neighbours, enforce GPU memory pools, serve the
    admission webhooks."""
    import asyncio
    import random

    import kopf

    from scheduler_plugin.kubeapi import KubeConfig, KubeError
    from scheduler_plugin.settings import ConfigError, load_settings
    from scheduler_plugin.sources import build_source

    from .handlers import build_registry
    from .runtime import Runtime
    from .settings import load_operator_config

    try:
        settings = load_settings(source=source, policy_file=policy_file, kubeconfig=kubeconfig, kube_server=kube_server)
        webhook = {"port": webhook_port} if webhook_port is not None else None
        cfg = load_operator_config(
            settings.policy_file,
            dry_run=dry_run,
            interval_s=interval,
            standalone=standalone,
            peering=peering,
            metrics_port=metrics_port,
            webhook=webhook,
        )
        try:
            kube_config = KubeConfig.load(kubeconfig=settings.kubeconfig, server=settings.kube_server)
        except KubeError as exc:
            if settings.kubeconfig or settings.kube_server or os.environ.get("KUBECONFIG"):
                raise
            _fail(
                f"configuration error: {exc}, and no kubeconfig was given: off-cluster, pass --kubeconfig PATH "
                "(or set KELVIN_KUBECONFIG or KUBECONFIG)"
            )
        telemetry = build_source(settings)
    except UnicodeDecodeError as exc:  # a ValueError too: the file readers do not name the file themselves
        env = os.environ.get
        files = (policy_file, env("KELVIN_POLICY_FILE"), kubeconfig, env("KELVIN_KUBECONFIG"), env("KUBECONFIG"))
        _fail(f"configuration error: {first_undecodable(*files) or decode_problem(exc)}")
    except (ConfigError, KubeError, ValueError) as exc:
        _fail(f"configuration error: {exc}")

    # the ports are tried before anything starts (the webhook server reports a later failure the same way)
    problem = _listen_problem(cfg, liveness)
    if problem is not None:
        _fail(problem, STARTUP_FAILURE)

    async def start(c: OperatorConfig) -> Runtime:
        return await Runtime.start(c, kube_config, telemetry, refresh_interval_s=settings.refresh_interval_s)

    setup_logging(log_level)
    # kopf waits for the peering resource whenever a peering name is given, even when standalone
    priority = cfg.peering_priority or random.SystemRandom().randint(1, 2**31 - 1)
    peer_args: dict[str, Any] = {} if cfg.standalone else {"peering_name": cfg.peering, "priority": priority}
    failures: list[str] = []

    async def run() -> None:
        stop = asyncio.Event()

        def failed(message: str) -> None:  # the webhook server cannot start: stop the operator, then say why
            failures.append(message)
            stop.set()

        registry = build_registry(cfg, start, kube_config, on_failure=failed)
        await kopf.operator(
            registry=registry,
            clusterwide=True,
            standalone=cfg.standalone,
            liveness_endpoint=liveness,
            stop_flag=stop,
            **peer_args,
        )

    asyncio.run(run())
    if failures:
        _fail(failures[0], STARTUP_FAILURE)
