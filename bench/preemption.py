"""GPU-aware preemption against kube-scheduler's count-based preemption, over time, on the Alibaba spot-GPU fleet.

The scenario (scheduler_plugin/simulator/preemption.py): the 8-GPU nodes of ../shared/traces/spot-gpu-2026/
node_info_df.csv (one in --stride), kept full by preemptible spot work, with high-priority jobs arriving; both runs
place with kelvin's framework and differ only in how victims are chosen. Printed per seed: high-priority pods
arrived and placed, evictions (pods stopped, a gang's members all counted) per high-priority pod placed, evictions
that freed GPUs the preemptor could not bind to, GPU-hours of progress lost, high-priority queueing delay.

Four arms with ``--reserve-gpus N`` (N > 0, the default 8): ``count`` and ``kelvin`` place with kelvin's default
policy; ``count+reserve`` and ``kelvin+reserve`` add the ``priority`` policy (scheduler_plugin/policies/priority: spot
pods kept off the free NVLink groups of the high-priority mix it learns, ``reserveGpus: N``, ``--priority-weight``).
The summary compares ``kelvin+reserve`` (kelvin's placement and preempt verb) with ``count`` (kube-scheduler's
count-based preemption, no priority-aware placement).

Usage::

    python bench/preemption.py                      # 63 nodes (504 GPUs), 12 h, 6 high-priority jobs an hour, seed 1
    python bench/preemption.py --seeds 1-3 --hours 6
    python bench/preemption.py --seeds 1-8 --reserve-gpus 0   # the two arms without the priority policy
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from harness import SHARED, load_line, shared_file
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduler_plugin.policies import PolicyConfig  # noqa: E402
from scheduler_plugin.simulator.preemption import (  # noqa: E402
    Mix,
    Mode,
    Result,
    placement_config,
    read_spot_nodes,
    simulate,
)


def seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    try:
        return list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds: {text!r} is not N or N-M") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=Path, default=SHARED / "traces" / "spot-gpu-2026" / "node_info_df.csv")
    ap.add_argument("--stride", type=int, default=14, help="take one 8-GPU node in STRIDE (default 14: 63 nodes)")
    ap.add_argument("--hours", type=float, default=12.0)
    ap.add_argument("--high-per-hour", type=float, default=6.0)
    ap.add_argument("--seeds", type=seeds, default=[1], help="N or N-M (default 1)")
    ap.add_argument("--candidates", type=int, default=16, help="candidate nodes kelvin judges per preemption")
    ap.add_argument("--reserve-gpus", type=int, default=8, help="the priority policy's reserveGpus (0: no such arms)")
    ap.add_argument("--priority-weight", type=float, default=1.0, help="the priority policy's score weight")
    a = ap.parse_args()
    if a.stride < 1 or a.hours <= 0 or a.high_per_hour <= 0 or a.candidates < 1:
        raise SystemExit("error: --stride, --hours, --high-per-hour and --candidates must be positive")
    if a.reserve_gpus < 0 or a.priority_weight < 0:
        raise SystemExit("error: --reserve-gpus and --priority-weight must not be negative")
    reserve = placement_config(priority_weight=a.priority_weight, reserve_gpus=a.reserve_gpus)
    arms: list[tuple[str, Mode, PolicyConfig | None]] = [("count", "count", None), ("kelvin", "kelvin", None)]
    if a.reserve_gpus > 0:
        arms += [("count+reserve", "count", reserve), ("kelvin+reserve", "kelvin", reserve)]
    nodes = read_spot_nodes(shared_file(a.nodes), stride=a.stride)
    console = Console(width=200)
    console.print(
        f"fleet: {len(nodes)} nodes, {sum(len(n.gpus) for n in nodes)} GPUs ({a.nodes.name}, 1 in {a.stride})"
    )
    console.print("job mix: " + Mix(hours=a.hours, high_per_hour=a.high_per_hour).describe())
    t = Table("seed", "preemption", "HP arrived", "HP placed", "preemptions", "evictions", "per preemption",
              "per HP placed", "wasted", "GPU-h lost", "spot GPU-h done", "HP wait p50 s", "HP wait p95 s",
              "run s")  # fmt: skip
    totals: dict[str, list[Result]] = {name: [] for name, _, _ in arms}
    for seed in a.seeds:
        mix = Mix(hours=a.hours, high_per_hour=a.high_per_hour, seed=seed)
        for name, mode, placement in arms:
            t0 = time.perf_counter()
            r = simulate(nodes, mix, mode, candidates=a.candidates, placement=placement)
            totals[name].append(r)
            t.add_row(str(seed), name, str(r.high_arrived), str(r.high_placed), str(r.preemptions),
                      str(r.evictions), f"{r.evictions_per_preemption:.2f}", f"{r.evictions_per_high:.2f}",
                      str(r.wasted_evictions), f"{r.lost_gpu_hours:.1f}", f"{r.spot_done_gpu_hours:.0f}",
                      f"{r.wait_p50_s():.0f}", f"{r.wait_p95_s():.0f}", f"{time.perf_counter() - t0:.1f}")  # fmt: skip
    console.print(t)
    best = "kelvin+reserve" if a.reserve_gpus > 0 else "kelvin"
    c, k = totals["count"], totals[best]
    ev_c, ev_k = sum(r.evictions for r in c), sum(r.evictions for r in k)
    lost_c, lost_k = sum(r.lost_gpu_hours for r in c), sum(r.lost_gpu_hours for r in k)
    placed_c, placed_k = sum(r.high_placed for r in c), sum(r.high_placed for r in k)
    console.print(
        f"{best} vs count-based over {len(a.seeds)} seed(s): evictions {ev_k} vs {ev_c} "
        f"({(1 - ev_k / ev_c) * 100 if ev_c else 0:.0f} % fewer), GPU-hours lost {lost_k:.1f} vs {lost_c:.1f} "
        f"({(1 - lost_k / lost_c) * 100 if lost_c else 0:.0f} % less), high-priority pods placed {placed_k} vs "
        f"{placed_c}; preemptions {sum(r.preemptions for r in k)} vs {sum(r.preemptions for r in c)}, pods "
        f"evicted per preemption {ev_k / max(1, sum(r.preemptions for r in k)):.2f} vs "
        f"{ev_c / max(1, sum(r.preemptions for r in c)):.2f}"
    )
    console.print(f"machine: {platform.processor() or platform.machine()}, {load_line()}")


if __name__ == "__main__":
    main()
