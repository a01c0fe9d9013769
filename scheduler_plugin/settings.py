"""Process settings of the extender (environment variables with the prefix ``KELVIN_``, or CLI flags).

Scoring weights and thresholds live in the policy YAML file (``policy_file``, see ``policies/policy_file.py``); this
module holds where telemetry comes from, how the service listens and how big the simulated fleet is. Every field is
listed in docs/configuration.md. A bad value stops startup with :class:`ConfigError`, whose message names the field.
"""

from __future__ import annotations

import difflib
import ipaddress
import logging
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import Field, ValidationError, field_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, SettingsConfigDict

#: 64 MiB: a nodeCacheCapable=false request carries whole Node objects. The Node of the real kube-scheduler capture
#: (fixtures/extender/*nodecache-false*) is 2.5 kB, so 5,000 of them are 12.4 MB; 64 MiB leaves 13 kB a node for
#: production nodes (feature-discovery labels, the kubelet's 50 image entries, managedFields). A NodeNames body
#: (nodeCacheCapable true) is ~20 bytes a node: 100 kB for 5,000 nodes. See docs/configuration.md.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
#: More nodes than the largest supported clusters (GKE: 65,000) send in one request (kube-scheduler sends the nodes
#: that passed its own filters, at most every node).
DEFAULT_MAX_NODE_NAMES = 100_000
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
ENV_PREFIX = "KELVIN_"
#: ``KELVIN_*`` variables that are not the extender's to refuse: the operator's settings (``kelvin_operator.settings``;
#: the chart gives the operator's container both its own and the shared telemetry settings) ...
SIBLING_PREFIXES = ("KELVIN_OPERATOR_",)
#: ... what kelvin's mutating webhook injects into workloads (``kelvin_operator.webhooks``), where the tests and
#: benchmarks find the shared fixtures and traces (tests/conftest.py), and the cache root of the Kubernetes binaries
#: (hack/build-kube.sh, docs/e2e.md): set for a test run, it reaches every kelvin process the e2e suite starts.
OTHER_VARIABLES = frozenset({"KELVIN_GPU_MEMORY_LIMIT_BYTES", "KELVIN_SHARED_DIR", "KELVIN_KUBE_CACHE"})


class ConfigError(ValueError):
    """Settings that cannot be used; the message names every bad field (and its env var)."""


class Settings(BaseSettings):
    # allow_inf_nan=False: `KELVIN_MAX_TELEMETRY_AGE_S=inf` (or nan) is refused naming the field, not a snapshot that
    # never goes stale
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True, allow_inf_nan=False)

    # telemetry
    source: Literal["simulated", "prometheus", "scrape"] = "simulated"
    policy_file: Path | None = None
    refresh_interval_s: float = Field(5.0, gt=0, le=3600)
    max_telemetry_age_s: float = Field(30.0, gt=0)
    # prometheus source
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    prometheus_metrics: Literal["auto", "kelvin", "dcgm"] = "auto"
    prometheus_timeout_s: float = Field(5.0, gt=0, le=120)
    # scrape source
    scrape_service: str = "kelvin-exporter"
    scrape_namespace: str = "kelvin-system"
    scrape_port: int = Field(9400, ge=1, le=65535)
    # kubernetes API
    kube_server: str | None = None
    kubeconfig: str | None = None
    # simulated fleet
    fleet_file: Path | None = None
    fleet_nodes: int = Field(64, ge=1, le=100_000)
    fleet_gpus_per_node: int = Field(8, ge=1, le=16)
    fleet_model: str = "H100-SXM-80GB"
    fleet_seed: int = Field(0, ge=0)
    """numpy's random generator takes a non-negative seed."""
    # service: the verbs (filter, prioritize, bind, explain) on host:port, loopback by default because kube-scheduler
    # runs beside the extender in the same pod; /healthz, /readyz and /metrics on metrics_host:metrics_port
    host: str = "127.0.0.1"
    port: int = Field(8888, ge=0, le=65535)
    metrics_host: str = "0.0.0.0"
    metrics_port: int = Field(8889, ge=0, le=65535)
    """0 serves /healthz, /readyz and /metrics on the verbs port instead (one listener, e.g. for a local run)."""
    bind_enabled: bool = True
    bind_timeout_s: float = Field(4.0, gt=0, le=60)
    """Deadline of one bind, from the request's arrival: keep it below kube-scheduler's extender httpTimeout."""
    shared_slots_per_gpu: int = Field(16, ge=1, le=128)
    """``kelvin.dev/shared-gpu`` slots the device plugin advertises per GPU (its ``--shared-slots-per-gpu``): the
    preempt verb's count of a node's free slots, as kube-scheduler counts them."""
    # request limits (a bigger request is answered 413 naming the limit)
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1024)
    max_node_names: int = Field(DEFAULT_MAX_NODE_NAMES, ge=1)

    @field_validator("prometheus_url")
    @classmethod
    def _prometheus_base_url(cls, v: str) -> str:
        text, url = http_url(v, "http://prometheus.monitoring:9090")
        if "/api/v1" in url.path:
            raise ValueError("give Prometheus' base URL, without /api/v1/... (kelvin adds /api/v1/query itself)")
        return text

    @field_validator("kube_server")
    @classmethod
    def _kube_server_url(cls, v: str | None) -> str | None:
        return None if v is None else kube_server_url(v)


def http_url(value: str, example: str) -> tuple[str, httpx.URL]:
    """``value`` stripped, and parsed: an ``http``/``https`` URL with a host and no whitespace, else ValueError."""
    text = value.strip()
    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ValueError(f"not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host or any(c.isspace() for c in text):
        raise ValueError(f"must be an http(s) URL with a host, e.g. {example}")
    return text, url


def kube_server_url(value: str) -> str:
    """A Kubernetes API server URL (``https://host:6443``, a path prefix allowed), without its trailing ``/``;
    ValueError naming the problem. Credentials go in a kubeconfig, never in the URL (it is logged)."""
    text, url = http_url(value, "https://10.0.0.1:6443")
    if url.userinfo:
        raise ValueError("must not carry credentials (user:password@); give them in a kubeconfig")
    if url.query or url.fragment:
        raise ValueError("must not have a query or fragment")
    return text.rstrip("/")


log = logging.getLogger("kelvin.config")


def _env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with ``overrides`` (CLI flags; ``None`` values are ignored) on top.

    Raises :class:`ConfigError` naming each bad field, e.g. ``port (KELVIN_PORT): Input should be less than or equal
    to 65535 (got 70000)``.
    """
    kwargs = {k: v for k, v in overrides.items() if v is not None}
    unknown = unknown_env_vars(os.environ)
    if unknown:
        from .operator_settings import env_names  # a typo of the operator's prefix is the operator's variable

        known = [*(_env_name(f) for f in Settings.model_fields), *env_names()]
        raise ConfigError("; ".join(unknown_variable(name, known) for name in unknown))
    try:
        settings = Settings(**kwargs)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, env=True)) from None
    if settings.max_telemetry_age_s <= settings.refresh_interval_s:
        # A deployment so configured turns every snapshot stale before the next refresh and flaps readiness.
        # (Checked here, at startup, not in the model: tests and benchmarks build Settings that never refresh.)
        raise ConfigError(
            f"max_telemetry_age_s ({_env_name('max_telemetry_age_s')}): {settings.max_telemetry_age_s:g} s must be "
            f"more than refresh_interval_s ({_env_name('refresh_interval_s')}, {settings.refresh_interval_s:g} s); "
            "at least twice it is advised"
        )
    check_listeners(settings)
    return settings


def check_listeners(settings: Settings) -> None:
    """Refuse a metrics listener on the verbs listener's address (both would bind the same port)."""
    if not settings.metrics_port or settings.metrics_port != settings.port:
        return
    hosts = {settings.host, settings.metrics_host}
    if len(hosts) == 1 or hosts & WILDCARD_HOSTS:
        raise ConfigError(
            f"metrics_port ({_env_name('metrics_port')}) {settings.metrics_port} is also port ({_env_name('port')}) "
            f"on host {settings.host} / metrics_host {settings.metrics_host}: serve /metrics and the probes on "
            "another port (or set metrics_port 0 to serve them on the verbs port)"
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or ``localhost``) only accepts connections from this machine / pod."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def unknown_env_vars(environ: Mapping[str, str]) -> list[str]:
    """``KELVIN_*`` variables that name no setting (a sibling's, :data:`SIBLING_PREFIXES`, are not this one's), so that
    a typo such as ``KELVIN_PROMETEUS_URL`` stops startup instead of silently leaving the default in force."""
    known = {_env_name(f) for f in Settings.model_fields} | OTHER_VARIABLES
    return sorted(
        k
        for k in environ
        # pydantic-settings reads names case-insensitively (kelvin_port is KELVIN_PORT): so does this check
        if (up := k.upper()).startswith(ENV_PREFIX) and not up.startswith(SIBLING_PREFIXES) and up not in known
    )


def unknown_variable(name: str, known: Collection[str]) -> str:
    """``KELVIN_X: unknown setting; did you mean KELVIN_Y?``: the closest known names (difflib), or where to look."""
    close = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.75)
    hint = f"did you mean {close[0]}?" if close else "see docs/configuration.md for the settings"
    return f"{name}: unknown setting (environment variable); {hint}"


def error_message(error: ErrorDetails) -> str:
    """pydantic's message of one error, without the ``Value error, `` that it puts before a validator's own."""
    return error["msg"].removeprefix("Value error, ")


def format_validation_error(exc: ValidationError, *, env: bool = False, prefix: str = "") -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"])
        name = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or "value")
        if env and e["loc"]:
            name += f" ({_env_name(str(e['loc'][0]))})"
        got = e.get("input")
        shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        parts.append(f"{name}: {error_message(e)}{shown}")
    return "; ".join(parts)
