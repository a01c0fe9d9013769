"""The policy configuration: which filters and scores run, with what weights and arguments (YAML, validated at load).

Every field has a documented default (docs/policies.md). Keys are camelCase (``maxAgeSeconds``) in every section;
the old snake_case spelling (``max_age_seconds``) is still accepted with one warning per key naming its camelCase
form (:mod:`.keys`). Unknown keys are errors. Structural errors name the field path, e.g.
``scoring.thermal.weight: Input should be greater than or equal to 0``. Policy names and their ``args`` are checked
by :meth:`scheduler_plugin.policies.framework.Framework.from_config` through a registry (the production one,
:mod:`.plugins`, unless the simulator passes its own), which also names the path.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .. import yamlfile
from ..gang.levels import GangPolicy
from ..hotness import HotnessConfig
from ..operator_settings import FileSection
from ..settings import error_message
from .keys import Normalised, Renamed, camel, display_path, normalise
from .registry import Kind, PolicyConfigError, Registry

log = logging.getLogger("kelvin.policy")

DEFAULT_MAX_AGE_S = 30.0
DEFAULT_LEDGER_TTL_S = 30.0
DEFAULT_PICKER = "fragmentation"
#: The FGD paper's best-fit baseline weighs CPU against GPU by the largest node of its trace: 128 cores, 8 GPUs.
DEFAULT_PACK_CPU_SCALE_CORES = 128.0
DEFAULT_PACK_GPU_SCALE = 8.0


class CamelModel(BaseModel):
    """Base of every config and policy-args model: camelCase keys (:func:`.keys.camel`), the field name accepted too,
    unknown keys rejected, floats finite (``.inf`` and ``.nan`` are refused naming the key)."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=camel, populate_by_name=True, frozen=True, allow_inf_nan=False
    )


class TelemetryPolicy(CamelModel):
    max_age_seconds: float = Field(DEFAULT_MAX_AGE_S, gt=0)
    """Telemetry of a node older than this is stale."""
    on_stale: Literal["allow", "deny"] = "deny"
    """``deny``: a node with stale or missing telemetry fails the filter; ``allow``: it is judged on its last data."""


class FilterPolicy(CamelModel):
    thermal_hard_limits: bool = True
    """A GPU at or above its slowdown temperature (minus ``slowdownMarginCelsius``) cannot take the pod."""
    throttle_hard_limit: bool = True
    """A GPU with thermal clock throttling active (NVML sw/hw thermal slowdown) cannot take the pod."""
    slowdown_margin_celsius: float = Field(0.0, ge=0, le=30)
    """Treat a GPU as too hot this many degrees below its slowdown threshold."""
    hot_nodes: bool = True
    """Reject nodes that meet the operator's hot-node entry rule (the ``hotness:`` section), so the scheduler never
    fills a node the operator is about to taint and drain."""


class ScorerConfig(CamelModel):
    weight: float = Field(1.0, ge=0, le=100)
    """Weight of the policy's normalised 0..10 score in the weighted sum; 0 disables it."""
    args: dict[str, Any] = Field(default_factory=dict)
    """The policy's own arguments (see docs/policies.md); checked against its registered model."""


class CpuOnlyPolicy(CamelModel):
    """How pods without GPUs are ranked (kube-scheduler sends them to the extender when the chart's
    scheduler.extender.cpuOnlyPods is on; the simulator ranks every one): a weighted mean of the fragmentation
    policy's score (the GPU capacity the pod's CPU strands) and best fit (the node left with the least free CPU and
    GPU). Both weights 0: every node scores 0."""

    fragmentation_weight: float = Field(0.8, ge=0, le=100)
    """Weight of the ``fragmentation`` policy's normalised score (left out when ``scoring`` has no fragmentation)."""
    pack_weight: float = Field(0.2, ge=0, le=100)
    """Weight of best fit: the node left with the least free CPU and GPU."""
    cpu_scale_cores: float = Field(DEFAULT_PACK_CPU_SCALE_CORES, gt=0, le=100_000)
    """Best fit weighs this many free cores as much as ``gpuScale`` free GPUs (a large node's size)."""
    gpu_scale: float = Field(DEFAULT_PACK_GPU_SCALE, gt=0, le=1_000)
    """Best fit weighs this many free GPUs as much as ``cpuScaleCores`` free cores."""


class LedgerPolicy(CamelModel):
    ttl_seconds: float = Field(DEFAULT_LEDGER_TTL_S, gt=0, le=3600)
    """How long an assumed (bound, not yet visible in telemetry) placement is remembered at most."""


def _default_scoring() -> dict[str, ScorerConfig]:
    return {
        "fragmentation": ScorerConfig(weight=2.0),
        "topology": ScorerConfig(weight=1.0),
        # A node with one GPU near slowdown must lose whole points against cool nodes (the extender sends integers):
        # weight 2 and nodeShare 0.7 make it ~1.5 of 10 behind; weight 1 and nodeShare 0.3 left it ~0.3 behind, lost
        # in rounding, and `kelvin demo` placed onto hot nodes about as often as a random scheduler.
        "thermal": ScorerConfig(weight=2.0, args={"nodeShare": 0.7}),
        # Measured co-tenant pressure only: counting tenants (crowding) pushed pods off partly used GPUs and nodes even
        # when the co-tenants were idle, deciding the fragmentation score's ties towards spreading; on the Alibaba
        # trace (no telemetry) that stranded ~0.6 pp more GPUs than without it (docs/simulator.md).
        "noise": ScorerConfig(weight=0.5, args={"tenantsWeight": 0.0}),
        "burst": ScorerConfig(weight=1.0),
    }


class PolicyConfig(CamelModel):
    """The whole policy file."""

    telemetry: TelemetryPolicy = Field(default_factory=TelemetryPolicy)
    filters: FilterPolicy = Field(default_factory=FilterPolicy)
    scoring: dict[str, ScorerConfig] = Field(default_factory=_default_scoring)
    """Score policy name -> weight and args. Names must be registered score policies."""
    picker: str = DEFAULT_PICKER
    """The GPU picker that chooses GPUs inside the chosen node (a registered picker name)."""
    picker_args: dict[str, Any] = Field(default_factory=dict)
    cpu_only: CpuOnlyPolicy = Field(default_factory=CpuOnlyPolicy)
    """How pods without GPUs are ranked."""
    ledger: LedgerPolicy = Field(default_factory=LedgerPolicy)
    hotness: HotnessConfig = Field(default_factory=HotnessConfig)
    """Hot-node thresholds, shared with the operator (``scheduler_plugin.hotness``); validated here too."""
    gang: GangPolicy = Field(default_factory=GangPolicy)
    """Gang planning: the topology levels (node labels, innermost first) multi-pod jobs are placed in (docs/jobs.md)."""
    operator: dict[str, Any] = Field(default_factory=dict)
    """The operator's section of the shared policy file, in the operator's field names; validated by
    :meth:`from_mapping` with the operator's own model (:class:`~scheduler_plugin.operator_settings.FileSection`), so
    that a file the operator refuses stops the extender too. The operator puts its environment and flags on top."""

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "policy config", plugins: Registry | None = None) -> PolicyConfig:
        """Validate parsed YAML/JSON. Raises :class:`PolicyConfigError` naming every bad field by its path; logs one
        warning per key written in the old snake_case spelling (in the policies' ``args`` too, by their models in
        ``plugins``: the production registry unless given)."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise PolicyConfigError(f"{source}: must be a mapping at the top level, got {type(data).__name__}")
        # a section left empty (``operator:`` or ``args:`` with nothing under it, or only comments) is YAML null: the
        # same as {}, at every depth (normalise)
        keys = normalise(cls, data)
        if keys.duplicates:
            raise PolicyConfigError(f"{source}: " + "; ".join(keys.duplicates))
        try:
            cfg = cls.model_validate(keys.data)
        except ValidationError as exc:
            raise PolicyConfigError(format_validation_error(exc, source, cls)) from None
        operator = _operator_section(cfg.operator, source)
        cfg = cfg.model_copy(update={"operator": operator.data})
        renamed = [*keys.renamed, *operator.renamed, *cfg._renamed_args(source, plugins)]
        for r in renamed:
            log.warning("%s", r.warning(source))
        return cfg

    def _renamed_args(self, source: str, plugins: Registry | None) -> list[Renamed]:
        """Old spellings inside the policies' ``args`` (their models are the registry's; unknown names are left to
        :meth:`Framework.from_config <scheduler_plugin.policies.framework.Framework.from_config>`)."""
        if plugins is None:
            # imported here, not at the top: every plugin module imports this one (CamelModel, FilterPolicy)
            from .plugins import PRODUCTION

            plugins = PRODUCTION
        out: list[Renamed] = []
        sections: list[tuple[Kind, str, dict[str, Any], str]] = [
            ("score", name, sc.args, f"scoring.{name}.args.") for name, sc in self.scoring.items()
        ]
        sections.append(("picker", self.picker, self.picker_args, "pickerArgs."))
        for kind, name, args, path in sections:
            try:
                model = plugins.lookup(kind, name).args_model
            except PolicyConfigError:
                continue
            keys = normalise(model, args, path)
            if keys.duplicates:
                raise PolicyConfigError(f"{source}: " + "; ".join(keys.duplicates))
            out += keys.renamed
        return out

    @classmethod
    def from_yaml(cls, path: str | Path) -> PolicyConfig:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise PolicyConfigError(f"{p}: cannot read the policy file ({exc.strerror or exc})") from exc
        try:
            data = yamlfile.safe_load(text)
        except yaml.YAMLError as exc:
            raise PolicyConfigError(f"{p}: not valid YAML ({yamlfile.describe(exc)})") from None
        return cls.from_mapping(data, source=str(p))


def _operator_section(section: dict[str, Any], source: str) -> Normalised:
    """The ``operator:`` section in field names, validated as the operator validates the file (the environment
    left out: the extender's is not the operator's). Raises :class:`PolicyConfigError` naming each bad key."""
    keys = normalise(FileSection, section, "operator.")
    if keys.duplicates:
        raise PolicyConfigError(f"{source}: " + "; ".join(keys.duplicates))
    try:
        FileSection(**keys.data)
    except ValidationError as exc:
        raise PolicyConfigError(format_validation_error(exc, source, FileSection, "operator.")) from None
    return keys


def format_validation_error(
    exc: ValidationError, source: str, model: type[BaseModel] | None = None, prefix: str = ""
) -> str:
    """One line per problem: ``<source>: <dotted.path>: <message>``, the path in camelCase keys."""
    lines = []
    for e in exc.errors():
        path = prefix + display_path(model, e["loc"]) if e["loc"] else prefix.rstrip(".") or "(top level)"
        got = e.get("input")
        shown = f" (got {got!r})" if isinstance(got, str | int | float) and e["type"] != "extra_forbidden" else ""
        lines.append(f"{path}: {error_message(e)}{shown}")
    return f"{source}: " + "; ".join(lines)
