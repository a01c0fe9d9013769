"""``kelvin simulate``: replay a cluster trace through kelvin's policies and the FGD paper's baselines, or run the
time-stepped thermal scenario (``--thermal``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..console import console, fail
from ..policies.registry import PolicyConfigError
from ..textfile import decode_problem, first_undecodable
from .engine import RunResult, prepare, run
from .jobs.report import aggregate, goals, json_rows, table, write_csv, write_png
from .jobs.run import JobRun, run_all
from .jobs.schedulers import SCHEDULERS
from .policies import POLICIES, build_policy
from .report import json_summary, summary_table, write_curve_csv, write_plot
from .thermal import THERMAL_POLICIES, ThermalResult, ThermalScenario, run_thermal
from .trace import TraceError, load_trace

#: What the trace replay's progress bar counts: the arrived GPU demand (the protocol stops arrivals at --target %
#: of the cluster's GPU capacity, so the number of arrivals is known only at the end, and is not the trace's pods).
ARRIVED_COLUMN = "{task.completed:.0f}/{task.total:.0f} % of GPU capacity arrived"

#: Where ``--out`` defaults to: this folder in the current directory (documented in docs/simulator.md; git ignores it).
DEFAULT_OUT = Path("simulate-out")


def _progress(err: Console, enabled: bool, counted: str | None = None) -> Progress:
    """A progress bar; ``counted`` is the format of the count column (default: done/total steps)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn(counted) if counted else MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not enabled,
    )


def _thermal(err: Console, seeds: list[int], hours: float, json_out: bool, progress: bool, policies: list[str]) -> None:
    results: list[tuple[int, ThermalResult]] = []
    with _progress(err, progress) as bar:
        for s in seeds:
            sc = ThermalScenario(seed=s, hours=hours)
            for p in policies:
                task = bar.add_task(f"thermal {p} seed {s}", total=None)

                def tick(done: int, total: int, task_id: TaskID = task) -> None:
                    bar.update(task_id, completed=done, total=total)

                results.append((s, run_thermal(sc, p, progress=tick)))
    table = Table(title=f"Thermal scenario ({hours:g} h per seed)")
    for col in (
        "seed",
        "policy",
        "useful GPU-h",
        "throttled GPU-min",
        "vs default",
        "evictions",
        "eviction cost GPU-min",
        "placements",
        "on hot nodes",
        "mean wait s",
    ):
        table.add_column(col, justify="left" if col == "policy" else "right")
    base = {s: r.throttled_gpu_minutes for s, r in results if r.policy == "default"}
    for s, r in results:
        b = base.get(s)
        rel = f"{100 * (r.throttled_gpu_minutes - b) / b:+.0f} %" if b else "-"
        table.add_row(
            str(s),
            r.policy,
            f"{r.useful_gpu_hours:.1f}",
            f"{r.throttled_gpu_minutes:.1f}",
            rel,
            str(r.evictions),
            f"{r.lost_gpu_minutes:.1f}",
            str(r.placements),
            str(r.placements_on_hot_nodes),
            f"{r.mean_wait_s:.0f}",
        )
    (err if json_out else console()).print(table)
    if json_out:
        sys.stdout.write(json.dumps({"thermal": [dict(seed=s, **r.as_dict()) for s, r in results]}, indent=2) + "\n")


def _jobs(err: Console, job_run: JobRun, out: Path, json_out: bool, progress: bool) -> None:
    with _progress(err, progress) as bar:
        task = bar.add_task("jobs", total=None)
        try:
            jf, what, results = run_all(job_run, lambda d: bar.update(task, description=d))
        except (TraceError, ValueError) as exc:
            fail(exc)
    rows = aggregate(results)
    human = err if json_out else console()
    human.print(jf.describe())
    human.print(what)
    human.print(table(rows, f"Jobs on {job_run.nodes.name}"))
    for name, met, figures in goals(rows):
        human.print(f"{'met' if met else 'NOT met'}: {name} ({figures})")
    write_csv(rows, out / "jobs.csv")
    write_png(rows, out / "jobs.png", title=f"{job_run.nodes.name}: {what.split(':')[0]}")
    where = out.absolute()
    human.print(f"table: {escape(str(where / 'jobs.csv'))}  plot: {escape(str(where / 'jobs.png'))}")
    if json_out:
        sys.stdout.write(
            json.dumps({"fleet": jf.describe(), "jobs": what, "rows": json_rows(rows)}, indent=2, allow_nan=False)
            + "\n"
        )


def simulate(  # noqa: C901
    nodes: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH", help="node list: openb CSV (sn,cpu_milli,memory_mib,gpu,model) or kelvin YAML/CSV"
        ),
    ] = None,
    pods: Annotated[
        Path | None,
        typer.Option(metavar="PATH", help="pod list: openb CSV (name,cpu_milli,...,gpu_spec) or kelvin YAML/CSV"),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            show_default=False,
            metavar="POLICY",
            help=f"policy (repeatable): {', '.join(POLICIES)} (default kelvin); with --thermal: "
            f"{', '.join(THERMAL_POLICIES)} (default all three)",
        ),
    ] = None,
    seed: Annotated[
        list[int] | None, typer.Option(show_default=False, metavar="SEED", help="seed (repeatable) (default 42)")
    ] = None,
    target: Annotated[
        float, typer.Option(metavar="PERCENT", help="inflate arrivals to this % of cluster GPU capacity", min=1)
    ] = 130.0,
    policy_file: Annotated[
        Path | None, typer.Option(metavar="PATH", help="kelvin policy YAML for the 'kelvin' policy")
    ] = None,
    out: Annotated[
        Path,
        typer.Option(
            metavar="FOLDER",
            help="folder for curve.csv and curve.png (created; default: simulate-out in the current directory)",
        ),
    ] = DEFAULT_OUT,
    json_out: Annotated[bool, typer.Option("--json", help="print a machine-readable summary to stdout")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
    thermal: Annotated[bool, typer.Option(help="run the time-stepped thermal scenario instead of a trace")] = False,
    hours: Annotated[
        float, typer.Option(metavar="HOURS", help="simulated hours of the thermal scenario", min=0.01)
    ] = 4.0,
    learn_workload: Annotated[
        bool,
        typer.Option(
            help="fragmentation policies learn the workload from the arrivals, as the extender does in a cluster, "
            "instead of being given the trace's (the paper's protocol)"
        ),
    ] = False,
    jobs: Annotated[
        str | None,
        typer.Option(
            metavar="SOURCE",
            help="job-level mode (docs/jobs.md): multi-pod jobs over time on --nodes; SOURCE is 'generate' (the "
            "seeded generator) or the path of a job CSV "
            "(name,arrival_seconds,duration_seconds,members,gpus_per_member); compares "
            f"{', '.join(SCHEDULERS)} (--policy picks some); with --thermal also the poorly-cooled-nodes scenario",
        ),
    ] = None,
    job_count: Annotated[int, typer.Option(metavar="N", help="--jobs generate: jobs per seed", min=1)] = 2000,
    load: Annotated[
        float, typer.Option(metavar="RATIO", help="--jobs generate: offered GPU demand / capacity", min=0.05)
    ] = 1.3,
    rack_nodes: Annotated[
        int, typer.Option(metavar="N", help="--jobs: nodes per assumed rack (one GPU model and size)", min=1)
    ] = 16,
) -> None:
    """Replay a trace with the FGD paper's protocol (seeded shuffle, inflation to --target %) and compare policies."""
    err = console(stderr=True)
    seeds = seed or [42]
    if jobs is not None:
        if nodes is None:
            fail("--jobs needs --nodes (the fleet: the spot-GPU node list, openb's or kelvin's own)")
        _jobs(
            err,
            JobRun(nodes, jobs, job_count, load, tuple(seeds), tuple(policy or SCHEDULERS), rack_nodes, thermal),
            out,
            json_out,
            progress,
        )
        return
    if thermal:
        unknown = [p for p in policy or () if p not in THERMAL_POLICIES]
        if unknown:
            fail(
                f"--policy {unknown[0]!r} is not a thermal-scenario policy; with --thermal use "
                f"{', '.join(THERMAL_POLICIES)}"
            )
        _thermal(err, seeds, hours, json_out, progress, list(dict.fromkeys(policy or THERMAL_POLICIES)))
        return
    if nodes is None or pods is None:
        fail("--nodes and --pods are required (or use --thermal)")
    policies = policy or ["kelvin"]
    try:
        for p in policies:
            build_policy(p, 0, policy_file=policy_file)
        prep = prepare(load_trace(nodes, pods))
    except (TraceError, PolicyConfigError) as exc:
        fail(exc)
    except UnicodeDecodeError as exc:  # the policy file's reader does not name the file
        fail(f"policy file {first_undecodable(policy_file) or decode_problem(exc)}")
    if prep.capacity_milli == 0:
        fail(f"{nodes}: the nodes have no GPUs")
    err.print(
        f"{len(prep.trace.nodes)} nodes, {prep.capacity_milli // 1000} GPUs, {len(prep.trace.pods)} pods, "
        + (
            "target workload: learned from the arrivals"
            if learn_workload
            else f"target workload: {len(prep.workload)} pod shapes"
        )
        + f"; arrivals up to {target:g} % of GPU capacity"
    )
    results: list[RunResult] = []
    with _progress(err, progress, ARRIVED_COLUMN) as bar:
        for p in policies:
            for s in seeds:
                task = bar.add_task(f"{p} seed {s}", total=target)

                shown = [-1]  # the last whole percent shown: the bar is redrawn once per percent, not per pod

                def tick(arrived: float, goal: float, task_id: TaskID = task, shown: list[int] = shown) -> None:
                    if int(arrived) != shown[0] or arrived >= goal:
                        shown[0] = int(arrived)
                        bar.update(task_id, completed=min(arrived, goal), total=goal)

                pol = build_policy(p, s, policy_file=policy_file)
                results.append(run(prep, pol, s, target=target / 100.0, progress=tick, learn_workload=learn_workload))
    write_curve_csv(results, out / "curve.csv")
    write_plot(results, out / "curve.png", title=f"{nodes.name} / {pods.name}")
    human = err if json_out else console()
    human.print(summary_table(results))
    where = out.absolute()
    human.print(f"curve: {escape(str(where / 'curve.csv'))}  plot: {escape(str(where / 'curve.png'))}")
    if json_out:
        summary = {**json_summary(results), "workload": "learned" if learn_workload else "trace"}
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
