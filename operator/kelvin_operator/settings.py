"""Loading the operator's configuration: every limit, threshold and mode, in one validated pydantic model
(:class:`~scheduler_plugin.operator_settings.OperatorConfig`, shared with the extender, re-exported here).

Sources, later ones winning: defaults, the ``operator:`` section of the policy YAML file (the same file the extender
reads; a top-level ``hotness:`` section is shared with the extender unless ``operator.hotness`` overrides it), then
``KELVIN_OPERATOR_*`` environment variables (nested with ``__``, e.g. ``KELVIN_OPERATOR_LIMITS__MAX_TOTAL=3``), then
CLI flags. A bad value stops startup with :class:`~scheduler_plugin.settings.ConfigError` naming the field; so does a
``KELVIN_OPERATOR_*`` variable that names no setting (the closest known names are suggested).

The policy file's keys are camelCase in every section (``operator: {dryRun: true, limits: {maxTotal: 3}}``; a field
``*_s`` is ``*Seconds``: ``intervalSeconds``), the old snake_case spelling accepted with one warning per key
(:mod:`scheduler_plugin.policies.keys`). Both the operator and the extender validate the whole file, each the other's
sections included, so a file one of them refuses never starts the other.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from scheduler_plugin import yamlfile
from scheduler_plugin.operator_settings import (
    ENV_PREFIX,
    SYSTEM_CRITICAL_PRIORITY,
    CheckpointConfig,
    LimitsConfig,
    NoisyConfig,
    OperatorConfig,
    PoolConfig,
    PoolMode,
    ProtectionConfig,
    ThermalEvictionConfig,
    WebhookConfig,
    env_names,
    unknown_env_vars,
)
from scheduler_plugin.policies import Framework, PolicyConfig
from scheduler_plugin.policies.keys import display_path
from scheduler_plugin.policies.registry import PolicyConfigError
from scheduler_plugin.settings import ConfigError, error_message, unknown_variable


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_policy_section(path: Path) -> dict[str, Any]:
    """The ``operator:`` section of the policy file in field names, with the shared top-level ``hotness:`` and
    ``gang:`` folded in.

    The whole file is validated as the extender validates it (duplicate, unknown and bad keys in every section, the
    ``operator:`` section included, unknown policy names and args: :class:`ConfigError` naming the path). Keys in the
    old snake_case spelling are logged once each.
    """
    source = f"policy file {path}"
    try:
        doc = yamlfile.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML ({yamlfile.describe(exc)})") from None
    try:  # an empty file or section is {}; a section that is not a mapping is refused here, naming it
        policy = PolicyConfig.from_mapping(doc, source=source)
    except PolicyConfigError as exc:
        raise ConfigError(str(exc)) from None
    try:  # the registry's errors name the key but not the file
        Framework.from_config(policy)
    except PolicyConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    out: dict[str, Any] = dict(policy.operator)  # validated and in field names (PolicyConfig.from_mapping)
    if "hotness" in policy.model_fields_set and "hotness" not in out:
        out["hotness"] = policy.hotness.model_dump()
    if "gang" in policy.model_fields_set and "gang" not in out:
        out["gang"] = policy.gang.model_dump()
    return out


def check_env(environ: Mapping[str, str]) -> None:
    """Refuse ``KELVIN_OPERATOR_*`` variables that name no setting: ``KELVIN_OPERATOR_DRYRUN=true`` (a typo of
    ``KELVIN_OPERATOR_DRY_RUN``) must not start an operator that evicts. The message names the closest known ones."""
    unknown = unknown_env_vars(environ)
    if unknown:
        known = list(env_names())
        raise ConfigError("; ".join(unknown_variable(name, known) for name in unknown))


def load_operator_config(policy_file: Path | None = None, **overrides: Any) -> OperatorConfig:
    """The operator's configuration. Raises :class:`ConfigError` naming every bad field, and every unknown
    ``KELVIN_OPERATOR_*`` variable.

    Precedence: CLI ``overrides`` (``None`` ignored) > ``KELVIN_OPERATOR_*`` env > the policy file > defaults.
    """
    check_env(os.environ)
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
        parts.append(f"{name}{env}: {error_message(e)}{shown}")
    return "; ".join(parts)


__all__ = [
    "ENV_PREFIX",
    "SYSTEM_CRITICAL_PRIORITY",
    "CheckpointConfig",
    "LimitsConfig",
    "NoisyConfig",
    "OperatorConfig",
    "PoolConfig",
    "PoolMode",
    "ProtectionConfig",
    "ThermalEvictionConfig",
    "WebhookConfig",
    "check_env",
    "load_operator_config",
    "read_policy_section",
]
