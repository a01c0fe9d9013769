"""The thermal scenario: a time-stepped replay on the simulated fleet, where heat follows load.

The fleet is :class:`~scheduler_plugin.simulator.simulated_fleet.SimulatedFleetSource` (its thermal model is
:mod:`scheduler_plugin.simulator.thermal_model`: temperature follows load and cooling quality; a few nodes have poor
cooling). Pods arrive as a Poisson process, ask for 1-8 whole GPUs, run for an exponential time and leave; a pod that
fits nowhere waits in a FIFO queue. Every step the fleet heats or cools, telemetry is read back into
:class:`FleetArrays` (with the trend over the last step), finished pods leave and waiting pods are placed. Each pod
tried is observed by the policy's framework first, as the extender's filter observes every pod it sees (kelvin learns
the scenario's mix from its arrivals).

Policies compared:

* ``default``: kube-scheduler's spreading (NodeResourcesFit + LeastAllocated), blind to temperature;
* ``kelvin-no-thermal``: kelvin's framework with the thermal score and thermal hard limits turned off;
* ``kelvin``: kelvin's default framework (thermal score and hard limits on);
* ``kelvin+operator``: the same with kelvin's operator (hot-node taint; evictions under its default thermal eviction
  rule, ``pays``: :mod:`scheduler_plugin.thermal_eviction`, the code the operator's thermal strategy calls);
* ``kelvin+operator-warm``: the same with the rule ``warm`` (every pod on a warm GPU of a hot node moves).

Figures: useful work (GPU-hours at full clocks), GPU-minutes spent thermally throttled, evictions and their cost
(progress since the last checkpoint plus the restart), and pods placed on a node that was at or above its slowdown
temperature at placement time.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from .. import hotness, thermal_eviction
from ..model import GIB, THERMAL_THROTTLE_MASK, FleetArrays, GpuAssignment, GpuNode, GpuRequest, build_arrays
from ..operator_settings import OperatorConfig, ThermalEvictionConfig
from ..policies.policy_file import FilterPolicy, PolicyConfig, ScorerConfig
from ..telemetry.cooling import CoolingEstimator
from .baselines import SIMULATOR
from .fleet import apply_placement
from .node_resources import LeastAllocated
from .policies import SimPolicy, feasible, kelvin_policy, rank, single_score
from .simulated_fleet import FleetSpec, SimulatedFleetSource

THERMAL_POLICIES = ("default", "kelvin-no-thermal", "kelvin", "kelvin+operator", "kelvin+operator-warm")
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
    checkpoint_min: float = 10.0
    """A pod saves its progress every this many minutes of work (an eviction loses what came after)."""
    restart_s: float = 120.0
    """What an evicted pod pays to start again (image, process start, loading its checkpoint), holding its GPUs."""

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
    useful_gpu_hours: float = 0.0
    """Work kept at the end, in GPU-hours at full clocks: what finished pods did, plus the progress of running ones,
    less what evictions threw away (progress since the last checkpoint)."""
    pods_done: int = 0
    """Pods whose work completed within the horizon."""
    evictions: int = 0
    lost_gpu_minutes: float = 0.0
    """GPU-minutes evictions cost: the progress thrown away (at full clocks) plus the restarts (GPUs held, no work)."""

    @property
    def cost_gpu_minutes(self) -> float:
        """Throttled GPU-minutes plus what evictions cost: the figure the operator is judged by."""
        return self.throttled_gpu_minutes + self.lost_gpu_minutes

    def as_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "throttled_gpu_minutes": round(self.throttled_gpu_minutes, 1),
            "useful_gpu_hours": round(self.useful_gpu_hours, 2),
            "pods_done": self.pods_done,
            "evictions": self.evictions,
            "lost_gpu_minutes": round(self.lost_gpu_minutes, 1),
            "placements": self.placements,
            "placements_on_hot_nodes": self.placements_on_hot_nodes,
            "mean_wait_s": round(self.mean_wait_s, 1),
            "gpu_hours_run": round(self.gpu_hours_run, 1),
            "max_temp_c": round(self.max_temp_c, 1),
            "seconds": round(self.seconds, 1),
        }


def thermal_policy(name: str) -> SimPolicy:
    if name == "default":
        blind = SIMULATOR.build("filter", "fit", {"thermalHardLimits": False, "throttleHardLimit": False}, "filters")
        spread = LeastAllocated()
        return single_score("default", spread, blind, spread)
    if name == "kelvin-no-thermal":
        base = PolicyConfig()
        scoring = {k: v for k, v in base.scoring.items() if k != "thermal"}
        scoring["thermal"] = ScorerConfig(weight=0.0, args={"holdRunSeconds": 0})  # nor holds pods
        cfg = base.model_copy(
            update={"scoring": scoring, "filters": FilterPolicy(thermal_hard_limits=False, throttle_hard_limit=False)}
        )
        return kelvin_policy(cfg, name)
    if name in ("kelvin", "kelvin+operator", "kelvin+operator-warm"):
        return kelvin_policy(PolicyConfig(), name)
    raise ValueError(f"unknown thermal policy {name!r} (known: {', '.join(THERMAL_POLICIES)})")


def _read(
    source: SimulatedFleetSource, at: float, previous: FleetArrays | None, dt: float, cooling: CoolingEstimator
) -> tuple[list[GpuNode], FleetArrays]:
    """Telemetry as the extender's snapshot cache would publish it: trend over the last step, cooling quality
    learned from every reading so far (and the nodes it was built from, which the operator reads)."""
    nodes = source.snapshot_nodes(observed_at=at)
    fleet = build_arrays(nodes)
    if previous is not None and dt > 0:
        fleet.trend = (fleet.temp - previous.temp) * (60.0 / dt)
    cooling.fill(fleet)
    return nodes, fleet


@dataclass(slots=True)
class _Job:
    """One pod's life: its progress in seconds at full clocks, the progress its last checkpoint saved, the restart
    it still has to go through (seconds holding its GPUs without progress), and where it runs."""

    pod: Arrival
    queued_at: float
    done_s: float = 0.0
    saved_s: float = 0.0
    saved_at: float = 0.0
    """When the last checkpoint was written (what the pod's ``kelvin.dev/checkpoint-done`` would say)."""
    restart_s: float = 0.0
    row: int = -1
    gpus: tuple[int, ...] = ()
    started_at: float = 0.0
    placed_once: bool = False


@dataclass(slots=True)
class _Operator:
    """kelvin's operator in the scenario: per node the shared hot-node state machine (:mod:`scheduler_plugin.hotness`,
    as the operator's reconcile runs it), the thermal taint (no new pod on a hot node), and the operator's thermal
    eviction rule (:func:`scheduler_plugin.thermal_eviction.judge`, what its thermal strategy calls) under its
    protections (minimum age) and limits (per node per cycle, cluster-wide per window); the cheapest to restart (least
    work since the last checkpoint) goes first, as its planner ranks among equals.

    The rule sees what the operator sees on a cluster: the GPUs' telemetry, the pod's age and the time since its last
    checkpoint (``kelvin.dev/checkpoint-done``), never the pod's true remaining work."""

    cfg: OperatorConfig
    state: dict[str, hotness.NodeHotness] = field(default_factory=dict)
    recent: deque[float] = field(default_factory=deque)

    def _wanted(self, j: _Job, node: GpuNode, obs: hotness.Observation, now: float) -> bool:
        age = now - j.started_at
        if age < self.cfg.protection.min_pod_age_s:
            return False
        lost = now - max(j.started_at, j.saved_at)
        return thermal_eviction.judge(node, obs, j.gpus, age, lost, self.cfg.thermal_eviction).move

    def cycle(self, nodes: list[GpuNode], running: list[_Job], names: tuple[str, ...], now: float) -> list[_Job]:
        """Advance every node's hotness; return the jobs to evict this cycle."""
        lim = self.cfg.limits
        while self.recent and self.recent[0] <= now - lim.window_s:
            self.recent.popleft()
        by_row: dict[int, list[_Job]] = {}
        for j in running:
            by_row.setdefault(j.row, []).append(j)
        out: list[_Job] = []
        row_of = {n: i for i, n in enumerate(names)}
        for node in nodes:
            obs = hotness.observe(node, self.cfg.hotness)
            st, _ = hotness.step(self.state.get(node.name, hotness.NodeHotness()), obs, now, self.cfg.hotness)
            self.state[node.name] = st
            if not st.hot:
                continue
            jobs = [j for j in by_row.get(row_of[node.name], []) if self._wanted(j, node, obs, now)]
            jobs.sort(key=lambda j: (now - max(j.started_at, j.saved_at), j.pod.key))
            for j in jobs[: lim.max_per_node_per_cycle]:
                if len(self.recent) >= lim.max_total:
                    return out
                self.recent.append(now)
                out.append(j)
        return out

    def tainted(self) -> set[str]:
        return {n for n, st in self.state.items() if st.hot}


def well_cooled(sc: ThermalScenario) -> ThermalScenario:
    """The same scenario (fleet, seed, arrivals) with every node well cooled: the reference for useful work."""
    return replace(sc, poor_cooling_fraction=0.0)


def run_thermal(  # noqa: C901
    sc: ThermalScenario, policy_name: str, *, progress: Callable[[int, int], None] | None = None
) -> ThermalResult:
    """Run the scenario with one policy. Pods do ``duration_s`` of work at full clocks; a throttled GPU (its SM clock
    below maximum) makes the pod's progress slower, the slowest of its GPUs setting the pace. With the operator
    (``kelvin+operator``) an evicted pod goes back to the head of the queue with the progress of its last checkpoint
    (every ``checkpoint_min`` minutes of progress) and has to restart (``restart_s``) before progressing again."""
    started = time.perf_counter()
    policy = thermal_policy(policy_name)
    operator = None
    if "+operator" in policy_name:
        rule = ThermalEvictionConfig(restart_s=sc.restart_s)
        if policy_name.endswith("-warm"):
            rule = rule.model_copy(update={"rule": "warm"})
        operator = _Operator(OperatorConfig(thermal_eviction=rule))
    source = SimulatedFleetSource(sc.spec(), clock=lambda: 0.0)
    pods = arrivals(sc)
    steps = int(sc.hours * 3600.0 / sc.step_s)
    checkpoint_s = sc.checkpoint_min * 60.0
    queue: deque[_Job] = deque()
    running: list[_Job] = []
    finished: list[_Job] = []
    nxt = 0
    throttled_s = 0.0
    placed = hot_placed = evictions = 0
    lost_gpu_s = 0.0
    waits: list[float] = []
    gpu_s = 0.0
    max_temp = 0.0
    fleet: FleetArrays | None = None
    cooling = CoolingEstimator()
    for k in range(steps):
        t = (k + 1) * sc.step_s
        source.advance(sc.step_s)
        nodes, fleet = _read(source, t, fleet, sc.step_s, cooling)
        still: list[_Job] = []
        for j in running:
            cols = np.flatnonzero(np.isin(fleet.gpu_index[j.row], j.gpus) & fleet.gpu_present[j.row])
            speed = float(fleet.clock_ratio[j.row, cols].min()) if len(cols) else 1.0
            dt = sc.step_s
            if j.restart_s > 0:
                r = min(j.restart_s, dt)
                j.restart_s -= r
                dt -= r
            j.done_s = min(j.pod.duration_s, j.done_s + dt * speed)
            saved = (j.done_s // checkpoint_s) * checkpoint_s
            if saved > j.saved_s:
                j.saved_s, j.saved_at = saved, t
            if j.done_s >= j.pod.duration_s:
                source.release(j.pod.key)
                finished.append(j)
            else:
                still.append(j)
        running = still
        throttled = (fleet.throttle & THERMAL_THROTTLE_MASK) != 0
        throttled_s += float(throttled[fleet.gpu_present].sum()) * sc.step_s
        gpu_s += float((fleet.assigned_milli > 0).sum()) * sc.step_s
        max_temp = max(max_temp, float(fleet.temp[fleet.gpu_present].max()))
        rows = np.arange(fleet.n_nodes, dtype=np.int64)
        if operator is not None:
            for j in operator.cycle(nodes, running, fleet.names, t):
                running.remove(j)
                source.release(j.pod.key)
                lost_gpu_s += (j.done_s - j.saved_s + sc.restart_s) * j.pod.gpus
                j.done_s = j.saved_s
                j.restart_s = sc.restart_s
                j.queued_at = t
                evictions += 1
                queue.appendleft(j)  # its GPUs free up on the next reading; it goes first then
            tainted = operator.tainted()
            rows = rows[[n not in tainted for n in fleet.names]]
        while nxt < len(pods) and pods[nxt].at_s <= t:
            queue.append(_Job(pods[nxt], pods[nxt].at_s))
            nxt += 1
        hot_node = (fleet.temp >= fleet.slowdown).any(axis=1) | throttled.any(axis=1)
        waiting: deque[_Job] = deque()
        while queue:
            job = queue.popleft()
            pod = job.pod
            req = GpuRequest(
                count=pod.gpus,
                cpu_milli=sc.cpu_per_gpu * pod.gpus,
                host_memory_bytes=sc.memory_per_gpu * pod.gpus,
                pod_key=pod.key,
                pod_uid=pod.key,
                pending_since=job.queued_at,
            )
            # as the extender's filter does for every pod it sees: the fragmentation score learns the scenario's
            # mix from its arrivals (a pod tried again, or evicted and queued again, counts once: same UID)
            policy.framework.observe(req)
            ctx = policy.framework.context(fleet, t)
            cand = feasible(policy, req, fleet, rows, ctx)
            gpus: tuple[int, ...] | None = None
            if len(cand):
                score = rank(policy, req, fleet, cand, ctx)
                row = int(cand[int(np.argmax(score))])
                gpus = policy.framework.pick(req, fleet, row, ctx)
            if gpus is None:
                waiting.append(job)
                continue
            apply_placement(fleet, req, row, gpus)
            source.record_binding(fleet.names[row], GpuAssignment(pod.key, tuple(gpus), pod_uid=pod.key))
            job.row, job.gpus, job.started_at = row, tuple(gpus), t
            running.append(job)
            if not job.placed_once:
                job.placed_once = True
                placed += 1
                waits.append(t - job.queued_at)
            hot_placed += int(hot_node[row])
        queue = waiting
        if progress is not None:
            progress(k + 1, steps)
    jobs = [*finished, *running, *queue]
    return ThermalResult(
        policy=policy_name,
        throttled_gpu_minutes=throttled_s / 60.0,
        placements=placed,
        placements_on_hot_nodes=hot_placed,
        mean_wait_s=float(np.mean(waits)) if waits else 0.0,
        gpu_hours_run=gpu_s / 3600.0,
        max_temp_c=max_temp,
        seconds=time.perf_counter() - started,
        useful_gpu_hours=sum(j.done_s * j.pod.gpus for j in jobs) / 3600.0,
        pods_done=len(finished),
        evictions=evictions,
        lost_gpu_minutes=lost_gpu_s / 60.0,
    )
