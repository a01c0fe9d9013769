"""When moving a pod off a hot GPU pays: the thermal eviction rule, shared by the operator (its thermal strategy,
``kelvin_operator.strategies.thermal``) and the simulator's thermal scenario, so both run the same decision.

A hot node is tainted at once (no new pods while it cools); its pods are a separate question. Staying on a throttling
GPU, a pod's remaining work runs at the GPU's clock ratio ``r``: it holds its GPUs ``remaining * (1 - r) / r`` seconds
longer than at full clocks. Leaving throws away the work since its last checkpoint (redone elsewhere) and holds its
GPUs for a restart. Under rule ``pays`` (:class:`~scheduler_plugin.operator_settings.ThermalEvictionConfig`) a pod
moves only when staying costs more; a GPU that is warm but not throttling never moves a pod (the taint and the cooling
it buys are enough). Rule ``warm`` moves every pod on a warm GPU of a hot node. The remaining work is estimated from
what the operator can see: the pod's age (a job that has run for ``t`` tends to run about ``t`` more), capped at
``maxRemainingSeconds``.

Pure: numbers and the node model in, a verdict out. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from .hotness import Observation
from .model.gpu import GpuInfo, GpuNode
from .operator_settings import ThermalEvictionConfig

#: The clock ratio assumed for a GPU that reports thermal throttling but not its SM clocks (a dcgm-exporter without
#: ``DCGM_FI_DEV_MAX_SM_CLOCK``, a source with no clock series): a thermally throttling GPU runs about 30-50 % slower,
#: so 0.6. Without it such a GPU would count as full speed and no pod would ever leave it.
UNKNOWN_CLOCKS_RATIO = 0.6


def throttled_ratio(gpu: GpuInfo) -> float:
    """The clock ratio of a thermally throttling ``gpu``: its SM clock over its max, or :data:`UNKNOWN_CLOCKS_RATIO`
    when either is not reported."""
    if gpu.sm_clock_mhz <= 0 or gpu.sm_clock_max_mhz <= 0:
        return UNKNOWN_CLOCKS_RATIO
    return gpu.clock_ratio


def slowdown_cost_s(remaining_s: float, clock_ratio: float) -> float:
    """Seconds more a pod holds its GPUs finishing ``remaining_s`` of full-clock work at ``clock_ratio``."""
    if clock_ratio >= 1.0:
        return 0.0
    return remaining_s * (1.0 - clock_ratio) / max(clock_ratio, 1e-3)


def eviction_pays(remaining_s: float, clock_ratio: float, lost_s: float, restart_s: float) -> bool:
    """Whether staying at ``clock_ratio`` costs more GPU-time than leaving (``lost_s`` since the last checkpoint plus
    ``restart_s``). Both sides are per GPU of the pod, so its size cancels."""
    return slowdown_cost_s(remaining_s, clock_ratio) > lost_s + restart_s


@dataclass(frozen=True, slots=True)
class Verdict:
    move: bool
    warm_gpus: tuple[int, ...]
    """The pod's GPUs that are warm on the hot node (empty: the pod is not concerned)."""
    why: str = ""
    """For a pod moved under ``pays``: the figures that made it pay."""


def judge(
    node: GpuNode,
    obs: Observation,
    pod_gpus: Collection[int],
    age_s: float,
    lost_s: float,
    rule: ThermalEvictionConfig,
) -> Verdict:
    """Whether a pod on ``pod_gpus`` of the hot ``node`` should move: ``age_s`` since it started, ``lost_s`` of work
    since its last checkpoint (what an eviction throws away)."""
    warm = set(obs.warm_gpus)
    on = tuple(i for i in sorted(pod_gpus) if i in warm)
    if not on:
        return Verdict(False, ())
    if rule.rule == "warm":
        return Verdict(True, on)
    throttled = [g for g in node.gpus if g.index in on and g.thermally_throttled]
    if not throttled:
        return Verdict(False, on)
    ratio = min(map(throttled_ratio, throttled))
    remaining = min(age_s, rule.max_remaining_s)
    if not eviction_pays(remaining, ratio, lost_s, rule.restart_s):
        return Verdict(False, on)
    return Verdict(
        True,
        on,
        f"; throttled to {ratio:.0%} clocks: ~{remaining / 60:.0f} min of work left would take "
        f"{slowdown_cost_s(remaining, ratio) / 60:.1f} min longer, moving costs "
        f"{(lost_s + rule.restart_s) / 60:.1f} min",
    )
