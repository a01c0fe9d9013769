"""How the extender grows with the fleet: snapshot refresh, memory and per-verb CPU at 5,000 to 20,000 nodes.

In-process (no HTTP: bench/extender_load.py measures that), one simulated fleet per size, 8 GPUs a node: the CPU
time of one telemetry refresh (the simulated source's fetch plus building the snapshot's arrays), the process's
resident memory once the snapshot is published (each size in its own child process, so that sizes do not share
memory), and the CPU time of ``filter`` (every node named) and ``prioritize`` (the nodes that passed), reply
serialisation included, best of three rounds. Prints the growth per node against the smallest size: linear growth
keeps the per-node figures flat.

    python bench/extender_scale.py                      # 5000, 10000, 20000 nodes
    python bench/extender_scale.py --sizes 5000 20000 --calls 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from extender_latency import pods
from harness import checkout_env, load_line

ROOT = Path(__file__).resolve().parent.parent


def measure(nodes: int, gpus: int, calls: int) -> dict[str, float]:
    """One size, in this process (run as a child by :func:`main`)."""
    from scheduler_plugin.extender.app import build_extender
    from scheduler_plugin.extender.wire import dumps
    from scheduler_plugin.policies.policy_file import PolicyConfig
    from scheduler_plugin.settings import Settings

    t0 = time.time()
    ext = build_extender(
        # telemetry never too old here (no refresh deadline either): a loaded machine may take long over 20,000 nodes
        Settings(fleet_nodes=nodes, fleet_gpus_per_node=gpus, refresh_interval_s=3600, max_telemetry_age_s=7200),
        policy=PolicyConfig.from_mapping({"telemetry": {"maxAgeSeconds": 7200}}),
        clock=lambda: t0,
    )
    c = time.process_time()
    asyncio.run(ext.cache.refresh_once())
    first = time.process_time() - c
    c = time.process_time()
    asyncio.run(ext.cache.refresh_once())
    refresh = time.process_time() - c
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    names = [f"gpu-node-{i}" for i in range(1, nodes + 1)]
    pod_list = pods()
    fbodies = [json.dumps({"Pod": p, "Nodes": None, "NodeNames": names}).encode() for p in pod_list]
    results = [ext.filter(b) for b in fbodies]
    if any(r["Error"] for r in results):
        raise SystemExit(f"filter answered Error: {results[0]['Error']}")
    pbodies = [
        json.dumps({"Pod": p, "Nodes": None, "NodeNames": r["NodeNames"]}).encode()
        for p, r in zip(pod_list, results, strict=True)
    ]

    def best(fn: Any) -> float:
        rounds = []
        for _ in range(3):
            c = time.process_time()
            for i in range(calls):
                dumps(fn(i % len(pod_list)))
            rounds.append((time.process_time() - c) / calls)
        return min(rounds)

    return {
        "nodes": nodes,
        "first_refresh_s": first,
        "refresh_s": refresh,
        "rss_mib": rss,
        "filter_ms": best(lambda k: ext.filter(fbodies[k])) * 1000,
        "prioritize_ms": best(lambda k: ext.prioritize(pbodies[k])) * 1000,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[5000, 10000, 20000])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--calls", type=int, default=40, help="calls per verb per round")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        sys.path[:0] = [str(ROOT), str(ROOT / "operator")]
        print(json.dumps(measure(args.child, args.gpus, args.calls)))
        return 0
    print(f"in-process, {args.gpus} GPUs a node, CPU time (best of 3 rounds of {args.calls} calls); {load_line()}")
    print(
        f"{'nodes':>6} {'refresh':>9} {'RSS':>8} {'filter':>9} {'prioritize':>11}"
        "   per 1,000 nodes: refresh, filter, prio"
    )
    for n in args.sizes:
        cmd = [sys.executable, __file__, "--child", str(n), "--gpus", str(args.gpus), "--calls", str(args.calls)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=checkout_env(), check=False)
        if done.returncode != 0:
            raise SystemExit(f"{n} nodes: {done.stderr[-1500:]}")
        r = json.loads(done.stdout.strip().splitlines()[-1])
        k = n / 1000
        print(
            f"{n:>6} {r['refresh_s']:>7.2f} s {r['rss_mib']:>5.0f} MiB {r['filter_ms']:>6.2f} ms "
            f"{r['prioritize_ms']:>8.2f} ms"
            f"   {r['refresh_s'] / k * 1000:.0f} ms, {r['filter_ms'] / k:.2f} ms, {r['prioritize_ms'] / k:.2f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
