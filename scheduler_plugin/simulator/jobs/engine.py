"""The job simulator's event loop: arrivals and completions over time, a FIFO queue with backfill, and the metrics.

Per-pod schedulers see a job's pods one by one: a pod placed holds its GPUs while the job waits for the rest (the
job starts when its last pod is placed; GPU-hours held that way are *held by incomplete gangs*). Whole-job schedulers
place every pod of a job at once or none. Both try the queue in arrival order at every event (backfill: a later job
that fits starts before an earlier one that does not), at most ``max_tries`` jobs (or pods) per event.

A job runs ``duration * network factor / straggler speed``: the network factor from :class:`.network.Network` (its
ring over the placed GPUs against the tightest layout), the straggler speed that of
:class:`.cluster.CoolingScenario` when a member sits on a poorly cooled node (in the thermal scenario).
The run stops when every job has finished or at ``horizon`` (jobs not started by then count with the time they
waited so far).

Allocation is measured over the second half of the arrival window, and again over the moments of it when a job waited
(*saturated allocation*). The first counts GPU-time, so while the queue is empty it measures the offered work times
its run time: a scheduler whose jobs run longer (spread over the spine) or hold GPUs while their gang waits scores
higher for the same jobs. Only while work waits does a free GPU mean capacity lost to packing, fragmentation or a
blocked queue; the saturated allocation is that figure (docs/jobs.md).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ...model import MILLI_PER_GPU, FleetArrays, GpuRequest
from ..fleet import apply_placement
from .cluster import CoolingScenario, JobFleet
from .network import Network
from .remediation import Remediation, cooler_place
from .schedulers import JobScheduler
from .workload import JobSpec


@dataclass(slots=True)
class JobOutcome:
    job: JobSpec
    started: float | None = None
    finished: float | None = None
    slowdown: float = 1.0
    """Communication slowdown of its ring against the tightest layout."""
    straggler: bool = False
    nodes: int = 0
    racks: int = 0
    min_nodes: int = 1
    min_racks: int = 1
    straggler_gpu_hours: float = 0.0
    """GPU-hours its runs took past their work at full speed: slowed by a straggler, work lost to a move (since the
    last checkpoint) and the restart after it."""
    moves: int = 0
    """Times kelvin's operator moved it off a throttling node (:mod:`.remediation`)."""


@dataclass(slots=True)
class RunMetrics:
    scheduler: str
    seed: int
    thermal: bool
    jobs: list[JobOutcome]
    capacity_gpus: int
    window_s: float
    held_gpu_s: float
    """GPU-seconds allocated (running or held) within the measured window: the arrival window after its first
    ``warmup_share`` (the fleet starts empty)."""
    running_gpu_s: float
    incomplete_gpu_s: float
    """GPU-seconds held by pods of jobs that had not all their pods placed (whole run)."""
    waiting_s: float
    """Seconds of the measured window during which at least one job waited (arrived, not all its pods placed)."""
    waiting_gpu_s: float
    """GPU-seconds allocated during those seconds."""
    seconds: float
    horizon_s: float

    def _delays_h(self) -> np.ndarray:
        out = []
        for o in self.jobs:
            start = o.started if o.started is not None else self.horizon_s
            out.append(max(0.0, start - o.job.arrival_s) / 3600.0)
        return np.asarray(out)

    def summary(self) -> dict[str, float | int | str | bool]:
        delays = self._delays_h()
        multi = [o for o in self.jobs if o.started is not None and o.job.gpus > 1]
        placed = [o for o in self.jobs if o.started is not None]
        over = [o for o in placed if o.job.members > 1 and (o.nodes > o.min_nodes or o.racks > o.min_racks)]
        gang_jobs = [o for o in placed if o.job.members > 1]
        denom = max(self.capacity_gpus * self.window_s, 1.0)
        return {
            "scheduler": self.scheduler,
            "seed": self.seed,
            "thermal": self.thermal,
            "jobs": len(self.jobs),
            "started": len(placed),
            "incomplete_gang_gpu_hours": self.incomplete_gpu_s / 3600.0,
            "queue_p50_hours": float(np.percentile(delays, 50)),
            "queue_p95_hours": float(np.percentile(delays, 95)),
            "over_spread_share": len(over) / max(len(gang_jobs), 1),
            "mean_comm_slowdown": float(np.mean([o.slowdown for o in multi])) if multi else 1.0,
            "allocation_ratio": self.held_gpu_s / denom,
            "running_ratio": self.running_gpu_s / denom,
            "waiting_share": self.waiting_s / max(self.window_s, 1.0),
            "saturated_allocation_ratio": (
                self.waiting_gpu_s / (self.capacity_gpus * self.waiting_s) if self.waiting_s > 0 else float("nan")
            ),
            "straggler_gpu_hours": sum(o.straggler_gpu_hours for o in self.jobs),
            "straggler_moves": sum(o.moves for o in self.jobs),
            "seconds": self.seconds,
        }


@dataclass(slots=True)
class _Pending:
    idx: int
    reqs: list[GpuRequest]
    placed: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    failed_at: int = -1
    """The count of releases when it last failed to be placed: no capacity has freed since, it is not tried again."""


def _requests(job: JobSpec) -> list[GpuRequest]:
    return [GpuRequest(count=job.gpus_per_member, pod_key=f"sim/{job.name}-{m}") for m in range(job.members)]


def simulate_jobs(  # noqa: C901, PLR0913
    jobs: Sequence[JobSpec],
    jf: JobFleet,
    scheduler: JobScheduler,
    *,
    seed: int = 0,
    fleet: FleetArrays | None = None,
    poor: np.ndarray | None = None,
    cooling: CoolingScenario | None = None,
    network: Network | None = None,
    remediation: Remediation | None = None,
    max_tries: int = 64,
    horizon_factor: float = 2.0,
    warmup_share: float = 0.5,
) -> RunMetrics:
    """Run ``jobs`` through ``scheduler`` on a copy of ``fleet`` (default ``jf.fleet``). In the thermal scenario
    (``poor``), a scheduler that runs with kelvin's operator (``scheduler.remediates``) has its straggling jobs moved
    when the gang rule says it pays (``remediation``, default :class:`.remediation.Remediation`)."""
    started_at = time.perf_counter()
    net = network or Network()
    sc = cooling or CoolingScenario()
    rem = remediation or Remediation()
    remediates = poor is not None and scheduler.remediates
    work = (fleet if fleet is not None else jf.fleet).copy()
    node_gpus = int(work.gpu_count.max(initial=1))
    window = max(j.arrival_s for j in jobs) if jobs else 0.0
    warmup = window * warmup_share  # allocation is measured once the fleet has filled
    horizon = max(window * horizon_factor, window + 24 * 3600.0)
    outcomes = [JobOutcome(j) for j in jobs]
    # (time, kind 0 finish / 1 arrival / 2 straggler check, job, run): a moved job's old finish and checks are stale
    events: list[tuple[float, int, int, int]] = []
    for i, j in enumerate(jobs):
        heapq.heappush(events, (j.arrival_s, 1, i, 0))
    queue: deque[_Pending] = deque()
    running: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
    requests: dict[int, list[GpuRequest]] = {}
    remaining = [j.duration_s for j in jobs]  # work left at ideal placement (a move keeps what was checkpointed)
    restart: dict[int, float] = {}  # a moved job pays this when it starts again
    runs = [0] * len(jobs)
    run: dict[int, tuple[float, float, float, float]] = {}  # job -> (started, restart, base, speed) of its run
    held = 0  # GPUs allocated now
    held_running = 0
    held_incomplete = 0
    held_gpu_s = running_gpu_s = incomplete_gpu_s = waiting_gpu_s = waiting_s = 0.0
    now = 0.0
    releases = 0  # capacity only grows when a job finishes: a failed job is tried again after the next release

    def advance(t: float) -> None:
        nonlocal held_gpu_s, running_gpu_s, incomplete_gpu_s, waiting_gpu_s, waiting_s, now
        dt = t - now
        if dt > 0:
            w = max(0.0, min(t, window) - max(now, warmup))
            held_gpu_s += held * w
            running_gpu_s += held_running * w
            incomplete_gpu_s += held_incomplete * dt
            if queue:  # the queue as the last scheduling pass left it, until this event
                waiting_s += w
                waiting_gpu_s += held * w
        now = t

    def start(p: _Pending) -> None:
        nonlocal held_running, held_incomplete
        o = outcomes[p.idx]
        j = o.job
        rows = [r for r, _ in p.placed]
        gpu_nodes = [r for r, g in p.placed for _ in g]
        gpu_racks = [int(jf.rack_of[r]) for r in gpu_nodes]
        bw = net.ring_bandwidth(gpu_nodes, gpu_racks)
        ideal = net.ideal_bandwidth(j.members, j.gpus_per_member, node_gpus, jf.rack_nodes)
        o.slowdown = net.slowdown(bw, ideal)
        o.nodes = len(set(rows))
        o.racks = len({int(jf.rack_of[r]) for r in rows})
        per_node = max(1, node_gpus // j.gpus_per_member)
        o.min_nodes = -(-j.members // per_node)
        o.min_racks = -(-o.min_nodes // jf.rack_nodes)
        slow = bool(poor is not None and any(bool(poor[r]) for r in rows))
        o.straggler = o.straggler or slow
        base = remaining[p.idx] * net.run_factor(o.slowdown)
        speed = sc.straggler_speed if slow else 1.0
        extra = restart.pop(p.idx, 0.0)
        run_s = extra + base / speed
        o.straggler_gpu_hours += (run_s - base) * j.gpus / 3600.0  # taken back in part if the run is cut short
        if o.started is None:
            o.started = now
        running[p.idx] = p.placed
        requests[p.idx] = p.reqs
        run[p.idx] = (now, extra, base, speed)
        if scheduler.per_pod:
            held_incomplete -= sum(len(g) for _, g in p.placed[:-1])  # the last pod was never waiting
        held_running += j.gpus
        heapq.heappush(events, (now + run_s, 0, p.idx, runs[p.idx]))
        if remediates and slow and o.moves < rem.max_moves:
            heapq.heappush(events, (now + rem.check_s, 2, p.idx, runs[p.idx]))

    def release(i: int) -> None:
        nonlocal held, held_running
        for (row, gpus), req in zip(running.pop(i), requests.pop(i), strict=True):
            apply_placement(work, req, row, gpus, sign=-1)
        held -= jobs[i].gpus
        held_running -= jobs[i].gpus

    def check(i: int) -> bool:
        """kelvin's operator on a straggling job: move it (free its GPUs, back to the queue) when the gang rule says
        it pays, else look again in ``check_s``. Whether it moved."""
        o = outcomes[i]
        j = o.job
        started, extra, base, speed = run[i]
        worked = max(0.0, now - started - extra)  # wall seconds of work in this run, after its restart
        assert poor is not None  # checks are only scheduled in the thermal scenario
        own = [(row, len(gpus)) for row, gpus in running[i]]
        new_speed = 1.0 if cooler_place(whole_free(), poor, own, j.members, j.gpus_per_member) else speed
        if not rem.verdict(j.members, j.gpus_per_member, worked, speed, new_speed).move:
            heapq.heappush(events, (now + rem.check_s, 2, i, runs[i]))
            return False
        saved = rem.saved_s(worked) * speed  # full-speed seconds the last checkpoint keeps
        run_s = extra + base / speed
        o.straggler_gpu_hours -= (run_s - base) * j.gpus / 3600.0  # the full run booked at its start
        o.straggler_gpu_hours += (now - started - saved) * j.gpus / 3600.0  # the run as it went: all but the saved
        remaining[i] = max(0.0, remaining[i] * (1.0 - saved / base)) if base > 0 else 0.0
        restart[i] = rem.restart_s
        o.moves += 1
        runs[i] += 1
        del run[i]
        release(i)
        pos = next((k for k, q in enumerate(queue) if q.idx > i), len(queue))  # arrival order
        queue.insert(pos, _Pending(i, _requests(j)))
        return True

    def whole_free() -> np.ndarray:
        return np.asarray(((work.free_milli >= MILLI_PER_GPU) & work.gpu_present).sum(axis=1), dtype=np.int64)

    def schedule() -> None:  # noqa: C901
        """Try the queue in arrival order; a job (pod) that cannot fit anywhere, even by count of free GPUs per
        node, is skipped without asking the scheduler."""
        nonlocal held, held_incomplete
        tries = 0
        whole = whole_free()
        largest = int(whole.max(initial=0))
        slots: dict[int, int] = {}  # GPUs per member -> members that fit by count (cleared on every placement)
        for p in list(queue):
            if tries >= max_tries or largest == 0:
                break
            j = outcomes[p.idx].job
            if p.failed_at == releases:
                continue
            if scheduler.per_pod:
                while len(p.placed) < j.members and tries < max_tries:
                    req = p.reqs[len(p.placed)]
                    if largest < req.count:
                        break
                    tries += 1
                    got = scheduler.place_pod(req, work, now)
                    if got is None:
                        p.failed_at = releases
                        break
                    apply_placement(work, req, got[0], got[1])
                    whole[got[0]] -= req.count
                    largest = int(whole.max(initial=0))
                    p.placed.append(got)
                    held += req.count
                    if len(p.placed) < j.members:
                        held_incomplete += req.count
                if len(p.placed) == j.members:
                    queue.remove(p)
                    start(p)
            else:
                gpm = j.gpus_per_member
                if gpm not in slots:
                    slots[gpm] = int((whole // gpm).sum())
                if slots[gpm] < j.members:
                    continue
                tries += 1
                got_all = scheduler.place_job(j, p.reqs, work, now)
                if got_all is None:
                    p.failed_at = releases
                    continue
                for (row, gpus), req in zip(got_all, p.reqs, strict=True):
                    apply_placement(work, req, row, gpus)
                    whole[row] -= len(gpus)
                largest = int(whole.max(initial=0))
                slots.clear()
                p.placed = list(got_all)
                held += j.gpus
                queue.remove(p)
                start(p)

    while events:
        t, kind, i, nth = heapq.heappop(events)
        if t > horizon:
            break
        if kind != 1 and nth != runs[i]:
            continue  # an event of a run cut short by a move
        advance(t)
        if kind == 1:
            queue.append(_Pending(i, _requests(jobs[i])))
        elif kind == 0:
            outcomes[i].finished = t
            run.pop(i, None)
            release(i)
            releases += 1
        elif i in run and check(i):
            releases += 1
        # events at the same instant are all applied before the queue is tried
        if events and events[0][0] == t:
            continue
        schedule()
    advance(min(horizon, max(now, window)))
    return RunMetrics(
        scheduler=scheduler.name,
        seed=seed,
        thermal=poor is not None,
        jobs=outcomes,
        capacity_gpus=jf.capacity_gpus,
        window_s=max(window - warmup, 1.0),
        held_gpu_s=held_gpu_s,
        running_gpu_s=running_gpu_s,
        incomplete_gpu_s=incomplete_gpu_s,
        waiting_s=waiting_s,
        waiting_gpu_s=waiting_gpu_s,
        seconds=time.perf_counter() - started_at,
        horizon_s=horizon,
    )
