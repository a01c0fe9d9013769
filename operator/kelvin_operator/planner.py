"""The planner: drops protected pods and ranks the rest, safest eviction first. Pure; no limits (the evictor's job).

Ranking: lowest priority first, then the pods contributing most heat (or most over their share), then the cheapest
to restart (least work lost: time since the pod started or last reported a checkpoint), then the pod key (stable).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scheduler_plugin.model import annotations as ann

from .pods import PodView, restart_cost_s
from .settings import ProtectionConfig
from .strategies import REASON_ORDER, Candidate


@dataclass(frozen=True, slots=True)
class Protected:
    candidate: Candidate
    why: str


def protection(pod: PodView, now: float, cfg: ProtectionConfig) -> str | None:
    """Why ``pod`` must not be evicted, or ``None``."""
    if pod.annotations.get(ann.EVICTABLE, "").strip().lower() == "false":
        return f'annotated {ann.EVICTABLE}: "false"'
    if pod.priority_class.startswith("system-") or pod.priority >= cfg.system_priority:
        return f"system-critical (priorityClassName {pod.priority_class or '-'}, priority {pod.priority})"
    if pod.namespace in cfg.protected_namespaces:
        return f"in protected namespace {pod.namespace}"
    if pod.mirror:
        return "a static (mirror) pod"
    if "DaemonSet" in pod.owner_kinds:
        return "owned by a DaemonSet"
    if pod.bare and not cfg.allow_bare_pods:
        return "a bare pod (no controller would recreate it)"
    if pod.deleting:
        return "already terminating"
    if pod.phase in ("Succeeded", "Failed"):
        return f"already {pod.phase.lower()}"
    born = pod.started_at if pod.started_at is not None else pod.created_at
    if born is None or now - born < cfg.min_pod_age_s:
        age = "unknown" if born is None else f"{now - born:.0f} s"
        return f"younger than the minimum age {cfg.min_pod_age_s:g} s (age {age})"
    return None


def rank_key(c: Candidate, now: float) -> tuple[int, float, float, str]:
    return (c.pod.priority, -c.heat, restart_cost_s(c.pod, now), c.pod.key)


def plan(candidates: Iterable[Candidate], now: float, cfg: ProtectionConfig) -> tuple[list[Candidate], list[Protected]]:
    """One candidate per pod (the most urgent reason: thermal, then noisy neighbour, then memory pool), protected
    pods set aside with the reason, the rest ranked safest first."""
    best: dict[str, Candidate] = {}
    for c in candidates:
        prev = best.get(c.pod.key)
        if prev is None or REASON_ORDER.index(c.reason) < REASON_ORDER.index(prev.reason):
            best[c.pod.key] = c
    ranked: list[Candidate] = []
    protected: list[Protected] = []
    for c in best.values():
        why = protection(c.pod, now, cfg)
        if why is None:
            ranked.append(c)
        else:
            protected.append(Protected(c, why))
    ranked.sort(key=lambda c: rank_key(c, now))
    protected.sort(key=lambda p: p.candidate.pod.key)
    return ranked, protected
