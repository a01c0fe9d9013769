"""Run the job simulation for ``kelvin simulate --jobs`` and ``bench/job_placement.py``: load the fleet and the jobs,
run every scheduler (and seed, and scenario), and report."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...policies.policy_file import PolicyConfig
from .cluster import DEFAULT_RACK_NODES, CoolingScenario, JobFleet, apply_cooling, build_job_fleet, load_trace_nodes
from .engine import RunMetrics, simulate_jobs
from .network import Network
from .schedulers import SCHEDULERS, build_scheduler
from .workload import JobMix, JobSpec, generate, read_jobs

GENERATE = "generate"


@dataclass(frozen=True, slots=True)
class JobRun:
    nodes: Path
    jobs: str
    """``generate`` or the path of a job CSV."""
    count: int = 2000
    load: float = 1.3
    seeds: tuple[int, ...] = (42,)
    schedulers: tuple[str, ...] = SCHEDULERS
    rack_nodes: int = DEFAULT_RACK_NODES
    thermal: bool = True


def load(run: JobRun) -> tuple[JobFleet, Callable[[int], list[JobSpec]], str]:
    """The fleet, a job list per seed, and a line saying what the jobs are."""
    unknown = [s for s in run.schedulers if s not in SCHEDULERS]
    if unknown:
        raise ValueError(f"unknown scheduler {unknown[0]!r} (known: {', '.join(SCHEDULERS)})")
    jf = build_job_fleet(load_trace_nodes(run.nodes), run.rack_nodes)
    if run.jobs == GENERATE:
        mix = JobMix(load=run.load)

        def jobs_of(seed: int) -> list[JobSpec]:
            return generate(mix, jf.capacity_gpus, run.count, seed)

        return jf, jobs_of, f"{run.count} generated jobs per seed: {mix.describe(jf.capacity_gpus)}"
    fixed = read_jobs(Path(run.jobs))
    return jf, lambda seed: fixed, f"{len(fixed)} jobs from {run.jobs}"


def run_all(
    run: JobRun,
    progress: Callable[[str], None] | None = None,
    config: PolicyConfig | None = None,
) -> tuple[JobFleet, str, list[RunMetrics]]:
    jf, jobs_of, what = load(run)
    net = Network()
    sc = CoolingScenario()
    results: list[RunMetrics] = []
    scenarios: Sequence[bool] = (False, True) if run.thermal else (False,)
    for seed in run.seeds:
        jobs = jobs_of(seed)
        for thermal in scenarios:
            fleet, poor = apply_cooling(jf, sc, seed) if thermal else (None, None)
            for name in run.schedulers:
                if progress is not None:
                    progress(f"{'thermal' if thermal else 'base'} {name} seed {seed}")
                sched = build_scheduler(name, jf, seed, config)
                results.append(
                    simulate_jobs(jobs, jf, sched, seed=seed, fleet=fleet, poor=poor, cooling=sc, network=net)
                )
    return jf, what, results
