"""Scenario on the simulated fleet: one node's cooling has failed. With the operator on, the node is tainted, drained
within the limits, and untainted once cool; throttled GPU-minutes are measured with the operator on and off.

Everything runs in simulated time through the real pieces: SimulatedFleetSource (thermal model), SnapshotCache
(temperature trend), the Reconciler (hotness, strategies, planner, evictor). Only the Kubernetes side is an in-memory
stand-in (:class:`FleetKube`): evictions remove the pod and its ReplicaSet's replacement is placed on the coolest
untainted node with a free GPU, as the extender would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from kelvin_operator.k8s import EvictOutcome, EvictResult, ObjectRef
from kelvin_operator.reconcile import Reconciler
from kelvin_operator.settings import OperatorConfig
from opkit import pod

from scheduler_plugin.model.gpu import THERMAL_THROTTLE_MASK, GpuAssignment, GpuNode
from scheduler_plugin.simulator.simulated_fleet import FleetSpec, SimulatedFleetSource
from scheduler_plugin.telemetry.cache import CacheSettings, SnapshotCache

STEP_S = 30.0
DURATION_S = 90 * 60.0
FAILED = "hot-node-1"


COOLING_LEFT = 0.55
"""Cooling quality of the failed node (a healthy one is 0.95-1.12): a busy GPU settles 40-80 °C above inlet."""


def fail_cooling(source: SimulatedFleetSource, node: str, factor: float) -> None:
    """Degrade one node's cooling. SimulatedFleetSource has no public setter for this yet, so this reaches into its
    per-group cooling array (requested from its owner: ``set_cooling(node, factor)``)."""
    group, row = source._where[node]
    source._groups[group].cooling[row] = factor


@dataclass
class Clock:
    t: float = 1_900_000_000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class FleetKube:
    """The Kubernetes side of the scenario, in memory."""

    source: SimulatedFleetSource
    clock: Clock
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    taints: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    evictions: list[tuple[float, str, str]] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)
    serial: int = 0

    def place(self, name: str, node: str, gpu: int, age_s: float = 0.0) -> None:
        self.pods[name] = pod(name, node=node, gpu_indices=str(gpu), now=self.clock.t, age_s=age_s)
        self.source.record_binding(node, GpuAssignment(pod_key=f"ml/{name}", gpu_indices=(gpu,), pod_uid=f"uid-{name}"))

    def free_gpu(self, nodes: list[GpuNode]) -> tuple[str, int] | None:
        """The coolest free GPU on an untainted node (what the extender's thermal scoring prefers)."""
        best: tuple[float, str, int] | None = None
        for nd in nodes:
            if self.taints.get(nd.name):
                continue
            used = {i for a in nd.assignments for i in a.gpu_indices}
            for g in nd.gpus:
                if g.index not in used and (best is None or g.temperature_celsius < best[0]):
                    best = (g.temperature_celsius, nd.name, g.index)
        return None if best is None else (best[1], best[2])

    def node_obj(self, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "uid": name}, "spec": {"taints": list(self.taints.get(name, []))}}

    def on(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods.values() if p["spec"]["nodeName"] == node]

    # -- the Kube protocol ---------------------------------------------------------------------------------------

    async def evict(self, namespace: str, name: str) -> EvictOutcome:
        p = self.pods.pop(name)
        self.source.release(f"{namespace}/{name}")
        self.evictions.append((self.clock.t, p["spec"]["nodeName"], name))
        spot = self.free_gpu(self.source.snapshot_nodes(self.clock.t))
        if spot is not None:  # the ReplicaSet's replacement
            self.serial += 1
            self.place(f"{name.split('-r')[0]}-r{self.serial}", spot[0], spot[1])
        return EvictOutcome(EvictResult.EVICTED)

    async def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self.pods[name]["metadata"]["annotations"].update({k: v for k, v in annotations.items() if v is not None})

    async def set_taint(self, node: str, key: str, value: str, effect: str, present: bool) -> bool:
        had = bool(self.taints.get(node))
        self.taints[node] = [{"key": key, "value": value, "effect": effect}] if present else []
        return had != present

    async def event(self, ref: ObjectRef, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append((reason, ref.name))


@dataclass
class Run:
    throttled_gpu_minutes: float
    throttled_failed_node_gpu_minutes: float
    lost_gpu_minutes: float
    """Busy GPU-minutes lost to clock reduction: sum of (1 - clock ratio) over busy GPUs."""
    tainted_at: float | None
    untainted_at: float | None
    evictions: list[tuple[float, str, str]]


async def simulate(operator_on: bool, rule: str = "warm") -> Run:
    """``rule`` warm: the failed-cooling node is drained of every pod on its warm GPUs (the mechanics tested here)."""
    clock = Clock()
    spec = FleetSpec.parse(
        {
            "seed": 3,
            "initialLoad": 0.0,
            "xidRatePerGpuHour": 0.0,
            "groups": [
                {"count": 1, "gpus": 8, "namePrefix": "hot-node-", "poorCoolingFraction": 0.0},
                {"count": 3, "gpus": 8, "namePrefix": "gpu-node-", "poorCoolingFraction": 0.0},
            ],
        },
        source="scenario",
    )
    source = SimulatedFleetSource(spec, clock=clock)
    fail_cooling(source, FAILED, COOLING_LEFT)
    cache = SnapshotCache(source, CacheSettings(refresh_interval_s=STEP_S, max_age_s=120.0), clock=clock)
    kube = FleetKube(source, clock)
    # a busy failed node (8 jobs) and 4 jobs on each healthy node: 12 free GPUs elsewhere
    for g in range(8):
        kube.place(f"job{g}", FAILED, g, age_s=3600)
    for n in range(1, 4):
        for g in range(4):
            kube.place(f"job{8 + (n - 1) * 4 + g}", f"gpu-node-{n}", g, age_s=3600)
    cfg = OperatorConfig(
        thermal_eviction={"rule": rule},
        limits={"max_per_node_per_cycle": 1, "max_per_namespace": 3, "max_total": 3, "window_s": 300},
        protection={"min_pod_age_s": 300},
        hotness={"hot_celsius": 84, "cool_celsius": 75, "hold_s": 300},
    )
    rec = Reconciler(cfg, kube)
    throttled = failed_throttled = lost = 0.0
    tainted_at = untainted_at = None
    await cache.refresh_once()
    steps = int(DURATION_S / STEP_S)
    for _ in range(steps):
        clock.t += STEP_S
        assert await cache.refresh_once()
        snap = cache.snapshot
        for nd in snap.nodes:
            busy = {i for a in nd.assignments for i in a.gpu_indices}
            for g in nd.gpus:
                if g.index in busy:
                    hot = bool(g.throttle_reasons & THERMAL_THROTTLE_MASK)
                    throttled += hot * STEP_S / 60.0
                    failed_throttled += (hot and nd.name == FAILED) * STEP_S / 60.0
                    lost += (1.0 - g.clock_ratio) * STEP_S / 60.0
        if operator_on:
            for nd in snap.nodes:
                await rec.reconcile_node(kube.node_obj(nd.name), nd, kube.on(nd.name), clock.t)
            if tainted_at is None and kube.taints.get(FAILED):
                tainted_at = clock.t
            if tainted_at is not None and untainted_at is None and not kube.taints.get(FAILED):
                untainted_at = clock.t
    t0 = Clock().t
    rel = [(t - t0, n, p) for t, n, p in kube.evictions]
    return Run(
        throttled,
        failed_throttled,
        lost,
        None if tainted_at is None else tainted_at - t0,
        None if untainted_at is None else untainted_at - t0,
        rel,
    )


@pytest.mark.slow
async def test_failed_cooling_node_is_tainted_drained_and_released() -> None:
    off = await simulate(operator_on=False)
    on = await simulate(operator_on=True)
    print(
        f"\nscenario (4 nodes x 8 H100, {DURATION_S / 60:.0f} simulated min, one node with failed cooling):"
        f"\n  operator off: {off.throttled_gpu_minutes:.1f} throttled GPU-minutes "
        f"({off.throttled_failed_node_gpu_minutes:.1f} on {FAILED}), "
        f"{off.lost_gpu_minutes:.1f} GPU-minutes of clock lost"
        f"\n  operator on : {on.throttled_gpu_minutes:.1f} throttled GPU-minutes "
        f"({on.throttled_failed_node_gpu_minutes:.1f} on {FAILED}), "
        f"{on.lost_gpu_minutes:.1f} GPU-minutes of clock lost"
        f"\n  tainted at {on.tainted_at}s, untainted at {on.untainted_at}s, {len(on.evictions)} evictions: "
        f"{[(int(t), p) for t, _, p in on.evictions]}"
    )
    assert off.evictions == [] and off.throttled_failed_node_gpu_minutes > 30  # without the operator it stays hot
    # the operator tainted the node, drained its hot GPUs (only those: jobs on GPUs that stay cool are left alone;
    # healthy nodes are never touched), and released it once cool
    assert on.tainted_at is not None and on.untainted_at is not None and on.untainted_at > on.tainted_at
    assert {n for _, n, _ in on.evictions} == {FAILED}
    drained = {p for _, _, p in on.evictions}
    assert drained <= {f"job{g}" for g in range(8)} and len(drained) == len(on.evictions) >= 3
    # within the limits: at most 1 per node per cycle, at most 3 in any 300 s window
    times = [t for t, _, _ in on.evictions]
    assert len(times) == len(set(times))
    assert all(sum(1 for u in times if t <= u < t + 300) <= 3 for t in times)
    # and it pays: far fewer throttled GPU-minutes
    assert on.throttled_gpu_minutes < 0.5 * off.throttled_gpu_minutes
    assert on.lost_gpu_minutes < 0.5 * off.lost_gpu_minutes
