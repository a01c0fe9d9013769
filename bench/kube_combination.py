"""Placement quality as kube-scheduler turns kelvin's answers into bindings, against the replay's own ranking.

A replay (``bench/placement_quality.py``) binds the node kelvin ranks first by its weighted mean, a float. In a
cluster kube-scheduler asks kelvin about the nodes its own filter pass found (``percentageOfNodesToScore``), adds
kelvin's integer 0..10 scores (times the extender's weight and 10) to its own score plugins' and binds the highest
total, drawing at random among equal totals (``scheduler_plugin/simulator/kube_scheduler.py``). This replays the
openb trace (and variants) through that combination, every configuration side by side in one run:

* ``replay``: the replay's own ranking (what ``placement_quality.py`` reports);
* ``before``: what the chart and the extender did before kelvin sent its first node alone at 10: rounded scores
  only, kube-scheduler's resource scores on (NodeResourcesFit LeastAllocated, NodeResourcesBalancedAllocation),
  the adaptive window;
* ``chart``: the chart's defaults now: kelvin's first node alone at 10, those two score plugins off in kelvin's
  profile (``scheduler.disabledScorePlugins``), the adaptive window;
* ``chart+resource``: the same with the two score plugins left on (``scheduler.disabledScorePlugins: []``);
* ``chart+100%``: the chart with ``scheduler.percentageOfNodesToScore: 100`` (every node asked);
* ``fgd``: our ``fgd`` replayed, for scale.

``--replicate K`` replays a fleet and a pod list K times the trace's (each node and pod K times), where the adaptive
window is a smaller share of the nodes (at 1,213 nodes kube-scheduler asks about 40 % of them, at 4,852 about 12 %).

Usage::

    python bench/kube_combination.py                                  # default trace, seeds 42-44
    python bench/kube_combination.py --variants cpu-heavy@2.5,model-constrained@0.25 --jobs 2
    python bench/kube_combination.py --replicate 4 --seeds 42 --configs chart,chart+100%
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from statistics import mean

from harness import SHARED, load_line, openb_default
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler_plugin.simulator.engine import Prepared, prepare, run
from scheduler_plugin.simulator.kube_scheduler import KubeScheduler
from scheduler_plugin.simulator.policies import build_policy
from scheduler_plugin.simulator.trace import Trace
from scheduler_plugin.simulator.variants import variant

#: configuration -> (policy, kube-scheduler model or None for the replay's own ranking)
CONFIGS: dict[str, tuple[str, KubeScheduler | None]] = {
    "replay": ("kelvin", None),
    "before": ("kelvin", KubeScheduler(resource_scores=True, rounded_only=True)),
    "chart": ("kelvin", KubeScheduler()),
    "chart+resource": ("kelvin", KubeScheduler(resource_scores=True)),
    "chart+100%": ("kelvin", KubeScheduler(percentage_of_nodes_to_score=100)),
    "fgd": ("fgd", None),
}

_PREP: dict[str, Prepared] = {}


def replicated(trace: Trace, k: int) -> Trace:
    """Each node and each pod of ``trace`` ``k`` times (copies named ``<name>~<i>``): the same mix on a fleet ``k``
    times larger."""
    if k <= 1:
        return trace
    nodes = tuple(replace(n, name=f"{n.name}~{i}") for i in range(k) for n in trace.nodes)
    pods = tuple(replace(p, name=f"{p.name}~{i}") for i in range(k) for p in trace.pods)
    return Trace(nodes, pods)


def _job(args: tuple[str, Trace, str, int]) -> tuple[str, str, int, float, float]:
    key, trace, config, seed = args
    prep = _PREP.get(key)
    if prep is None:
        prep = _PREP[key] = prepare(trace)
    policy, kube = CONFIGS[config]
    started = time.process_time()
    r = run(prep, build_policy(policy, seed), seed, kube=kube)
    return key, config, seed, 100.0 - r.alloc_at(100), time.process_time() - started


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=SHARED / "traces" / "openb")
    ap.add_argument("--seeds", default="42-44", help="replay seeds: 42-44 or 42,45")
    ap.add_argument("--variants", default="", help="variant levels besides the default trace, e.g. cpu-heavy@2.5")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"among {', '.join(CONFIGS)}".replace("%", "%%"))
    ap.add_argument("--replicate", type=int, default=1, help="each node and pod K times (default 1)")
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"error: --configs: unknown {', '.join(unknown)} (known: {', '.join(CONFIGS)})")
    if args.replicate < 1:
        raise SystemExit(f"error: --replicate must be at least 1, got {args.replicate}")
    seeds = parse_seeds(args.seeds)
    base = openb_default(args.traces)
    traces: dict[str, Trace] = {"default": replicated(base, args.replicate)}
    for item in (v for v in args.variants.split(",") if v):
        family, _, level = item.partition("@")
        try:
            built = variant(base, family, float(level) if level else None)
        except ValueError as e:
            raise SystemExit(f"error: --variants: {item!r}: {e}") from None
        traces[item] = replicated(built, args.replicate)
    con = Console(width=200)
    con.print(load_line())
    n_nodes = len(traces["default"].nodes)
    con.print(f"openb, {n_nodes} nodes, seeds {', '.join(map(str, seeds))}, % of GPUs unallocated at 100 % arrived")
    for c in configs:
        kube = CONFIGS[c][1]
        con.print(f"  {c}: {CONFIGS[c][0]}, " + (kube.describe() if kube else "the replay's own ranking"))
    work = [(k, t, c, s) for k, t in traces.items() for c in configs for s in seeds]
    if args.jobs <= 1:
        out = [_job(w) for w in work]
    else:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            out = list(pool.map(_job, work))
    got = {(k, c, s): (u, cpu) for k, c, s, u, cpu in out}
    table = Table(title="GPUs unallocated at 100 % arrived (%), mean of seeds \\[per seed]; CPU s per replay")
    table.add_column("configuration")
    for k in traces:
        table.add_column(k, justify="right")
    for c in configs:
        cells = []
        for k in traces:
            vals = [got[k, c, s][0] for s in seeds]
            cpu = mean(got[k, c, s][1] for s in seeds)
            per = " ".join(f"{v:.2f}" for v in vals)
            cells.append(f"{mean(vals):.3f} [{per}] {cpu:.1f}s")
        table.add_row(c, *cells)
    con.print(table)
    con.print(load_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
