"""The simulator's policies: each is one kelvin :class:`~scheduler_plugin.policies.framework.Framework`, run as the
extender runs it (no second filter or score combination).

* Every policy runs behind kube-scheduler's NodeResourcesFit (CPU, memory), then the framework's filters (the
  ``fit`` filter: GPU count, share, model, thermal limits; for kelvin also telemetry staleness and hot nodes),
  exactly as a pod meets them in a cluster. GPUs are chosen by :meth:`Framework.pick
  <scheduler_plugin.policies.framework.Framework.pick>`; arrivals are learned by its ``observe``.
* ``kelvin`` is the framework built from the default :class:`~scheduler_plugin.policies.policy_file.PolicyConfig` (or a
  policy file, checked against the production registry as the extender checks it): nodes are ranked by its weighted
  score before rounding, pods without GPUs too (by the policy's ``cpuOnly`` ranking, as the extender ranks them when
  kube-scheduler sends them: the chart's ``scheduler.extender.cpuOnlyPods``): they change the CPU left for GPU pods.
* The paper's baselines (:mod:`.baselines`, in the simulator's registry only) are frameworks with that one score
  plugin, which is also the picker, ranked by its raw score (:func:`~scheduler_plugin.policies.ranking.rank`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..model import FleetArrays, GpuRequest
from ..policies import ranking
from ..policies.base import BoolA, CycleContext, FloatA, GpuPicker, IntA, ScorePlugin
from ..policies.fit import FitFilter
from ..policies.framework import Framework, WeightedScore
from ..policies.policy_file import PolicyConfig, TelemetryPolicy
from ..policies.registry import PolicyConfigError
from .baselines import SIMULATOR
from .node_resources import NodeResourcesFit

BASELINES = ("random", "dotproduct", "gpu-clustering", "gpu-packing", "best-fit", "fgd")
POLICIES = ("kelvin", "kelvin-fragmentation", *BASELINES)
#: kelvin's framework with only its fragmentation score (what kelvin does on a fleet without telemetry or topology).
FRAGMENTATION_ONLY = {"scoring": {"fragmentation": {"weight": 1.0}}}

_KUBE_FIT = NodeResourcesFit()


@dataclass(slots=True)
class SimPolicy:
    """A policy as the simulator runs it: a named framework and how its nodes are ranked."""

    name: str
    framework: Framework
    raw: bool = False
    """Rank by the raw score of the framework's only score plugin (the paper's baselines), not by its weighted
    mean."""


def feasible(policy: SimPolicy, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> IntA:
    """The rows that pass kube-scheduler's NodeResourcesFit, then every filter of the policy's framework."""
    rows = rows[_KUBE_FIT.filter(req, fleet, rows, ctx)]
    return ranking.feasible(policy.framework, req, fleet, rows, ctx) if rows.size else rows


def kube_fits(req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> BoolA:
    """Per row, whether kube-scheduler's own NodeResourcesFit passes it (CPU and memory)."""
    return _KUBE_FIT.filter(req, fleet, rows, ctx)


def rank(policy: SimPolicy, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> FloatA:
    """What the feasible ``rows`` are ordered by (higher is better)."""
    return ranking.rank(policy.framework, req, fleet, rows, ctx, raw=policy.raw)


def pick(policy: SimPolicy, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> tuple[int, ...] | None:
    """The GPUs the pod gets on ``row``, one of the rows :func:`feasible` passed in the same cycle (``ctx``) on the
    same, unchanged ``fleet``: :meth:`Framework.pick <scheduler_plugin.policies.framework.Framework.pick>` without
    running every filter on that row again (they passed it; a replay picks once per arrival)."""
    if not req.wants_gpu:
        return ()
    fw = policy.framework
    return fw.picker.pick(req, fw.view(fleet, ctx), row, ctx)


def single_score(name: str, plugin: ScorePlugin, fit: FitFilter, picker: GpuPicker) -> SimPolicy:
    """A telemetry-blind policy of one score plugin ranked by its raw score (the paper's baselines, kube-scheduler's
    own scoring): the ``fit`` filter only (no staleness or hot-node filter, no ledger), GPUs from ``picker`` (for
    the baselines the score plugin itself: gpu-clustering remembers what it placed, random draws from one stream)."""
    fw = Framework(
        telemetry=TelemetryPolicy(on_stale="allow"),
        fit=fit,
        scorers=[WeightedScore(name, plugin, 1.0)],
        picker=picker,
    )
    return SimPolicy(name, fw, raw=True)


def kelvin_policy(config: PolicyConfig | None = None, name: str = "kelvin") -> SimPolicy:
    """kelvin's framework from ``config`` (default: the default policy), built through the production registry."""
    return SimPolicy(name, Framework.from_config(config or PolicyConfig()))


def build_policy(name: str, seed: int = 0, *, policy_file: Path | None = None) -> SimPolicy:
    """A fresh policy instance (policies may keep state, e.g. gpu-clustering's classes per node)."""
    if name == "kelvin":
        return kelvin_policy(PolicyConfig.from_yaml(policy_file) if policy_file is not None else None)
    if name == "kelvin-fragmentation":
        return kelvin_policy(PolicyConfig.from_mapping(FRAGMENTATION_ONLY), name)
    if name not in BASELINES:
        raise PolicyConfigError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})")
    args: dict[str, Any] = {"seed": seed} if name == "random" else {}
    scorer = SIMULATOR.build("score", name, args, f"policy.{name}")
    picker = scorer if hasattr(scorer, "pick") else SIMULATOR.build("picker", name, args, f"policy.{name}")
    fit = SIMULATOR.build("filter", "fit", {}, "filters")
    return single_score(name, scorer, fit, picker)
