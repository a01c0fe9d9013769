"""The operator's settings model, shared: the operator runs with it, and the extender validates the policy file's
``operator:`` section with it, so that one file refused by either starts neither.

It lives here, not in ``kelvin_operator`` (which imports ``scheduler_plugin``, never the other way round); the operator
loads it (``kelvin_operator.settings``): defaults, the policy file's section, ``KELVIN_OPERATOR_*`` environment
variables (nested with ``__``: ``KELVIN_OPERATOR_LIMITS__MAX_TOTAL=3``), CLI flags. Field names are snake_case; the
policy file spells them in camelCase (:mod:`scheduler_plugin.policies.keys`). Floats must be finite everywhere.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .gang.levels import GangPolicy
from .hotness import HotnessConfig

ENV_PREFIX = "KELVIN_OPERATOR_"
SYSTEM_CRITICAL_PRIORITY = 2_000_000_000


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


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


class ThermalEvictionConfig(_Section):
    """When the thermal strategy moves a pod off a hot node's warm GPU (the node is tainted either way)."""

    rule: Literal["pays", "warm"] = Field(
        "pays",
        description="pays: only a pod on a thermally throttling GPU whose eviction saves more GPU-time than it costs "
        "(remaining work slowed by the clock ratio against the work since its last checkpoint plus a restart); warm: "
        "every pod on a GPU that triggers hotness or is still warm",
    )
    restart_s: float = Field(120.0, ge=0, description="what an evicted pod pays to start again (image, load, resume)")
    max_remaining_s: float = Field(
        3600.0,
        gt=0,
        description="the most remaining work assumed for a pod; it is estimated as the pod's age (a job that has run "
        "for t tends to run about t more)",
    )


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
    gang_gates: bool = Field(
        False,
        description="the mutating webhook adds the kelvin.dev/gang scheduling gate to gang members, held until the "
        "operator's gang planner has planned the whole gang (docs/jobs.md)",
    )

    @field_validator("addr")
    @classmethod
    def _addr(cls, v: str) -> str:
        return listen_address(v)

    @model_validator(mode="after")
    def _pair(self) -> WebhookConfig:
        if (self.certfile is None) != (self.pkeyfile is None):
            raise ValueError("certfile and pkeyfile must be given together")
        return self


class OperatorConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
        frozen=True,
        allow_inf_nan=False,
    )

    interval_s: float = Field(30.0, gt=0, le=3600, description="seconds between two cycles over a node")
    dry_run: bool = Field(False, description="log and emit Events, write nothing else")
    taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"
    max_telemetry_age_s: float = Field(120.0, gt=0, description="older node telemetry counts as missing")
    thermal_enabled: bool = True
    hotness: HotnessConfig = HotnessConfig()
    thermal_eviction: ThermalEvictionConfig = ThermalEvictionConfig()
    gang: GangPolicy = GangPolicy()
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

    @field_validator("metrics_addr")
    @classmethod
    def _metrics_addr(cls, v: str) -> str:
        return listen_address(v)


class FileSection(OperatorConfig):
    """The policy file's ``operator:`` section alone (no environment): what the extender and the operator both refuse
    in the file, before the operator puts its environment and flags on top."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def listen_address(value: str) -> str:
    """An address to listen on: an IP address (``0.0.0.0``, ``::``, ``127.0.0.1``) or ``localhost``; ValueError
    otherwise, so that ``not an address`` stops startup naming the field instead of failing to resolve at bind."""
    text = value.strip()
    if text == "localhost":
        return text
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError("must be an IP address to listen on, e.g. 0.0.0.0, :: or 127.0.0.1") from None


def env_names(model: type[BaseModel] = OperatorConfig, prefix: str = ENV_PREFIX) -> Iterator[str]:
    """Every ``KELVIN_OPERATOR_*`` variable the operator reads: one per field, and per field of a section
    (``KELVIN_OPERATOR_LIMITS`` as JSON, ``KELVIN_OPERATOR_LIMITS__MAX_TOTAL``)."""
    for name, info in model.model_fields.items():
        env = prefix + name.upper()
        yield env
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from env_names(ann, env + "__")


def unknown_env_vars(environ: Mapping[str, str]) -> list[str]:
    """``KELVIN_OPERATOR_*`` variables (in any case: pydantic-settings reads them so) that name no setting."""
    known = set(env_names())
    return sorted(k for k in environ if (up := k.upper()).startswith(ENV_PREFIX) and up not in known)
