"""The thermal scenario: a time-stepped replay on the simulated fleet, where heat follows load.

The fleet is :class:`~scheduler_plugin.telemetry.simulated.SimulatedFleetSource` (its thermal model is
:mod:`scheduler_plugin.telemetry.thermal_model`: temperature follows load and cooling quality; a few nodes have poor
cooling). Pods arrive as a Poisson process, ask for 1-8 whole GPUs, run for an exponential time and leave; a pod that
fits nowhere waits in a FIFO queue. Every step the fleet heats or cools, telemetry is read back into
:class:`FleetArrays` (with the trend over the last step), finished pods leave and waiting pods are placed.

Policies compared:

* ``default``: kube-scheduler's spreading (NodeResourcesFit + LeastAllocated), blind to temperature;
* ``kelvin-no-thermal``: kelvin's framework with the thermal score and thermal hard limits turned off;
* ``kelvin``: kelvin's default framework (thermal score and hard limits on).

Figures: GPU-minutes spent thermally throttled, and pods placed on a node that was at or above its slowdown
temperature at placement time.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..model import GIB, THERMAL_THROTTLE_MASK, FleetArrays, GpuAssignment, GpuRequest, build_arrays
from ..policies.config import FilterPolicy, PolicyConfig, ScorerConfig
from ..policies.registry import build
from ..telemetry.cooling import CoolingEstimator
from ..telemetry.simulated import FleetSpec, SimulatedFleetSource
from .engine import SimPolicy
from .fleet import apply_placement
from .kube import LeastAllocated, NodeResourcesFit
from .policies import kelvin_policy

THERMAL_POLICIES = ("default", "kelvin-no-thermal", "kelvin")
GPU_COUNTS = (1, 2, 4, 8)
GPU_COUNT_P = (0.6, 0.2, 0.1, 0.1)


@dataclass(frozen=True, slots=True)
class ThermalScenario:
    nodes: int = 48
    gpus_per_node: int = 8
    model: str = "H100-SXM-80GB"
    poor_cooling_fraction: float = 0.15
    ambient_c: float = 28.0
    hours: float = 4.0
    step_s: float = 30.0
    target_load: float = 0.7
    """Mean share of GPUs busy the arrival rate aims at."""
    mean_duration_min: float = 40.0
    cpu_per_gpu: int = 8000
    memory_per_gpu: int = 64 * GIB
    seed: int = 42

    def spec(self) -> FleetSpec:
        return FleetSpec.parse(
            {
                "seed": self.seed,
                "initialLoad": 0.0,
                "ambientC": self.ambient_c,
                "xidRatePerGpuHour": 0.0,
                "groups": [
                    {
                        "count": self.nodes,
                        "gpus": self.gpus_per_node,
                        "model": self.model,
                        "topology": "nvswitch",
                        "poorCoolingFraction": self.poor_cooling_fraction,
                    }
                ],
            },
            source="thermal scenario",
        )


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float
    key: str
    gpus: int
    duration_s: float


def arrivals(sc: ThermalScenario) -> list[Arrival]:
    """The pods of the scenario (the same for every policy)."""
    rng = np.random.default_rng([sc.seed, 7])
    mean_gpus = float(np.dot(GPU_COUNTS, GPU_COUNT_P))
    rate_per_s = sc.target_load * sc.nodes * sc.gpus_per_node / (mean_gpus * sc.mean_duration_min * 60.0)
    out: list[Arrival] = []
    t = 0.0
    horizon = sc.hours * 3600.0
    while True:
        t += float(rng.exponential(1.0 / rate_per_s))
        if t >= horizon:
            return out
        n = int(rng.choice(GPU_COUNTS, p=GPU_COUNT_P))
        out.append(Arrival(t, f"thermal/pod-{len(out)}", n, float(rng.exponential(sc.mean_duration_min * 60.0))))


@dataclass(slots=True)
class ThermalResult:
    policy: str
    throttled_gpu_minutes: float
    placements: int
    placements_on_hot_nodes: int
    mean_wait_s: float
    gpu_hours_run: float
    max_temp_c: float
    seconds: float

    def as_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "throttled_gpu_minutes": round(self.throttled_gpu_minutes, 1),
            "placements": self.placements,
            "placements_on_hot_nodes": self.placements_on_hot_nodes,
            "mean_wait_s": round(self.mean_wait_s, 1),
            "gpu_hours_run": round(self.gpu_hours_run, 1),
            "max_temp_c": round(self.max_temp_c, 1),
            "seconds": round(self.seconds, 1),
        }


def thermal_policy(name: str) -> SimPolicy:
    if name == "default":
        blind = build("filter", "fit", {"thermalHardLimits": False, "throttleHardLimit": False}, "filters")
        spread = LeastAllocated()
        return SimPolicy("default", [NodeResourcesFit(), blind], [(spread, 1.0)], spread)
    if name == "kelvin-no-thermal":
        base = PolicyConfig()
        scoring = {k: v for k, v in base.scoring.items() if k != "thermal"}
        scoring["thermal"] = ScorerConfig(weight=0.0)
        cfg = base.model_copy(
            update={"scoring": scoring, "filters": FilterPolicy(thermal_hard_limits=False, throttle_hard_limit=False)}
        )
        return kelvin_policy(cfg, name)
    if name == "kelvin":
        return kelvin_policy(PolicyConfig(), name)
    raise ValueError(f"unknown thermal policy {name!r} (known: {', '.join(THERMAL_POLICIES)})")


def _read(
    source: SimulatedFleetSource, at: float, previous: FleetArrays | None, dt: float, cooling: CoolingEstimator
) -> FleetArrays:
    """Telemetry as the extender's snapshot cache would publish it: trend over the last step, cooling quality
    learned from every reading so far."""
    fleet = build_arrays(source.snapshot_nodes(observed_at=at))
    if previous is not None and dt > 0:
        fleet.trend = (fleet.temp - previous.temp) * (60.0 / dt)
    cooling.fill(fleet)
    return fleet


def run_thermal(
    sc: ThermalScenario, policy_name: str, *, progress: Callable[[int, int], None] | None = None
) -> ThermalResult:
    started = time.perf_counter()
    policy = thermal_policy(policy_name)
    source = SimulatedFleetSource(sc.spec(), clock=lambda: 0.0)
    pods = arrivals(sc)
    steps = int(sc.hours * 3600.0 / sc.step_s)
    queue: deque[tuple[Arrival, float]] = deque()
    ends: list[tuple[float, str]] = []
    nxt = 0
    throttled_s = 0.0
    placed = hot_placed = 0
    waits: list[float] = []
    gpu_s = 0.0
    max_temp = 0.0
    fleet: FleetArrays | None = None
    cooling = CoolingEstimator()
    for k in range(steps):
        t = (k + 1) * sc.step_s
        source.advance(sc.step_s)
        for _end, key in [e for e in ends if e[0] <= t]:
            source.release(key)
        ends = [e for e in ends if e[0] > t]
        fleet = _read(source, t, fleet, sc.step_s, cooling)
        throttled = (fleet.throttle & THERMAL_THROTTLE_MASK) != 0
        throttled_s += float(throttled[fleet.gpu_present].sum()) * sc.step_s
        gpu_s += float((fleet.assigned_milli > 0).sum()) * sc.step_s
        max_temp = max(max_temp, float(fleet.temp[fleet.gpu_present].max()))
        while nxt < len(pods) and pods[nxt].at_s <= t:
            queue.append((pods[nxt], pods[nxt].at_s))
            nxt += 1
        hot_node = (fleet.temp >= fleet.slowdown).any(axis=1) | throttled.any(axis=1)
        rows = np.arange(fleet.n_nodes, dtype=np.int64)
        waiting: deque[tuple[Arrival, float]] = deque()
        while queue:
            pod, since = queue.popleft()
            req = GpuRequest(
                count=pod.gpus,
                cpu_milli=sc.cpu_per_gpu * pod.gpus,
                host_memory_bytes=sc.memory_per_gpu * pod.gpus,
                pod_key=pod.key,
                pod_uid=pod.key,
            )
            ctx = policy.context(fleet, t)
            cand = policy.feasible(req, fleet, rows, ctx)
            gpus: tuple[int, ...] | None = None
            if len(cand):
                score = policy.rank(req, fleet, cand, ctx)
                row = int(cand[int(np.argmax(score))])
                gpus = policy.picker.pick(req, fleet, row, ctx)
            if gpus is None:
                waiting.append((pod, since))
                continue
            apply_placement(fleet, req, row, gpus)
            source.record_binding(fleet.names[row], GpuAssignment(pod.key, tuple(gpus), pod_uid=pod.key))
            ends.append((t + pod.duration_s, pod.key))
            placed += 1
            hot_placed += int(hot_node[row])
            waits.append(t - since)
        queue = waiting
        if progress is not None:
            progress(k + 1, steps)
    return ThermalResult(
        policy=policy_name,
        throttled_gpu_minutes=throttled_s / 60.0,
        placements=placed,
        placements_on_hot_nodes=hot_placed,
        mean_wait_s=float(np.mean(waits)) if waits else 0.0,
        gpu_hours_run=gpu_s / 3600.0,
        max_temp_c=max_temp,
        seconds=time.perf_counter() - started,
    )
