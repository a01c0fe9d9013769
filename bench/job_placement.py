"""Placement of distributed jobs (issue 16): all-or-nothing, network spread and stragglers, four schedulers.

On a racked fleet (racks assumed: 16 consecutive nodes of one GPU model and size), the seeded job generator (most
jobs 1-8 GPUs, a tail of 16-256-GPU jobs; offered load --load of the GPUs) is run through kube-scheduler per pod,
kelvin per pod, a Kueue-TAS-like greedy and kelvin's gang planner, in a base scenario and one with poorly cooled
nodes, and the issue's metrics are printed with its goals checked: GPU-hours held by incomplete gangs, queueing
p50/p95, over-spread jobs, communication slowdown (ring all-reduce model), allocation ratio (over the second half of
the arrivals, and while jobs wait: the goals compare the latter, docs/jobs.md) and straggler GPU-hours.

Usage::

    python bench/job_placement.py                                   # spot-GPU fleet, 2000 jobs, seed 42
    python bench/job_placement.py --fleet openb --jobs 1500 --seeds 42,43
    python bench/job_placement.py --png docs/img/job_placement.png --csv docs/img/job_placement.csv

The fleets are read from ../shared/traces ($KELVIN_SHARED_DIR moves ../shared). It takes minutes (the per-pod
schedulers score every pod): see the "sim s" column.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness import SHARED, load_line, shared_file
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduler_plugin.simulator.jobs.report import aggregate, goals, table, write_csv, write_png  # noqa: E402
from scheduler_plugin.simulator.jobs.run import GENERATE, JobRun, run_all  # noqa: E402
from scheduler_plugin.simulator.jobs.schedulers import SCHEDULERS  # noqa: E402

FLEETS = {
    "spot": Path("traces/spot-gpu-2026/node_info_df.csv"),
    "openb": Path("traces/openb/openb_node_list_gpu_node.csv"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--fleet", choices=sorted(FLEETS), action="append", help="fleet (repeatable; default spot)")
    ap.add_argument("--jobs", type=int, default=2000, help="generated jobs per seed")
    ap.add_argument("--load", type=float, default=1.3, help="offered GPU demand / capacity")
    ap.add_argument("--seeds", default="42", help="comma-separated seeds")
    ap.add_argument("--scheduler", action="append", choices=SCHEDULERS, help="scheduler (repeatable; default all)")
    ap.add_argument("--no-thermal", action="store_true", help="skip the poorly-cooled-nodes scenario")
    ap.add_argument("--png", type=Path, help="write the plot here")
    ap.add_argument("--csv", type=Path, help="write the table here")
    args = ap.parse_args()
    con = Console(width=200)
    con.print(load_line())
    seeds = tuple(int(s) for s in args.seeds.split(","))
    all_rows = []
    for fleet in args.fleet or ["spot"]:
        path = shared_file(SHARED / FLEETS[fleet])
        run = JobRun(
            path,
            GENERATE,
            args.jobs,
            args.load,
            seeds,
            tuple(args.scheduler or SCHEDULERS),
            thermal=not args.no_thermal,
        )
        t0 = time.perf_counter()
        jf, what, results = run_all(run, lambda d, f=fleet: con.print(f"  {f}: {d}", highlight=False))
        rows = aggregate(results)
        con.print(jf.describe())
        con.print(what)
        con.print(table(rows, f"{fleet}: jobs, seeds {args.seeds} ({time.perf_counter() - t0:.0f} s)"))
        for name, met, figures in goals(rows):
            con.print(f"{'met' if met else 'NOT met'}: {name} ({figures})")
        for r in rows:
            r["fleet"] = fleet
        all_rows += rows
    if args.csv:
        write_csv(all_rows, args.csv)
    if args.png:
        first = [r for r in all_rows if r["fleet"] == (args.fleet or ["spot"])[0]]
        write_png(first, args.png, title=f"{(args.fleet or ['spot'])[0]}: {args.jobs} jobs, load {args.load:g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
