"""The simulator's policies, built from the extender's own registry and framework (no second implementation).

* Every policy runs behind kube-scheduler's NodeResourcesFit (CPU, memory) and kelvin's ``fit`` filter (GPU count,
  share, model, thermal limits), exactly as a pod meets them in a cluster.
* ``kelvin`` is the :class:`~scheduler_plugin.policies.framework.Framework` built from the default
  :class:`~scheduler_plugin.policies.config.PolicyConfig` (or a policy file): nodes are ranked by its weighted score
  before rounding, GPUs chosen by its picker. Pods without GPUs are ranked by its ``fragmentation`` policy (they
  change the CPU left for GPU pods).
* The paper's baselines are single score plugins of the registry, ranked by their raw score.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..model import FleetArrays, GpuRequest
from ..policies import baselines, fragmentation  # noqa: F401  (registration on import)
from ..policies.base import BoolA, CycleContext, FloatA, IntA, Rejection
from ..policies.config import PolicyConfig
from ..policies.framework import Framework
from ..policies.reasons import Fits
from ..policies.registry import PolicyConfigError, build
from .engine import SimPolicy
from .kube import NodeResourcesFit

BASELINES = ("random", "dotproduct", "gpu-clustering", "gpu-packing", "best-fit", "fgd")
POLICIES = ("kelvin", "kelvin-fragmentation", *BASELINES)
#: kelvin's framework with only its fragmentation score (what kelvin does on a fleet without telemetry or topology).
FRAGMENTATION_ONLY = {"scoring": {"fragmentation": {"weight": 1.0}}}


class FrameworkFilter:
    """The framework's filters (telemetry, fit) as one filter plugin."""

    name = "kelvin"

    def __init__(self, fw: Framework) -> None:
        self.fw = fw

    def filter(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> BoolA:
        # The framework's own filters, without wording a reason for every rejected node (the simulator needs none).
        ok = np.ones(len(idx), dtype=np.bool_)
        for f in self.fw.filters:
            sel = np.flatnonzero(ok)
            if sel.size == 0:
                break
            ok[sel] = f.filter(req, fleet, idx[sel], ctx)
        return ok

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> Rejection:
        rejected = self.fw.filter(req, fleet, np.array([row], dtype=np.int64), ctx).rejected
        return rejected.get(row, Fits())


class FrameworkPicker:
    """The framework's pick (filters re-checked on the node, then its configured picker)."""

    name = "kelvin"

    def __init__(self, fw: Framework) -> None:
        self.fw = fw

    def pick(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> tuple[int, ...] | None:
        return self.fw.pick(req, fleet, row, ctx)


def kelvin_policy(config: PolicyConfig | None = None, name: str = "kelvin") -> SimPolicy:
    fw = Framework.from_config(config or PolicyConfig())
    frag = next((ws.plugin for ws in fw.scorers if ws.name == "fragmentation"), None)

    def rank(req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        if not req.wants_gpu:
            return frag.score(req, fleet, idx, ctx) if frag is not None else np.zeros(len(idx))
        _, combined = fw.prioritize(req, fleet, idx, ctx)
        return combined

    def context(fleet: FleetArrays, now: float) -> CycleContext:
        return fw.context(fleet, now)

    return SimPolicy(
        name=name,
        context_fn=context,
        filters=[NodeResourcesFit(), FrameworkFilter(fw)],
        scorers=[(ws.plugin, ws.weight) for ws in fw.scorers],
        picker=FrameworkPicker(fw),
        rank_fn=rank,
        observe_fn=fw.observe,
    )


def build_policy(name: str, seed: int = 0, *, policy_file: Path | None = None) -> SimPolicy:
    """A fresh policy instance (policies may keep state, e.g. gpu-clustering's classes per node)."""
    if name == "kelvin":
        return kelvin_policy(PolicyConfig.from_yaml(policy_file) if policy_file is not None else None)
    if name == "kelvin-fragmentation":
        return kelvin_policy(PolicyConfig.from_mapping(FRAGMENTATION_ONLY), name)
    if name not in BASELINES:
        raise PolicyConfigError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})")
    args: dict[str, Any] = {"seed": seed} if name == "random" else {}
    scorer = build("score", name, args, f"policy.{name}")
    picker = scorer if hasattr(scorer, "pick") else build("picker", name, args, f"policy.{name}")
    fit = build("filter", "fit", {}, "filters")
    return SimPolicy(name=name, filters=[NodeResourcesFit(), fit], scorers=[(scorer, 1.0)], picker=picker)
