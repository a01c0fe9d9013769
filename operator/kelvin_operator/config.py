"""The operator's configuration: every limit, threshold and mode, in one validated pydantic model.

Sources, later ones winning: defaults, the ``operator:`` section of the policy YAML file (the same file the extender
reads; a top-level ``hotness:`` section is shared with the extender unless ``operator.hotness`` overrides it), then
``KELVIN_OPERATOR_*`` environment variables (nested with ``__``, e.g. ``KELVIN_OPERATOR_LIMITS__MAX_TOTAL=3``), then
CLI flags. A bad value stops startup with :class:`~scheduler_plugin.config.ConfigError` naming the field.

The policy file's keys are camelCase in every section (``operator: {dryRun: true, limits: {maxTotal: 3}}``; a field
``*_s`` is ``*Seconds``: ``intervalSeconds``), the old snake_case spelling accepted with one warning per key
(:mod:`scheduler_plugin.policies.keys`). The operator validates the whole file, the extender's sections included, so a
file one of them refuses never starts the other.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from scheduler_plugin.config import ConfigError
from scheduler_plugin.hotness import HotnessConfig
from scheduler_plugin.policies import Framework, PolicyConfig
from scheduler_plugin.policies.keys import display_path, normalise
from scheduler_plugin.policies.registry import PolicyConfigError

log = logging.getLogger("kelvin.operator")

ENV_PREFIX = "KELVIN_OPERATOR_"
SYSTEM_CRITICAL_PRIORITY = 2_000_000_000


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LimitsConfig(_Section):
    """Owned by the evictor alone. A pending checkpoint handshake holds its node's per-cycle slot."""

    max_per_node_per_cycle: int = Field(1, ge=0, description="evictions per node in one cycle")
    max_per_namespace: int = Field(2, ge=0, description="evictions per namespace within window_s")
    max_total: int = Field(5, ge=0, description="evictions in the whole cluster within window_s")
    window_s: float = Field(600.0, gt=0, description="the sliding window of the namespace and cluster limits")


class ProtectionConfig(_Section):
    min_pod_age_s: float = Field(300.0, ge=0, description="pods younger than this are never evicted")
    allow_bare_pods: bool = Field(False, description="evict pods without an owner (nothing recreates them)")
    system_priority: int = Field(SYSTEM_CRITICAL_PRIORITY, description="pods at or above this priority are protected")
    protected_namespaces: tuple[str, ...] = Field(("kube-system",), description="never evict pods here")


class CheckpointConfig(_Section):
    timeout_s: float = Field(600.0, gt=0, description="evict anyway this long after requesting a checkpoint")


class NoisyConfig(_Section):
    enabled: bool = True
    busy_utilization: float = Field(0.9, gt=0, le=1, description="a shared GPU this busy may have a noisy tenant")
    over_share_ratio: float = Field(
        1.5, ge=1, description="an offender uses more than this times its compute share (kelvin.dev/gpu-share)"
    )
    starved_ratio: float = Field(0.5, gt=0, le=1, description="a victim gets less than this share of its compute share")


class PoolMode(StrEnum):
    AUDIT = "audit"
    WARN = "warn"
    EVICT = "evict"


class PoolConfig(_Section):
    enabled: bool = True
    mode: PoolMode = PoolMode.WARN
    tolerance_ratio: float = Field(0.05, ge=0, le=10, description="allowed excess over the pool before acting")
    grace_s: float = Field(120.0, ge=0, description="how long a pod may stay over its pool before acting")


class WebhookConfig(_Section):
    enabled: bool = True
    addr: str = "0.0.0.0"
    port: int = Field(9443, ge=1, le=65535)
    host: str | None = Field(None, description="DNS name the API server uses (the Service's), put in the cert")
    certfile: Path | None = Field(None, description="server certificate (cert-manager); self-signed when absent")
    pkeyfile: Path | None = None
    managed: str | None = Field(
        None, description="name of the webhook configurations kopf creates and keeps in sync (None: Helm owns them)"
    )
    mps_label: str = Field("kelvin.dev/mps", description="node label (true) of node pools running CUDA MPS")
    framework_env: bool = Field(True, description="also inject PYTORCH_CUDA_ALLOC_CONF and TF memory envs")
    shared_gpu_resource: bool = Field(
        False,
        description="kelvin device plugins advertise kelvin.dev/shared-gpu: the mutating webhook requests one for a "
        "pool-only pod (kelvin.dev/gpu-memory or gpu-share, no GPU resource); off: the validating webhook rejects it",
    )

    @model_validator(mode="after")
    def _pair(self) -> WebhookConfig:
        if (self.certfile is None) != (self.pkeyfile is None):
            raise ValueError("certfile and pkeyfile must be given together")
        return self


class OperatorConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", validate_default=True, frozen=True
    )

    interval_s: float = Field(30.0, gt=0, le=3600, description="seconds between two cycles over a node")
    dry_run: bool = Field(False, description="log and emit Events, write nothing else")
    taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"
    max_telemetry_age_s: float = Field(120.0, gt=0, description="older node telemetry counts as missing")
    thermal_enabled: bool = True
    hotness: HotnessConfig = HotnessConfig()
    limits: LimitsConfig = LimitsConfig()
    protection: ProtectionConfig = ProtectionConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    noisy: NoisyConfig = NoisyConfig()
    pools: PoolConfig = PoolConfig()
    webhook: WebhookConfig = WebhookConfig()
    metrics_port: int = Field(8080, ge=0, le=65535, description="0 disables the /metrics server")
    metrics_addr: str = Field("0.0.0.0", description="address the /metrics server listens on")
    peering: str = Field("kelvin", description="kopf peering name (a ClusterKopfPeering object of that name)")
    peering_priority: int | None = Field(
        None,
        ge=1,
        description="this replica's kopf peering priority; None: random per start, so that of two replicas "
        "exactly one (the higher) acts; kopf pauses all replicas of equal priority",
    )
    standalone: bool = Field(False, description="no peering: only for a single replica or tests")
    events_namespace: Literal["default"] = Field(
        "default",
        description="namespace of Events about Nodes: only 'default', the one the API server accepts for Events "
        "about cluster-scoped objects (another is refused, 422 'involvedObject.namespace ... does not match "
        "event.namespace'); kept so that policy files spelling it out still load",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # init (CLI flags) > env > the policy file's section, which load_operator_config passes as init defaults
        return init_settings, env_settings


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_policy_section(path: Path) -> dict[str, Any]:
    """The ``operator:`` section of the policy file in field names, with the shared top-level ``hotness:`` folded in.

    The whole file is validated as the extender validates it (unknown sections and keys, bad values, unknown policy
    names and args: :class:`ConfigError` naming the path). Keys in the old snake_case spelling are logged once each.
    """
    source = f"policy file {path}"
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{source}: cannot read: {exc}") from None
    try:  # an empty file or section is {}; a section that is not a mapping is refused here, naming it
        policy = PolicyConfig.from_mapping(doc, source=source)
    except PolicyConfigError as exc:
        raise ConfigError(str(exc)) from None
    try:  # the registry's errors name the key but not the file
        Framework.from_config(policy)
    except PolicyConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    section = policy.operator
    keys = normalise(OperatorConfig, section, "operator.")
    if keys.duplicates:
        raise ConfigError(f"{source}: " + "; ".join(keys.duplicates))
    for r in keys.renamed:
        log.warning("%s", r.warning(source))
    out: dict[str, Any] = dict(keys.data)
    if "hotness" in policy.model_fields_set and "hotness" not in out:
        out["hotness"] = policy.hotness.model_dump()
    return out


def load_operator_config(policy_file: Path | None = None, **overrides: Any) -> OperatorConfig:
    """The operator's configuration. Raises :class:`ConfigError` naming every bad field.

    Precedence: CLI ``overrides`` (``None`` ignored) > ``KELVIN_OPERATOR_*`` env > the policy file > defaults.
    """
    from_file = read_policy_section(policy_file) if policy_file else {}
    flags = {k: v for k, v in overrides.items() if v is not None}
    try:
        env_only = OperatorConfig.model_validate({})  # env applied on top of defaults
        env_set = env_only.model_dump(exclude_unset=True, mode="python")
        data = _merge(_merge(from_file, env_set), flags)
        return OperatorConfig(**data)
    except ValidationError as exc:
        where = f" (policy file {policy_file}, or env)" if policy_file else ""
        raise ConfigError(f"operator settings{where}: " + _describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    """Every bad field as ``operator.limits.maxTotal (KELVIN_OPERATOR_LIMITS__MAX_TOTAL): problem (got x)``."""
    parts = []
    for e in exc.errors():
        loc = [str(p) for p in e["loc"]]
        name = "operator." + display_path(OperatorConfig, loc) if loc else "operator"
        env = f" ({ENV_PREFIX}{'__'.join(loc).upper()})" if loc and e["type"] != "extra_forbidden" else ""
        got = e.get("input")
        shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        parts.append(f"{name}{env}: {e['msg']}{shown}")
    return "; ".join(parts)
