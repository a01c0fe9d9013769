"""``kelvin simulate``: replay a cluster trace through kelvin's policies and the FGD paper's baselines."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..policies.registry import PolicyConfigError
from .engine import RunResult, prepare, run
from .policies import POLICIES, build_policy
from .report import json_summary, summary_table, write_curve_csv, write_plot
from .trace import TraceError, load_trace


def simulate(
    nodes: Annotated[Path, typer.Option(help="node list: openb CSV (sn,cpu_milli,memory_mib,gpu,model) or kelvin YAML/CSV")],
    pods: Annotated[Path, typer.Option(help="pod list: openb CSV (name,cpu_milli,...,gpu_spec) or kelvin YAML/CSV")],
    policy: Annotated[
        list[str] | None, typer.Option(help=f"policy to run (repeatable): {', '.join(POLICIES)}")
    ] = None,
    seed: Annotated[list[int] | None, typer.Option(help="seed (repeatable); default 42")] = None,
    target: Annotated[float, typer.Option(help="inflate arrivals to this % of cluster GPU capacity", min=1)] = 130.0,
    out: Annotated[Path, typer.Option(help="folder for curve.csv and curve.png")] = Path("simulate-out"),
    json_out: Annotated[bool, typer.Option("--json", help="print a machine-readable summary to stdout")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Replay a trace with the FGD paper's protocol (seeded shuffle, inflation to --target %) and compare policies."""
    policies = policy or ["kelvin"]
    seeds = seed or [42]
    err = Console(stderr=True)
    try:
        for p in policies:
            build_policy(p, 0)
        prep = prepare(load_trace(nodes, pods))
    except (TraceError, PolicyConfigError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if prep.capacity_milli == 0:
        err.print(f"[red]error:[/red] {nodes}: the nodes have no GPUs")
        raise typer.Exit(2)
    err.print(
        f"{len(prep.trace.nodes)} nodes, {prep.capacity_milli // 1000} GPUs, {len(prep.trace.pods)} pods, "
        f"target workload: {len(prep.workload)} pod shapes; arrivals up to {target:g} % of GPU capacity"
    )
    results: list[RunResult] = []
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, disable=not progress, transient=False,
    ) as bar:
        for p in policies:
            for s in seeds:
                task = bar.add_task(f"{p} seed {s}", total=None)

                def tick(done: int, total: int, task_id: int = task) -> None:
                    if done % 200 == 0 or done == total:
                        bar.update(task_id, completed=done, total=total)

                results.append(run(prep, build_policy(p, s), s, target=target / 100.0, progress=tick))
    write_curve_csv(results, out / "curve.csv")
    write_plot(results, out / "curve.png", title=f"{nodes.name} / {pods.name}")
    human = err if json_out else Console()
    human.print(summary_table(results))
    human.print(f"curve: {out / 'curve.csv'}  plot: {out / 'curve.png'}")
    if json_out:
        sys.stdout.write(json.dumps(json_summary(results), indent=2) + "\n")
