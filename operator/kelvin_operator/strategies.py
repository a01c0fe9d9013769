"""Strategies decide *what* should move and why. Pure functions over the node model and pod views; no I/O.

Each strategy returns :class:`Candidate` objects (or, for memory pools, :class:`PoolViolation` objects that the
operator turns into Events, metrics and, in ``evict`` mode, candidates). Protections, ranking and limits are not
their business: the planner and the evictor own those.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from scheduler_plugin.hotness import Observation
from scheduler_plugin.model.claim import charged_milli
from scheduler_plugin.model.gpu import MILLI_PER_GPU, GpuNode, GpuProcess
from scheduler_plugin.model.quantity import format_gib
from scheduler_plugin.thermal_eviction import judge, throttled_ratio

from .pods import PodView, age_s, restart_cost_s
from .settings import NoisyConfig, PoolConfig, PoolMode, ThermalEvictionConfig


class Reason(StrEnum):
    THERMAL = "thermal"
    NOISY_NEIGHBOR = "noisy_neighbor"
    MEMORY_POOL = "memory_pool"


REASON_ORDER = (Reason.THERMAL, Reason.NOISY_NEIGHBOR, Reason.MEMORY_POOL)


@dataclass(frozen=True, slots=True)
class Candidate:
    pod: PodView
    reason: Reason
    heat: float
    """Degree-weighted share of the hot GPUs' excess heat this pod contributes (thermal), or how far it is over its
    share (noisy / pool); larger goes first among equal priorities."""
    detail: str
    clock_ratio: float | None = None
    """A thermal candidate whose move its gang decides (``thermal(..., deferred=)``): the clock ratio of its
    throttling GPUs, for :func:`~kelvin_operator.stragglers.gang_move_pays`; ``None`` otherwise."""


def pod_gpus(pod: PodView, node: GpuNode) -> tuple[int, ...]:
    """The node's GPUs a pod uses: kelvin's assignment annotation or record, plus process attribution."""
    found: set[int] = set(pod.gpu_indices)
    for a in node.assignments:
        if (pod.uid and a.pod_uid == pod.uid) or a.pod_key == pod.key:
            found.update(a.gpu_indices)
    for g in node.gpus:
        if pod.uid and any(p.pod_uid == pod.uid for p in g.processes):
            found.add(g.index)
    present = {g.index for g in node.gpus}
    if not found and pod.gpu_count > 0:
        return tuple(sorted(present))  # unknown placement: it may be on any GPU
    return tuple(sorted(found & present))


def pod_memory_on(pod: PodView, node: GpuNode, index: int) -> int:
    g = node.gpu(index)
    return sum(p.used_bytes for p in g.processes if pod.uid and p.pod_uid == pod.uid)


def pod_memory(pod: PodView, node: GpuNode) -> int | None:
    """Observed GPU memory of the pod on this node; ``None`` when no process is attributed to it."""
    if not pod.uid:
        return None
    seen = [p.used_bytes for g in node.gpus for p in g.processes if p.pod_uid == pod.uid]
    return sum(seen) if seen else None


def _share_of(pod: PodView, node: GpuNode, index: int, tenants: int) -> float:
    g = node.gpu(index)
    mine = pod_memory_on(pod, node, index)
    attributed = sum(p.used_bytes for p in g.processes if p.pod_uid)
    if mine and attributed:
        return mine / attributed
    if pod.claim is not None:  # what kelvin charges the pod on this GPU (a 20 GiB pool on 80 GiB: a quarter)
        return charged_milli(pod.claim, g.memory_total_bytes) / MILLI_PER_GPU
    return 1.0 / max(1, tenants)


def tenants_by_gpu(pods: Sequence[PodView], node: GpuNode) -> dict[int, list[PodView]]:
    out: dict[int, list[PodView]] = {g.index: [] for g in node.gpus}
    for p in pods:
        for i in pod_gpus(p, node):
            out[i].append(p)
    return out


def thermal(
    node: GpuNode,
    obs: Observation,
    pods: Sequence[PodView],
    cool_celsius: float,
    now: float = 0.0,
    rule: ThermalEvictionConfig | None = None,
    deferred: Collection[str] = (),
) -> list[Candidate]:
    """Pods on the GPUs of a hot node that trigger hotness or are still warm (at or above ``cool_celsius``).

    With ``rule`` ``pays`` (the default of :class:`ThermalEvictionConfig`), only those of them on a thermally
    throttling GPU whose eviction saves more GPU-time than it costs (:func:`scheduler_plugin.thermal_eviction.judge`,
    the rule the simulator runs too); the others stay (the node's taint keeps new pods off while it cools). ``rule``
    ``None`` or ``warm``: all of them. ``deferred``: keys of pods whose move their gang decides under ``pays``
    (members of a synchronous gang, :func:`~kelvin_operator.stragglers.gang_move_pays`): each on a throttling warm
    GPU is a candidate with its ``clock_ratio``, whatever its own rule says."""
    if not obs.warm_gpus:
        return []
    rule = rule or ThermalEvictionConfig(rule="warm")
    temps = {g.index: g.temperature_celsius for g in obs.gpus}
    tenants = tenants_by_gpu(pods, node)
    out: list[Candidate] = []
    for p in pods:
        ratio: float | None = None
        if rule.rule == "pays" and p.key in deferred:
            on = tuple(i for i in sorted(pod_gpus(p, node)) if i in set(obs.warm_gpus))
            throttled = [g for g in node.gpus if g.index in on and g.thermally_throttled]
            if not throttled:
                continue  # warm but not throttling: never moves under pays (the taint and the cooling are enough)
            ratio, why = (
                min(map(throttled_ratio, throttled)),
                f"; throttled to {min(map(throttled_ratio, throttled)):.0%} clocks",
            )
        else:
            verdict = judge(node, obs, pod_gpus(p, node), age_s(p, now), restart_cost_s(p, now), rule)
            if not verdict.move:
                continue
            on, why = verdict.warm_gpus, verdict.why
        heat = sum(_share_of(p, node, i, len(tenants[i])) * max(0.0, temps[i] - cool_celsius) for i in on)
        hottest = max(on, key=lambda i: temps[i])
        out.append(
            Candidate(
                pod=p,
                reason=Reason.THERMAL,
                heat=heat,
                detail=f"on hot GPU(s) {','.join(map(str, on))} of {node.name} "
                f"(gpu {hottest} at {temps[hottest]:.1f} °C){why}",
                clock_ratio=ratio,
            )
        )
    return out


def noisy_neighbours(node: GpuNode, pods: Sequence[PodView], cfg: NoisyConfig) -> list[Candidate]:
    """On each shared GPU, the tenant that hurts the others.

    - memory: it holds more GPU memory on that GPU than its declared pool (``kelvin.dev/gpu-memory``);
    - compute: the GPU is busy (``busy_utilization``), the tenant uses more than ``over_share_ratio`` times its
      compute share (``kelvin.dev/gpu-share``, per-process SM utilisation from the exporter) while a co-tenant gets
      less than ``starved_ratio`` of its own.

    Only the offender is returned, never its victims. An offender whose victims all have a lower priority is left
    alone: it is entitled to the GPU (as kube-scheduler preemption would decide), so a higher-priority pod is never
    evicted in favour of lower-priority co-tenants, and a lower-priority offender is always acted upon.
    """
    if not cfg.enabled:
        return []
    out: dict[str, Candidate] = {}
    for index, tenants in tenants_by_gpu(pods, node).items():
        if len(tenants) < 2:
            continue
        g = node.gpu(index)
        for p in tenants:
            victims = [v for v in tenants if v.key != p.key]
            if not any(v.priority >= p.priority for v in victims):
                continue
            used = pod_memory_on(p, node, index)
            if p.memory_pool_bytes is not None and used > p.memory_pool_bytes:
                over = used / p.memory_pool_bytes - 1.0
                out.setdefault(
                    p.key,
                    Candidate(
                        pod=p,
                        reason=Reason.NOISY_NEIGHBOR,
                        heat=over,
                        detail=f"uses {format_gib(used)} of GPU {index} on {node.name}, over its pool of "
                        f"{format_gib(p.memory_pool_bytes)}, next to {len(victims)} co-tenant(s)",
                    ),
                )
                continue
            if g.utilization < cfg.busy_utilization:
                continue
            mine = _sm_util(p, g.processes)
            share = (p.compute_share_milli or 0) / MILLI_PER_GPU
            if mine is None or share <= 0 or mine <= share * cfg.over_share_ratio:
                continue
            starved = [v for v in victims if _starved(v, g.processes, cfg)]
            if starved and any(v.priority >= p.priority for v in starved):
                out.setdefault(
                    p.key,
                    Candidate(
                        pod=p,
                        reason=Reason.NOISY_NEIGHBOR,
                        heat=mine / share - 1.0,
                        detail=f"holds {mine:.0%} of GPU {index} on {node.name} (share {share:.0%}) while "
                        f"{', '.join(v.key for v in starved)} starve",
                    ),
                )
    return list(out.values())


def _sm_util(pod: PodView, processes: Sequence[GpuProcess]) -> float | None:
    vals = [p.sm_utilization for p in processes if pod.uid and p.pod_uid == pod.uid and p.sm_utilization is not None]
    return sum(vals) if vals else None


def _starved(pod: PodView, processes: Sequence[GpuProcess], cfg: NoisyConfig) -> bool:
    share = (pod.compute_share_milli or 0) / MILLI_PER_GPU
    got = _sm_util(pod, processes)
    return share > 0 and got is not None and got < share * cfg.starved_ratio


class ViolationKind(StrEnum):
    OVER_POOL = "over_pool"
    FAILED_OPEN = "failed_open"


@dataclass(frozen=True, slots=True)
class PoolViolation:
    pod: PodView
    kind: ViolationKind
    observed_bytes: int
    pool_bytes: int
    over_since: float
    actionable: bool
    """Past the grace period (and the mode is ``evict``): the pod is an eviction candidate."""

    def message(self) -> str:
        what = (
            "GPU memory enforcement FAILED OPEN: the node claims CUDA MPS limits, yet the pod"
            if self.kind is ViolationKind.FAILED_OPEN
            else "pod"
        )
        return (
            f"{what} uses {format_gib(self.observed_bytes)} of GPU memory, over its pool of "
            f"{format_gib(self.pool_bytes)} (kelvin.dev/gpu-memory)"
        )


def memory_pools(
    node: GpuNode,
    pods: Sequence[PodView],
    cfg: PoolConfig,
    over_since: Mapping[str, float],
    now: float,
    mps_claimed: bool,
) -> tuple[list[PoolViolation], dict[str, float]]:
    """Pods whose observed GPU memory (per-process attribution) exceeds their pool by more than the tolerance.

    ``over_since`` (pod uid -> first time seen over) carries the grace period between cycles; the updated map is
    returned (pods back under their pool drop out of it). ``mps_claimed``: the node says it enforces MPS memory limits,
    so a pod over its pool there means enforcement failed open.
    """
    if not cfg.enabled:
        return [], {}
    out: list[PoolViolation] = []
    still: dict[str, float] = {}
    for p in pods:
        if p.memory_pool_bytes is None:
            continue
        used = pod_memory(p, node)
        if used is None or used <= p.memory_pool_bytes * (1.0 + cfg.tolerance_ratio):
            continue
        since = over_since.get(p.uid, now)
        still[p.uid] = since
        kind = ViolationKind.FAILED_OPEN if mps_claimed else ViolationKind.OVER_POOL
        actionable = cfg.mode is PoolMode.EVICT and now - since >= cfg.grace_s
        out.append(PoolViolation(p, kind, used, p.memory_pool_bytes, since, actionable))
    return out, still


def pool_candidates(violations: Sequence[PoolViolation]) -> list[Candidate]:
    return [
        Candidate(pod=v.pod, reason=Reason.MEMORY_POOL, heat=v.observed_bytes / v.pool_bytes - 1.0, detail=v.message())
        for v in violations
        if v.actionable
    ]
