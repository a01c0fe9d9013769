"""Extender CPU per verb in process (no HTTP), at 5,000 nodes x 8 GPUs, with a ledger of assumed pods.

One pod at a time, the way kube-scheduler calls an extender: ``filter`` with every name, ``prioritize`` with the names
that passed, ``bind`` to the best-scored one (each pod has its own UID: its bind is charged to the ledger). Bodies are
Go's compact JSON; replies are serialised (``wire.dumps``) and counted. A static snapshot (no refresh meanwhile).

``--assumed N`` first charges N pods to the ledger, bound in the last 20 s and not yet shown by telemetry: what a busy
cluster keeps assumed (180 pods/s for the default 30 s TTL is 5,400). Every verb reads the ledger (the overlay of
assumed pods, the burst policy's recent placements), so a verb whose cost grows with the ledger shows it here.

Prints each verb's CPU time per pod (``time.process_time``: this process only, so other processes on a shared machine
skew it much less than wall time) and a digest of the answers (names passed, host bound, first scores) so that two
checkouts can be compared for identical results. ``--profile FILE`` runs the measured pods under cProfile (CPU-time
timer) and prints the 30 most expensive functions by cumulative time.

    python bench/extender_verbs.py                       # 100 pods, empty ledger
    python bench/extender_verbs.py --assumed 3000        # with 3,000 pods assumed
    python bench/extender_verbs.py --assumed 5400 --pods-per-second 180   # a busy cluster: the TTL at work
    python bench/extender_verbs.py --profile /tmp/verbs.prof
    python bench/extender_verbs.py --cpu-only            # pods without GPUs (the chart's cpuOnlyPods)
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import cProfile
import hashlib
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any

from extender_latency import pods
from harness import go_json, load_line

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from scheduler_plugin.extender.app import build_extender  # noqa: E402
from scheduler_plugin.extender.service import Extender  # noqa: E402
from scheduler_plugin.extender.wire import dumps  # noqa: E402
from scheduler_plugin.model import GpuAssignment  # noqa: E402
from scheduler_plugin.policies.policy_file import PolicyConfig  # noqa: E402
from scheduler_plugin.settings import Settings  # noqa: E402

VERBS = ("filter", "prioritize", "bind")


def pod_with_uid(base: list[dict[str, Any]], i: int) -> dict[str, Any]:
    p = copy.deepcopy(base[i % len(base)])
    p["metadata"]["uid"] = f"bench-uid-{i}"
    p["metadata"]["name"] = f"{p['metadata']['name']}-{i}"
    return p


def cpu_only_pods() -> list[dict[str, Any]]:
    """Pods without GPUs (sent to the extender with the chart's ``scheduler.extender.cpuOnlyPods``): 1, 4 and 16
    cores, ranked by the policy's ``cpuOnly`` blend."""
    out = []
    for cores in (1, 4, 16):
        p = copy.deepcopy(pods()[0])
        p["metadata"]["name"] = f"bench-cpu-{cores}"
        for c in p["spec"]["containers"]:
            c["resources"] = {"requests": {"cpu": str(cores), "memory": f"{4 * cores}Gi"}}
        out.append(p)
    return out


class Run:
    """The extender and the pods of one run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.t0 = time.time()
        t0 = self.t0
        self.now = t0
        self.rate = args.pods_per_second
        self.ext: Extender = build_extender(
            Settings(
                fleet_nodes=args.nodes, fleet_gpus_per_node=args.gpus, refresh_interval_s=3600, max_telemetry_age_s=7200
            ),
            policy=PolicyConfig.from_mapping({"telemetry": {"maxAgeSeconds": 7200}}),
            clock=lambda: self.now,
        )
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.ext.cache.refresh_once())
        self.names = [f"gpu-node-{i}" for i in range(1, args.nodes + 1)]
        ttl = self.ext.ledger.ttl_s
        for i in range(args.assumed):  # spread over the fleet, one GPU each, within the TTL
            node = self.names[(i * 7) % args.nodes]
            a = GpuAssignment(pod_key=f"assumed/p{i}", gpu_indices=(i % args.gpus,))
            # a still clock: bound 20 to 5 s ago; a moving one: over the whole TTL, so that some reach it every pod
            at = t0 - ttl + i * ttl / args.assumed if self.rate else t0 - 20 + i * 15 / max(1, args.assumed)
            self.ext.ledger.assume(node, a, at)
        base = cpu_only_pods() if args.cpu_only else pods()
        self.pods = [pod_with_uid(base, i) for i in range(args.warmup + args.pods)]
        self.bodies = [go_json({"Pod": p, "Nodes": None, "NodeNames": self.names}) for p in self.pods]
        self.cpu = dict.fromkeys(VERBS, 0.0)
        self.answers: list[tuple[int, str, bytes]] = []

    def one(self, i: int, *, measured: bool) -> None:
        if self.rate:
            self.now = self.t0 + i / self.rate
        p = self.pods[i]
        a = time.process_time()
        filtered = dumps(self.ext.filter(self.bodies[i]))
        b = time.process_time()
        passed = json.loads(filtered)["NodeNames"] or []
        pbody = go_json({"Pod": p, "Nodes": None, "NodeNames": passed})
        c = time.process_time()
        scored = dumps(self.ext.prioritize(pbody))
        d = time.process_time()
        hosts = json.loads(scored)
        best = max(hosts, key=lambda h: h["Score"])["Host"] if hosts else self.names[0]
        meta = p["metadata"]
        bbody = go_json(
            {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": best}
        )
        e = time.process_time()
        bound = self.loop.run_until_complete(self.ext.bind(bbody))
        dumps(bound)
        f = time.process_time()
        if bound.get("Error"):
            raise SystemExit(f"bind answered Error: {bound['Error']}")
        if measured:
            for verb, cpu in zip(VERBS, (b - a, d - c, f - e), strict=True):
                self.cpu[verb] += cpu
            self.answers.append((len(passed), best, scored[:200]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pods", type=int, default=100, help="measured pods")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--assumed", type=int, default=0, help="pods in the ledger before the run")
    ap.add_argument(
        "--pods-per-second",
        type=float,
        default=0.0,
        help="move the extender's clock by 1/RATE per pod (placements and assumed pods reach the TTL as in a busy "
        "cluster); 0 (default): a still clock",
    )
    ap.add_argument("--profile", type=Path, default=None, help="cProfile the measured pods into this file")
    ap.add_argument(
        "--cpu-only", action="store_true", help="pods without GPUs (1, 4, 16 cores): the cpuOnly ranking's cost"
    )
    args = ap.parse_args()
    if not args.pods_per_second >= 0:
        ap.error(f"--pods-per-second must be >= 0, got {args.pods_per_second:g}")
    run = Run(args)
    for i in range(args.warmup):
        run.one(i, measured=False)
    prof = cProfile.Profile(time.process_time) if args.profile else None
    if prof is not None:
        prof.enable()
    for i in range(args.warmup, args.warmup + args.pods):
        run.one(i, measured=True)
    if prof is not None:
        prof.disable()
        prof.dump_stats(str(args.profile))
    per = {verb: cpu / args.pods * 1000 for verb, cpu in run.cpu.items()}
    print(
        f"{args.nodes} nodes x {args.gpus} GPUs, {args.assumed} pods assumed, {args.pods}"
        + (" CPU-only" if args.cpu_only else "")
        + " pods"
        + (f" at {args.pods_per_second:g} pods/s of clock" if args.pods_per_second else "")
        + "; "
        f"{load_line()}{' (under cProfile)' if prof else ''}"
    )
    print(
        "CPU per pod: " + ", ".join(f"{v} {ms:.2f} ms" for v, ms in per.items()) + f"; total {sum(per.values()):.2f} ms"
    )
    print("answers digest", hashlib.sha1(repr(run.answers).encode()).hexdigest()[:16])
    if args.profile:
        pstats.Stats(str(args.profile)).sort_stats("cumulative").print_stats(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
