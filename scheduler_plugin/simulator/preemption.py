"""A priority scenario over time: high-priority GPU jobs arriving into a fleet kept full by preemptible (spot) work,
placed by kelvin's framework, preempting by kube-scheduler's count-based rules or by kelvin's victim choice.

Pure computation over a seeded job mix (the CLI is ``bench/preemption.py``). The fleet is the 8-GPU nodes of the
Alibaba spot-GPU node list (``../shared/traces/spot-gpu-2026/node_info_df.csv``, one in ``stride``), with these
assumptions (the list has no topology): A100/A800/H800 SXM nodes are NVSwitch (any GPUs linked), the unnamed
``GPU-series-*`` nodes two 4-GPU NVLink islands joined by PCIe; 80 GiB per GPU where the model does not say.

Both runs place every pod with the same kelvin framework (filter, prioritize, pick). When a high-priority pod fits no
node, the run preempts:

* ``count``: kube-scheduler's default preemption, which counts GPUs. On each node where evicting lower-priority pods
  frees enough GPUs by count, it removes them all and reprieves the most important back (higher priority, then the
  earliest started) while the count still fits; it picks the node with the lowest highest-victim priority, then the
  lowest sum of priorities, then the fewest victims. The pod is nominated there; it binds when kelvin's filter
  passes (the freed GPUs may not be on one NVLink island: then it waits, and preempts again at its next try, the
  freed GPUs held for it as a nomination does).
* ``kelvin``: the same candidate nodes, judged as the extender's verb judges them (in the count-based order, until
  ``candidates`` nodes with a feasible set are kept) by :func:`scheduler_plugin.preemption.choose_victims`; the
  cheapest node's victims are evicted and the pod binds there.

An evicted spot pod stops its whole gang; every pod stopped counts as an eviction and loses its GPUs x the time since
its last checkpoint (or start). Stopped spot jobs are queued again with the work they had not saved.
"""

from __future__ import annotations

import csv
import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from ..model import GIB, MILLI_PER_GPU, FleetArrays, GpuAssignment, GpuInfo, GpuNode, GpuRequest, build_arrays
from ..model.eviction import EvictionFacts
from ..model.request import Topology
from ..policies import Framework, PolicyConfig
from ..policies.base import CycleContext
from ..policies.policy_file import ScorerConfig
from ..policies.priority import PriorityScore
from ..preemption import Candidate, choose_victims
from ..preemption.victims import gang_costs
from .fleet import known_gpu_memory_bytes

Mode = Literal["count", "kelvin"]
HIGH, SPOT = 100, 0
HOUR = 3600.0
ISLAND_MODELS = ("GPU-series-1", "GPU-series-2")
"""8-GPU models modelled as two 4-GPU NVLink islands."""


# --- the fleet -----------------------------------------------------------------------------------------------------


def read_spot_nodes(path: Path, *, stride: int = 7, gpus: int = 8) -> list[GpuNode]:
    """The ``gpus``-GPU nodes of ``node_info_df.csv``, one in ``stride`` (in file order), as empty GPU nodes."""
    with path.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if int(r["gpu_capacity_num"]) == gpus]
    out = []
    for r in rows[::stride]:
        model = r["gpu_model"].strip()
        mem = known_gpu_memory_bytes(model) or 80 * GIB
        islands = model in ISLAND_MODELS
        infos = []
        for j in range(gpus):
            group = range(j // 4 * 4, j // 4 * 4 + 4) if islands else range(gpus)
            infos.append(
                GpuInfo(
                    index=j,
                    uuid=f"{r['node_name']}-{j}",
                    model=model,
                    memory_total_bytes=mem,
                    numa_node=j // 4,
                    pcie_switch=f"sw{j // 2}",
                    nvlink_peers=frozenset(k for k in group if k != j),
                )
            )
        out.append(
            GpuNode(
                name=f"node-{r['node_name']}",
                gpus=tuple(infos),
                cpu_allocatable_milli=int(r["cpu_num"]) * 1000,
                memory_allocatable_bytes=2048 * GIB,
                observed_at=0.0,
            )
        )
    return out


# --- the job mix ---------------------------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Job:
    name: str
    priority: int
    gpus: int
    """Per pod."""
    pods: int
    """1, or the gang's members."""
    topology: Topology
    work_s: float
    """Work left to do (seconds)."""
    checkpoint_s: float | None
    """Checkpoint interval (None: never checkpoints)."""
    arrival: float
    first_arrival: float = 0.0
    started: float = math.nan
    placed: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    """(row, GPUs) per pod while running."""

    @property
    def gang(self) -> str | None:
        return self.name if self.pods > 1 else None

    def request(self, k: int = 0) -> GpuRequest:
        return GpuRequest(
            count=self.gpus,
            topology=self.topology,
            pod_key=f"{self.name}/{k}",
            pod_uid=f"{self.name}/{k}",
            priority=self.priority,
        )

    def saved_at(self, now: float) -> float:
        """When the running job last saved its work (its start when it never checkpoints)."""
        if self.checkpoint_s is None:
            return self.started
        return self.started + math.floor((now - self.started) / self.checkpoint_s) * self.checkpoint_s


@dataclass(frozen=True, slots=True)
class Mix:
    """The job mix (stated with every result)."""

    hours: float = 12.0
    high_per_hour: float = 10.0
    spot_fill: float = 0.97
    """Spot work offered: enough to keep this share of the GPUs busy."""
    seed: int = 1

    def describe(self) -> str:
        return (
            f"{self.hours:g} h; spot (priority {SPOT}) offered to keep {self.spot_fill:.0%} of the GPUs busy: "
            "1 GPU 40 %, 2 GPUs 20 %, 4 GPUs 15 %, 8 GPUs 10 %, gangs of 2 x 4 GPUs 15 %; 1-8 h of work; half "
            f"checkpoint every 30 min, half never. High priority ({HIGH}), {self.high_per_hour:g} an hour (Poisson): "
            "4 GPUs nvlink-required 40 %, 8 GPUs 25 %, 2 GPUs nvlink-required 20 %, 1 GPU 15 %; 1-4 h"
        )


def _spot(rng: random.Random, i: int, at: float) -> Job:
    r = rng.random()
    gpus, pods = (1, 1) if r < 0.40 else (2, 1) if r < 0.60 else (4, 1) if r < 0.75 else (8, 1) if r < 0.85 else (4, 2)
    return Job(
        name=f"spot-{i}",
        priority=SPOT,
        gpus=gpus,
        pods=pods,
        topology=Topology.NVLINK_PREFERRED if gpus > 1 else Topology.ANY,
        work_s=rng.uniform(1, 8) * HOUR,
        checkpoint_s=1800.0 if rng.random() < 0.5 else None,
        arrival=at,
        first_arrival=at,
    )


def _high(rng: random.Random, i: int, at: float) -> Job:
    r = rng.random()
    gpus, topo = (
        (4, Topology.NVLINK_REQUIRED)
        if r < 0.40
        else (8, Topology.NVLINK_REQUIRED)
        if r < 0.65
        else (2, Topology.NVLINK_REQUIRED)
        if r < 0.85
        else (1, Topology.ANY)
    )
    return Job(
        name=f"hp-{i}", priority=HIGH, gpus=gpus, pods=1, topology=topo, work_s=rng.uniform(1, 4) * HOUR,
        checkpoint_s=None, arrival=at, first_arrival=at,
    )  # fmt: skip


def jobs(mix: Mix, total_gpus: int) -> list[Job]:
    """The arrivals of the mix, in time order (the same for both runs)."""
    rng = random.Random(mix.seed)
    out: list[Job] = []
    end = mix.hours * HOUR
    # spot: an initial fill, then arrivals at the rate that keeps the offered load at spot_fill (mean job 4.5 h,
    # mean 2.9 GPUs)
    mean_gpus = 0.4 * 1 + 0.2 * 2 + 0.15 * 4 + 0.10 * 8 + 0.15 * 8
    offered = mix.spot_fill * total_gpus
    i = 0
    while sum(j.gpus * j.pods for j in out) < offered:
        out.append(_spot(rng, i, rng.uniform(0, 60)))
        i += 1
    rate = offered / mean_gpus / (4.5 * HOUR)
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            break
        out.append(_spot(rng, i, t))
        i += 1
    t, k = 0.0, 0
    while True:
        t += rng.expovariate(mix.high_per_hour / HOUR)
        if t >= end:
            break
        out.append(_high(rng, k, t))
        k += 1
    out.sort(key=lambda j: j.arrival)
    return out


# --- the run -------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    mode: Mode
    high_arrived: int = 0
    high_placed: int = 0
    evictions: int = 0
    """Pods stopped by preemption (a gang's members all count)."""
    wasted_evictions: int = 0
    """Pods stopped for a nomination the preemptor could not bind to (count-based, GPUs not on one island)."""
    lost_gpu_hours: float = 0.0
    preemptions: int = 0
    """Preemptions that evicted (each stops one pod at least: evictions / preemptions >= 1)."""
    spot_done_gpu_hours: float = 0.0
    """Spot work done and kept: finished jobs' work, and the checkpointed work of stopped ones."""
    high_wait_s: list[float] = field(default_factory=list)
    choices: int = 0
    exact_choices: int = 0

    @property
    def evictions_per_high(self) -> float:
        return self.evictions / self.high_placed if self.high_placed else math.nan

    @property
    def evictions_per_preemption(self) -> float:
        return self.evictions / self.preemptions if self.preemptions else math.nan

    def wait_mean_s(self) -> float:
        return float(np.mean(self.high_wait_s)) if self.high_wait_s else math.nan

    def wait_p50_s(self) -> float:
        return float(np.percentile(self.high_wait_s, 50)) if self.high_wait_s else math.nan

    def wait_p95_s(self) -> float:
        return float(np.percentile(self.high_wait_s, 95)) if self.high_wait_s else math.nan


class _Sim:
    def __init__(
        self, nodes: Sequence[GpuNode], mode: Mode, *, candidates: int, placement: PolicyConfig | None = None
    ) -> None:
        self.nodes = nodes
        self.now = 0.0
        self.ends: dict[str, tuple[float, Job]] = {}
        """job -> (when it ends, the job) for the running ones."""
        self.requeue: list[Job] = []
        self.fleet: FleetArrays = build_arrays(nodes).copy()
        self.fw = Framework.from_config(placement if placement is not None else PolicyConfig())
        self._learners = [p for p in self.fw.plugins if isinstance(p, PriorityScore)]
        self.mode = mode
        self.candidates = candidates
        self.running: dict[int, list[tuple[Job, int]]] = {i: [] for i in range(len(nodes))}
        """row -> (job, pod number) running there."""
        self.nominated: dict[str, int] = {}
        """high-priority job -> the row its count-based preemption nominated (spot cannot take that node)."""
        self.result = Result(mode)

    # capacity ------------------------------------------------------------------------------------------------------

    def _take(self, row: int, gpus: Sequence[int], sign: int) -> None:
        """Charge (``sign=1``) or give back (``-1``) whole GPUs of ``row``, as a bound pod's record is charged."""
        self.fleet.charge([(row, GpuAssignment("", tuple(gpus)))], sign)

    def _ctx(self, now: float) -> CycleContext:
        self.fleet.observed_at[:] = now
        return self.fw.context(self.fleet, now)

    def place(self, job: Job, now: float, rows: Sequence[int] | None = None) -> bool:
        """Place every pod of ``job`` (all or none) with kelvin's filter, prioritize and pick."""
        all_rows = np.arange(self.fleet.n_nodes, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        if job.priority < HIGH and self.nominated:
            blocked = set(self.nominated.values())
            all_rows = all_rows[[r not in blocked for r in all_rows.tolist()]]
        done: list[tuple[int, tuple[int, ...]]] = []
        for k in range(job.pods):
            ctx = self._ctx(now)  # a cycle per pod: the one before charged the fleet in place (the memos' stamps)
            req = job.request(k)
            # only rows with enough whole GPUs free reach the filter (it would refuse the others, at more cost)
            whole = (self.fleet.free_milli[all_rows] >= MILLI_PER_GPU).sum(axis=1)
            rows_k = all_rows[whole >= job.gpus]
            passed = self.fw.filter(req, self.fleet, rows_k, ctx).passed
            gpus = None
            if passed.size:
                _scores, raw = self.fw.prioritize(req, self.fleet, passed, ctx)
                row = int(passed[int(np.argmax(raw))])
                gpus = self.fw.pick(req, self.fleet, row, ctx)
            if gpus is None:
                for r, g in done:
                    self._take(r, g, -1)
                return False
            self._take(row, gpus, +1)
            done.append((row, tuple(gpus)))
        job.placed = done
        job.started = now
        for k, (r, _) in enumerate(done):
            self.running[r].append((job, k))
        return True

    def stop(self, job: Job, now: float) -> float:
        """Stop a running job (all its pods); returns the GPU-seconds of work it loses."""
        lost = job.gpus * job.pods * max(0.0, now - job.saved_at(now))
        done = job.saved_at(now) - job.started
        for k, (r, g) in enumerate(job.placed):
            self._take(r, g, -1)
            self.running[r] = [(j, n) for j, n in self.running[r] if not (j is job and n == k)]
        job.placed = []
        job.work_s -= max(0.0, done)
        return lost

    # preemption ----------------------------------------------------------------------------------------------------

    def _count_victims(self, row: int, job: Job) -> list[Job] | None:
        """kube-scheduler's count-based victims on ``row`` (jobs, not pods), or None when removing every lower
        priority pod does not free enough GPUs by count or the node needs no victim."""
        f = self.fleet
        present = f.gpu_present[row]
        if int(present.sum()) < job.gpus:
            return None
        free = int(((f.tenants[row] == 0) & present).sum())
        if free >= job.gpus:
            return None
        lower = [(j, k) for j, k in self.running[row] if j.priority < job.priority]
        freed = free + sum(j.gpus for j, _ in lower)
        if freed < job.gpus or not lower:
            return None
        # reprieve the most important first (higher priority, then earlier start)
        victims = []
        for j, _k in sorted(lower, key=lambda jk: (-jk[0].priority, jk[0].started)):
            if freed - j.gpus >= job.gpus:
                freed -= j.gpus
            else:
                victims.append(j)
        return list(dict.fromkeys(victims))

    def _count_key(self, victims: list[Job]) -> tuple[int, int, int]:
        return (max(v.priority for v in victims), sum(v.priority for v in victims), len(victims))

    def preempt(self, job: Job, now: float) -> bool:
        found = [(r, v) for r in range(self.fleet.n_nodes) if (v := self._count_victims(r, job))]
        if not found:
            return False
        found.sort(key=lambda rv: self._count_key(rv[1]))
        if self.mode == "count":
            row, victims = found[0]
            self._evict(victims, now)
            self.nominated[job.name] = row
            if self.place(job, now, rows=[row]):
                self.nominated.pop(job.name, None)
                return True
            self.result.wasted_evictions += sum(v.pods for v in victims)
            return False
        best = None
        ctx = self._ctx(now)
        view = self.fw.view(self.fleet, ctx)
        everyone = [self._assignment(j, k) for r in self.running for j, k in self.running[r]]
        gangs = gang_costs(everyone, now)
        req = job.request()
        kept = 0
        for row, _ in found:  # as the verb: in kube-scheduler's order, until ``candidates`` nodes are kept
            if kept >= self.candidates:
                break
            cands = [Candidate.of(self._assignment(j, k), now) for j, k in self.running[row]]
            ch = choose_victims(self.fw, view, row, req, cands, now, gangs=gangs, pick=False)
            if ch is None or not ch.units:
                continue
            kept += 1
            if best is None or ch.cost < best[1].cost:
                best = (row, ch)
        if best is None:
            return False
        row, ch = best
        self.result.choices += 1
        self.result.exact_choices += ch.exact
        by_name = {j.name: j for j, _ in self.running[row]}
        self._evict(list(dict.fromkeys(by_name[c.pod_key.split("/")[0]] for c in ch.victims)), now)
        return self.place(job, now, rows=[row])

    def _assignment(self, job: Job, k: int) -> GpuAssignment:
        """The record kelvin keeps of pod ``k`` of a running job, with the facts preemption weighs."""
        saved = job.saved_at(self.now)
        facts = EvictionFacts(
            gang=job.gang, started_at=job.started, checkpoint_at=saved if saved > job.started else None
        )
        return GpuAssignment(
            pod_key=f"{job.name}/{k}",
            gpu_indices=job.placed[k][1],
            pod_uid=f"{job.name}/{k}",
            priority=job.priority,
            eviction=facts,
        )

    def _evict(self, victims: list[Job], now: float) -> None:
        self.result.preemptions += bool(victims)
        for v in victims:
            self.result.evictions += v.pods
            self.result.spot_done_gpu_hours += v.gpus * v.pods * max(0.0, v.saved_at(now) - v.started) / HOUR
            self.result.lost_gpu_hours += self.stop(v, now) / HOUR
            self.requeue.append(replace(v, arrival=now, placed=[], started=math.nan))
            self.ends.pop(v.name, None)

    # the loop ------------------------------------------------------------------------------------------------------

    def run(self, arrivals: Sequence[Job], end: float, *, spot_tries: int = 25) -> Result:
        events: list[tuple[float, int, str, str]] = []
        seq = 0
        for j in arrivals:
            heapq.heappush(events, (j.arrival, seq, "arrive", j.name))
            seq += 1
        by_name = {j.name: j for j in arrivals}
        pending_high: list[Job] = []
        pending_spot: list[Job] = []
        while events:
            t, _, kind, name = heapq.heappop(events)
            if t > end:
                break
            self.now = t
            if kind == "arrive":
                j = by_name[name]
                self._observe(j)
                if j.priority >= HIGH:
                    self.result.high_arrived += 1
                    pending_high.append(j)
                else:
                    pending_spot.append(j)
            else:  # done
                got = self.ends.get(name)
                if got is None or got[0] != t:
                    continue  # stopped by preemption meanwhile
                self.ends.pop(name)
                if got[1].priority < HIGH:
                    self.result.spot_done_gpu_hours += got[1].gpus * got[1].pods * got[1].work_s / HOUR
                self.stop(got[1], t)
            # high priority first, each may preempt
            still = []
            for j in pending_high:
                if self.place(j, t) or self.preempt(j, t):
                    self.nominated.pop(j.name, None)
                    self.result.high_placed += 1
                    self.result.high_wait_s.append(t - j.first_arrival)
                    self._finish_at(j, t, events, seq)
                    seq += 1
                else:
                    still.append(j)
            pending_high = still
            pending_spot.extend(self.requeue)
            self.requeue.clear()
            kept = []
            for n, j in enumerate(pending_spot):
                if n < spot_tries and self.place(j, t):
                    self._finish_at(j, t, events, seq)
                    seq += 1
                else:
                    kept.append(j)
            pending_spot = kept
        return self.result

    def _observe(self, job: Job) -> None:
        """The extender's filter observes every pod it sees: the priority policy learns the protected mix."""
        for learner in self._learners:
            learner.observe(job.request())

    def _finish_at(self, j: Job, t: float, events: list[tuple[float, int, str, str]], seq: int) -> None:
        at = t + j.work_s
        self.ends[j.name] = (at, j)
        heapq.heappush(events, (at, seq, "done", j.name))


def placement_config(*, priority_weight: float = 0.0, reserve_gpus: int = 0) -> PolicyConfig:
    """kelvin's default policy, plus, when either is above 0, the ``priority`` policy
    (:mod:`scheduler_plugin.policies.priority`, ``protectFrom`` the high priority, the protected mix learned from
    the arrivals): its score at ``priority_weight``, its reserve of ``reserve_gpus``."""
    cfg = PolicyConfig()
    if priority_weight <= 0 and reserve_gpus <= 0:
        return cfg
    args = {"protectFrom": HIGH, "reserveGpus": reserve_gpus}
    scoring = {**cfg.scoring, "priority": ScorerConfig(weight=priority_weight, args=args)}
    return PolicyConfig.from_mapping({"scoring": {k: v.model_dump(by_alias=True) for k, v in scoring.items()}})


def simulate(
    nodes: Sequence[GpuNode], mix: Mix, mode: Mode, *, candidates: int = 16, placement: PolicyConfig | None = None
) -> Result:
    """One run; ``placement``: the policy the framework places with (kelvin's default unless given)."""
    total = sum(len(n.gpus) for n in nodes)
    arrivals = [replace(j) for j in jobs(mix, total)]
    sim = _Sim(nodes, mode, candidates=candidates, placement=placement)
    return sim.run(arrivals, mix.hours * HOUR)
