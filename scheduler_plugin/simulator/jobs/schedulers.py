"""The four schedulers the job simulator compares, each on the same mutable fleet.

* ``kube-default``: kube-scheduler per pod (NodeResourcesFit LeastAllocated, the device plugin's first free GPUs);
* ``kelvin-pod``: kelvin's extender per pod, as today (the default policy's framework, learning every pod it tries);
* ``tas-greedy``: a Kueue-TAS-like greedy: all or nothing, the innermost level at which one domain holds the job, the
  domain with the least free capacity that does (best fit), nodes in order, first free GPUs; no fragmentation or
  heat;
* ``kelvin-gang``: kelvin's gang planner (:class:`~scheduler_plugin.gang.planner.GangPlanner`) for multi-pod jobs,
  kelvin's extender per pod for single-pod ones (a pod without a gang is not gated).

Per-pod schedulers score a sample of the feasible nodes as kube-scheduler does (``percentageOfNodesToScore``, adaptive
default: ``max(5, 50 - N / 125)`` % of the nodes, at least 100), starting where the previous pod stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ...gang.planner import Gang, GangPlan, GangPlanner, Member
from ...gang.readers import TopologyAsk
from ...model import MILLI_PER_GPU, FleetArrays, GpuRequest
from ...policies.framework import Framework
from ...policies.policy_file import PolicyConfig
from ...policies.ranking import tied_best
from ..baselines import SIMULATOR
from ..node_resources import LeastAllocated
from ..policies import SimPolicy, feasible, kelvin_policy, rank, single_score
from .cluster import GANG_POLICY, JobFleet
from .workload import JobSpec

IntA = npt.NDArray[np.int64]
Placed = list[tuple[int, tuple[int, ...]]]

#: The simulated telemetry is static and always fresh: the cycle context is taken at the time it was "observed".
TELEMETRY_TIME = 0.0

SCHEDULERS = ("kube-default", "kelvin-pod", "tas-greedy", "kelvin-gang")


def nodes_to_score(n: int) -> int:
    """kube-scheduler's adaptive ``percentageOfNodesToScore``: how many feasible nodes it scores."""
    pct = max(5.0, 50.0 - n / 125.0)
    return max(100, int(n * pct / 100.0))


class JobScheduler(Protocol):
    name: str
    per_pod: bool
    remediates: bool
    """Runs with kelvin's operator: its straggling jobs are moved when that pays (the thermal scenario)."""

    def place_pod(self, req: GpuRequest, fleet: FleetArrays, now: float) -> tuple[int, tuple[int, ...]] | None: ...

    def place_job(self, job: JobSpec, reqs: list[GpuRequest], fleet: FleetArrays, now: float) -> Placed | None: ...


@dataclass
class PerPod:
    """A per-pod scheduler over a :class:`SimPolicy` (its framework's filters, ranking and picker), with
    kube-scheduler's node sampling."""

    name: str
    policy: SimPolicy
    seed: int
    per_pod: bool = True
    remediates: bool = False
    _next: int = 0
    _rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng([self.seed, 3])

    def place_pod(self, req: GpuRequest, fleet: FleetArrays, now: float) -> tuple[int, tuple[int, ...]] | None:
        fw = self.policy.framework
        fw.observe(req)  # as the extender's filter does for every pod it sees (a pod tried again counts once)
        ctx = fw.context(fleet, TELEMETRY_TIME)
        whole = ((fleet.free_milli >= MILLI_PER_GPU) & fleet.gpu_present).sum(axis=1)
        rows = np.flatnonzero(whole >= req.count).astype(np.int64)  # cheap pre-check of the fit filter
        if rows.size == 0:
            return None
        k = nodes_to_score(fleet.n_nodes)
        start = int(np.searchsorted(rows, self._next % max(fleet.n_nodes, 1)))
        rows = np.concatenate([rows[start:], rows[:start]])
        cand = feasible(self.policy, req, fleet, rows, ctx)
        if cand.size == 0:
            return None
        cand = cand[:k]
        self._next = int(cand[-1]) + 1
        tied = tied_best(cand, rank(self.policy, req, fleet, cand, ctx))
        row = int(tied[self._rng.integers(tied.size)])
        gpus = fw.pick(req, fleet, row, ctx)
        if gpus is None or len(gpus) != req.count:
            return None
        return row, tuple(gpus)

    def place_job(self, job: JobSpec, reqs: list[GpuRequest], fleet: FleetArrays, now: float) -> Placed | None:
        raise NotImplementedError("a per-pod scheduler places pods")


def kube_default(seed: int) -> PerPod:
    fit = SIMULATOR.build("filter", "fit", {}, "filters")
    la = LeastAllocated()
    return PerPod("kube-default", single_score("kube-default", la, fit, la), seed)


def kelvin_pod(seed: int, config: PolicyConfig | None = None) -> PerPod:
    return PerPod("kelvin-pod", kelvin_policy(config, "kelvin-pod"), seed, remediates=True)


@dataclass
class TasGreedy:
    """Kueue-TAS-like: all or nothing, innermost level that fits, best-fit domain, nodes in order, first free GPUs."""

    jf: JobFleet
    name: str = "tas-greedy"
    per_pod: bool = False
    remediates: bool = False

    def place_pod(self, req: GpuRequest, fleet: FleetArrays, now: float) -> tuple[int, tuple[int, ...]] | None:
        raise NotImplementedError("tas-greedy places whole jobs")

    def place_job(self, job: JobSpec, reqs: list[GpuRequest], fleet: FleetArrays, now: float) -> Placed | None:
        free = (fleet.free_milli >= MILLI_PER_GPU) & fleet.gpu_present
        whole = free.sum(axis=1)
        per = job.gpus_per_member
        slots = whole // per
        for col in self.jf.domains.ids:
            n_dom = int(col.max(initial=-1)) + 1
            cap = np.bincount(col, weights=slots, minlength=n_dom)
            fits = np.flatnonzero(cap >= job.members)
            if fits.size == 0:
                continue
            left = np.bincount(col, weights=whole, minlength=n_dom)[fits]
            d = int(fits[np.argmin(left)])
            out: Placed = []
            for row in np.flatnonzero((col == d) & (slots > 0)):
                cols = np.flatnonzero(free[row])
                for k in range(int(slots[row])):
                    if len(out) == job.members:
                        break
                    chosen = cols[k * per : (k + 1) * per]
                    out.append((int(row), tuple(int(fleet.gpu_index[row, c]) for c in chosen)))
                if len(out) == job.members:
                    return out
        return None


@dataclass
class KelvinGang:
    """kelvin's gang planner for multi-pod jobs (preferred=rack), kelvin per pod for single-pod jobs."""

    jf: JobFleet
    seed: int
    config: PolicyConfig | None = None
    name: str = "kelvin-gang"
    per_pod: bool = False
    remediates: bool = True
    planner: GangPlanner = field(init=False)
    single: PerPod = field(init=False)
    last: GangPlan | None = None

    def __post_init__(self) -> None:
        fw = Framework.from_config(self.config or PolicyConfig())
        self.planner = GangPlanner(fw, GANG_POLICY)
        self.single = kelvin_pod(self.seed, self.config)

    def place_pod(self, req: GpuRequest, fleet: FleetArrays, now: float) -> tuple[int, tuple[int, ...]] | None:
        raise NotImplementedError("kelvin-gang places whole jobs")

    def place_job(self, job: JobSpec, reqs: list[GpuRequest], fleet: FleetArrays, now: float) -> Placed | None:
        for r in reqs:  # every pod reaches the extender's filter, which learns it: both frameworks learn alike
            self.planner.fw.observe(r)
            self.single.policy.framework.observe(r)
        if job.members == 1:
            one = self.single.place_pod(reqs[0], fleet, now)
            return None if one is None else [one]
        members = tuple(Member(r.pod_key, r, index=i) for i, r in enumerate(reqs))
        gang = Gang(f"sim/{job.name}", members, TopologyAsk("rack", required=False))
        fw = self.planner.fw
        result = self.planner.plan(gang, fleet, self.jf.domains, fw.context(fleet, TELEMETRY_TIME))
        if not isinstance(result, GangPlan):
            return None
        self.last = result
        return [(p.row, p.gpus) for p in result.placements]


def build_scheduler(name: str, jf: JobFleet, seed: int, config: PolicyConfig | None = None) -> JobScheduler:
    if name == "kube-default":
        return kube_default(seed)
    if name == "kelvin-pod":
        return kelvin_pod(seed, config)
    if name == "tas-greedy":
        return TasGreedy(jf)
    if name == "kelvin-gang":
        return KelvinGang(jf, seed, config)
    raise ValueError(f"unknown scheduler {name!r} (known: {', '.join(SCHEDULERS)})")
