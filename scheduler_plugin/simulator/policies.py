"""Build the simulator's policies from the extender's registry: the paper's baselines and kelvin's default."""

from __future__ import annotations

from typing import Any

from ..policies import baselines, fragmentation  # noqa: F401  (registration on import)
from ..policies.fragmentation import FitFilter
from ..policies.registry import PolicyConfigError, build, names
from .engine import SimPolicy

BASELINES = ("random", "dotproduct", "gpu-clustering", "gpu-packing", "best-fit", "fgd")
POLICIES = ("kelvin", *BASELINES)


def build_policy(name: str, seed: int = 0) -> SimPolicy:
    """A fresh policy instance (policies may keep state, e.g. gpu-clustering's classes per node)."""
    if name == "kelvin":
        return _kelvin()
    if name not in BASELINES:
        raise PolicyConfigError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})")
    args: dict[str, Any] = {"seed": seed} if name == "random" else {}
    scorer = build("score", name, args, f"policy.{name}")
    picker = scorer if hasattr(scorer, "pick") else build("picker", name, args, f"policy.{name}")
    return SimPolicy(name=name, filters=[FitFilter()], scorers=[(scorer, 1.0)], picker=picker)


def _kelvin() -> SimPolicy:
    import json, os
    scorer = build("score", "fragmentation", json.loads(os.environ.get("KARGS", "{}")), "policy.kelvin")
    return SimPolicy(name="kelvin", filters=[FitFilter()], scorers=[(scorer, 1.0)], picker=scorer)


def known() -> list[str]:
    return [*POLICIES, *(n for n in names("score") if n not in POLICIES)]
