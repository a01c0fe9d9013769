"""Extender latency over real HTTP: filter + prioritize round-trips against a 5,000-node x 8-GPU simulated fleet.

Starts ``kelvin extender`` (uvicorn) in a subprocess on a free loopback port with a simulated fleet, waits for
``/readyz``, then for each size sends nodeCacheCapable requests (``NodeNames``) the way kube-scheduler does: a
``filter`` with N names, then a ``prioritize`` with the names that passed, one pod at a time. Pods cycle through a
1-GPU pod (the pod of the real kube-scheduler capture), a 20 GiB shared-GPU pod, a 4-GPU NVLink pod and a 1-GPU pod
restricted by ``kelvin.dev/gpu-models``.

Prints per size: p50 / p99 of filter, of prioritize and of the pair, and requests per second (both verbs counted).
Target (issue 2): p99 <= 20 ms at 5,000 nodes on a 2-core machine.

    python bench/extender_latency.py                   # defaults: 5000 nodes, sizes 100..5000, 200 pairs per size
    python bench/extender_latency.py --pairs 500 --refresh-interval 5
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from harness import SHARED, free_port, go_json, start_extender, stop, wait_for

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = SHARED / "fixtures" / "extender" / "filter-nodecache-true-ok-001.json"


def base_pod() -> dict[str, Any]:
    if CAPTURE.exists():
        pod: dict[str, Any] = json.loads(CAPTURE.read_text())["request"]["Pod"]
        return pod
    return {
        "metadata": {"name": "bench", "namespace": "default", "uid": "bench-uid"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }


def pods() -> list[dict[str, Any]]:
    one = base_pod()
    shared = copy.deepcopy(one)
    shared["metadata"]["name"] = "bench-shared"
    shared["metadata"].setdefault("annotations", {})["kelvin.dev/gpu-memory"] = "20Gi"
    four = copy.deepcopy(one)
    four["metadata"]["name"] = "bench-four"
    four["metadata"].setdefault("annotations", {})["kelvin.dev/topology"] = "nvlink-required"
    for c in four["spec"]["containers"]:
        c["resources"] = {"limits": {"nvidia.com/gpu": "4"}, "requests": {"nvidia.com/gpu": "4"}}
    models = copy.deepcopy(one)  # a model-constrained pod: the gpu-models matcher on the filter path
    models["metadata"]["name"] = "bench-models"
    models["metadata"].setdefault("annotations", {})["kelvin.dev/gpu-models"] = "H100-SXM-80GB,A100"
    return [one, shared, four, models]


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1000.0, q))


def run(args: argparse.Namespace) -> int:
    port = free_port()
    proc = start_extender(
        port,
        *("--metrics-port", "0"),  # /readyz on the verbs port
        *("--fleet-nodes", str(args.nodes), "--fleet-gpus", str(args.gpus)),
        *("--refresh-interval", str(args.refresh_interval)),
    )
    transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    pod_list = pods()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0, transport=transport) as client:
            t0 = time.monotonic()
            wait_for(f"http://127.0.0.1:{port}/readyz", proc, "extender")
            load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
            print(
                f"extender ready after {time.monotonic() - t0:.1f} s: {args.nodes} nodes x {args.gpus} GPUs, "
                f"telemetry refresh every {args.refresh_interval:g} s; {args.pairs} filter+prioritize pairs per "
                f"size, pods cycling 1 GPU / 20Gi shared / 4 GPU nvlink-required / 1 GPU of gpu-models; "
                f"{os.cpu_count()} CPUs, "
                f"load average {load} (other processes skew p99)"
            )
            names = [f"gpu-node-{i}" for i in range(1, args.nodes + 1)]
            print(
                f"{'names':>6} {'passed':>7} {'filter p50':>10} {'p99':>7} {'prio p50':>9} {'p99':>7} "
                f"{'pair p50':>9} {'pair p99':>9} {'req/s':>7}"
            )
            worst = 0.0
            for size in args.sizes:
                subset = names[:size]
                bodies = [go_json({"Pod": p, "Nodes": None, "NodeNames": subset}) for p in pod_list]
                f_t: list[float] = []
                p_t: list[float] = []
                pair_t: list[float] = []
                passed_n: list[int] = []
                headers = {"Content-Type": "application/json"}
                for i in range(args.warmup + args.pairs):
                    k = i % len(pod_list)
                    a = time.perf_counter()
                    r = client.post("/filter", content=bodies[k], headers=headers)
                    b = time.perf_counter()
                    passed = r.json()["NodeNames"] or []
                    if r.status_code != 200:
                        raise SystemExit(f"filter answered {r.status_code}: {r.text[:300]}")
                    pbody = go_json({"Pod": pod_list[k], "Nodes": None, "NodeNames": passed})
                    c = time.perf_counter()
                    r2 = client.post("/prioritize", content=pbody, headers=headers)
                    d = time.perf_counter()
                    if r2.status_code != 200:
                        raise SystemExit(f"prioritize answered {r2.status_code}: {r2.text[:300]}")
                    if i >= args.warmup:
                        f_t.append(b - a)
                        p_t.append(d - c)
                        pair_t.append((b - a) + (d - c))
                        passed_n.append(len(passed))
                busy = sum(pair_t)
                rps = 2 * len(pair_t) / busy if busy else 0.0
                pair99 = pct(pair_t, 99)
                if size == max(args.sizes):
                    worst = pair99
                print(
                    f"{size:>6} {int(np.mean(passed_n)):>7} {pct(f_t, 50):>8.2f}ms {pct(f_t, 99):>5.2f}ms "
                    f"{pct(p_t, 50):>7.2f}ms {pct(p_t, 99):>5.2f}ms {pct(pair_t, 50):>7.2f}ms "
                    f"{pair99:>7.2f}ms {rps:>7.0f}"
                )
            verdict = "meets" if worst <= 20.0 else "misses"
            print(f"filter+prioritize p99 at {max(args.sizes)} names: {worst:.2f} ms ({verdict} the 20 ms target)")
    finally:
        stop(proc)
    if args.in_process:
        in_process(args, pod_list)
    return 0


def in_process(args: argparse.Namespace, pod_list: list[dict[str, Any]]) -> None:
    """The same requests without HTTP: the extender's own service time (parse, framework, reply)."""
    import asyncio

    sys.path[:0] = [str(ROOT), str(ROOT / "operator")]
    from scheduler_plugin.extender.app import build_extender
    from scheduler_plugin.extender.wire import dumps
    from scheduler_plugin.policies.policy_file import PolicyConfig
    from scheduler_plugin.settings import Settings

    t0 = time.time()
    ext = build_extender(
        # one snapshot, never stale: on a loaded machine the run outlasts the default maxAgeSeconds, and a stale
        # fleet answers every filter with an outage Error in no time
        Settings(
            fleet_nodes=args.nodes, fleet_gpus_per_node=args.gpus, refresh_interval_s=3600, max_telemetry_age_s=7200
        ),
        policy=PolicyConfig.from_mapping({"telemetry": {"maxAgeSeconds": 7200}}),
        clock=lambda: t0,
    )
    asyncio.run(ext.cache.refresh_once())
    names = [f"gpu-node-{i}" for i in range(1, args.nodes + 1)]
    print("in-process service time (no HTTP): filter and prioritize, orjson reply included")
    print(f"{'names':>6} {'filter p50':>10} {'p99':>7} {'prio p50':>9} {'p99':>7}")
    for size in args.sizes:
        bodies = [go_json({"Pod": p, "Nodes": None, "NodeNames": names[:size]}) for p in pod_list]
        f_t: list[float] = []
        p_t: list[float] = []
        for i in range(args.warmup + args.pairs):
            k = i % len(pod_list)
            a = time.perf_counter()
            res = ext.filter(bodies[k])
            dumps(res)
            if res["Error"]:
                raise SystemExit(f"filter answered Error: {res['Error']}")
            b = time.perf_counter()
            pbody = go_json({"Pod": pod_list[k], "Nodes": None, "NodeNames": res["NodeNames"]})
            c = time.perf_counter()
            dumps(ext.prioritize(pbody))
            d = time.perf_counter()
            if i >= args.warmup:
                f_t.append(b - a)
                p_t.append(d - c)
        print(f"{size:>6} {pct(f_t, 50):>8.2f}ms {pct(f_t, 99):>5.2f}ms {pct(p_t, 50):>7.2f}ms {pct(p_t, 99):>5.2f}ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 500, 1000, 2000, 5000])
    ap.add_argument("--pairs", type=int, default=200, help="measured filter+prioritize pairs per size")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument(
        "--refresh-interval",
        type=float,
        default=5.0,
        help="telemetry refresh of the server (each refresh rebuilds the 40,000-GPU snapshot)",
    )
    ap.add_argument("--in-process", action="store_true", help="also time the same calls without HTTP")
    args = ap.parse_args()
    if max(args.sizes) > args.nodes:
        ap.error("--sizes must not exceed --nodes")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
