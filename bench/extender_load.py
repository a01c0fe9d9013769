"""Extender CPU, latency and sustained load over real HTTP, side by side, at 5,000 nodes x 8 GPUs (nodeCacheCapable).

Starts ``kelvin extender`` (uvicorn, simulated fleet) in a subprocess on free loopback ports, twice:

1. **CPU and idle latency** (a static snapshot: refresh every hour, telemetry max age two hours, so that no refresh
   runs meanwhile): one pod at a time, the way kube-scheduler calls an extender, ``filter`` with every name, then
   ``prioritize`` with the names that passed, then ``bind`` to the best-scored one; every pod has its own UID (its
   bind is charged to the ledger, as in a cluster). The server's CPU time (``/proc/PID/stat``, user + system) is
   read around each phase: filter alone, prioritize alone, and the three verbs together (CPU per pod). Wall
   latencies are the client's; the client runs on the same machine. The three verbs are measured twice: for the
   first ``--pods`` new pods the extender sees (its learned workload moves with each of them and is republished
   every few pods, each republication scoring the whole fleet again), and ``--settle`` pods later, when it is
   republished every few hundred (what a running extender pays).
2. **Sustained load** (the default 5 s telemetry refresh): an open-loop client asks ``--rate`` requests per second
   (half filter, half prioritize; a prioritize follows its filter on the same connection) for ``--seconds``, at most
   ``--connections`` in flight; each latency counts from the request's scheduled time, so a server that falls
   behind shows it (a request still waiting for a connection 5 s after its time is an error, not sent: the client
   stays bounded in time). Meanwhile a probe thread opens a fresh connection every ``--probe-interval`` s (as
   kubelet does) to ``/healthz`` and ``/readyz`` on the metrics listener and times the answer. Errors: any answer
   other than 200 with an empty ``Error``, and any request that takes longer than 5 s (kube-scheduler's extender
   httpTimeout).

Targets (issue 17): filter + prioritize + bind CPU <= 2 ms per pod, pair p99 <= 5 ms idle; 500 req/s for 60 s with 0
errors and probes p99 <= 50 ms. Prints the machine's CPUs and load average: on a shared machine, wall figures (the
client's and the server's) are skewed by the other processes; CPU figures much less.

    python bench/extender_load.py                          # 5000 nodes, 300 pods idle, 500 req/s for 60 s
    python bench/extender_load.py --seconds 20 --rate 200  # shorter
    python bench/extender_load.py --skip-load              # CPU and idle latency only
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
from extender_latency import pods
from harness import free_port, go_json, load_line, start_extender, stop, wait_for

#: kube-scheduler's default extender httpTimeout: a request slower than this is an error for the scheduler.
HTTP_TIMEOUT_S = 5.0
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads), from ``/proc/PID/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1000.0, q)) if xs else float("nan")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pod_with_uid(base: dict[str, Any], i: int) -> dict[str, Any]:
    p = copy.deepcopy(base)
    p["metadata"]["name"] = f"{base['metadata']['name']}-{i}"
    p["metadata"]["uid"] = f"bench-uid-{i}"
    return p


@dataclass
class Phase:
    label: str
    count: int
    cpu_s: float
    wall: list[float] = field(default_factory=list)

    def cpu_ms(self) -> float:
        return self.cpu_s / self.count * 1000 if self.count else float("nan")


def idle_phases(args: argparse.Namespace, port: int, pid: int) -> list[Phase]:
    """Filter alone, prioritize alone, then filter + prioritize + bind per pod, one request at a time."""
    names = [f"gpu-node-{i}" for i in range(1, args.nodes + 1)]
    base = pods()
    headers = {"Content-Type": "application/json"}
    transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    out: list[Phase] = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0, transport=transport) as client:

        def post(path: str, body: dict[str, Any]) -> tuple[Any, float]:
            data = go_json(body)
            a = time.perf_counter()
            r = client.post(path, content=data, headers=headers)
            b = time.perf_counter()
            if r.status_code != 200:
                raise SystemExit(f"{path} answered {r.status_code}: {r.text[:300]}")
            return r.json(), b - a

        passed: list[list[str]] = []
        for k, p in enumerate(base):  # warm-up, and the passed names of each pod kind
            for _ in range(args.warmup):
                res, _t = post("/filter", {"Pod": p, "Nodes": None, "NodeNames": names})
            if res["Error"]:
                raise SystemExit(f"filter answered Error: {res['Error']}")
            passed.append(res["NodeNames"] or [])
            post("/prioritize", {"Pod": p, "Nodes": None, "NodeNames": passed[k]})
        for label, verb in (("filter", "/filter"), ("prioritize", "/prioritize")):
            bodies = [
                {"Pod": p, "Nodes": None, "NodeNames": names if verb == "/filter" else passed[k]}
                for k, p in enumerate(base)
            ]
            ph = Phase(label, args.pods, 0.0)
            c0 = cpu_seconds(pid)
            for i in range(args.pods):
                ph.wall.append(post(verb, bodies[i % len(bodies)])[1])
            ph.cpu_s = cpu_seconds(pid) - c0
            out.append(ph)

        def pods_from(first: int, count: int, label: str) -> tuple[Phase, Phase, Phase]:
            """``count`` new pods (UIDs ``first``...), filter + prioritize + bind each: the pair, the triple and
            bind alone (its CPU: the triple's less the repeated-pod filter and prioritize above)."""
            pair = Phase(f"filter+prioritize{label}", count, 0.0)
            triple = Phase(f"filter+prioritize+bind{label}", count, 0.0)
            bind_wall: list[float] = []
            c0 = cpu_seconds(pid)
            for i in range(first, first + count):
                p = pod_with_uid(base[i % len(base)], i)
                res, tf = post("/filter", {"Pod": p, "Nodes": None, "NodeNames": names})
                ok = res["NodeNames"] or []
                prio, tp = post("/prioritize", {"Pod": p, "Nodes": None, "NodeNames": ok})
                best = max(prio, key=lambda h: h["Score"])["Host"] if prio else names[0]
                meta = p["metadata"]
                bind = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": best}
                bres, tb = post("/bind", bind)
                if bres.get("Error"):
                    raise SystemExit(f"bind answered Error: {bres['Error']}")
                pair.wall.append(tf + tp)
                triple.wall.append(tf + tp + tb)
                bind_wall.append(tb)
            triple.cpu_s = cpu_seconds(pid) - c0
            pair.cpu_s = out[0].cpu_s + out[1].cpu_s  # the two phases above: same pods, same names
            return pair, triple, Phase(f"bind{label}", count, triple.cpu_s - pair.cpu_s, bind_wall)

        out += pods_from(0, args.pods, "")
        if args.settle:  # the learned workload settled: pods that come after ``args.settle`` more were bound
            pods_from(args.pods, args.settle, "")
            out += pods_from(args.pods + args.settle, args.pods, " (settled)")
    return out


@dataclass
class LoadResult:
    sent: int = 0
    errors: int = 0
    first_errors: list[str] = field(default_factory=list)
    filter_lat: list[float] = field(default_factory=list)
    prio_lat: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    cpu_s: float = 0.0


async def load(args: argparse.Namespace, port: int, pid: int) -> LoadResult:
    """``args.rate`` requests/s (pairs of filter then prioritize) for ``args.seconds``, open loop, bounded."""
    names = [f"gpu-node-{i}" for i in range(1, args.nodes + 1)]
    base = pods()
    fbodies = [go_json({"Pod": p, "Nodes": None, "NodeNames": names}) for p in base]
    res = LoadResult()
    pairs = int(args.rate * args.seconds / 2)
    interval = 2.0 / args.rate
    sem = asyncio.Semaphore(args.connections)
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    conn = aiohttp.TCPConnector(limit=args.connections)
    url = f"http://127.0.0.1:{port}"
    headers = {"Content-Type": "application/json"}

    def fail(why: str) -> None:
        res.errors += 1
        if len(res.first_errors) < 5:
            res.first_errors.append(why)

    async with aiohttp.ClientSession(url, connector=conn, timeout=timeout) as session:

        async def one(i: int, due: float) -> None:
            k = i % len(base)
            async with sem:
                late = time.perf_counter() - due
                if late > HTTP_TIMEOUT_S:  # kube-scheduler would have timed out already: counted, not sent
                    return fail(f"not sent: {late:.1f} s behind schedule (every connection busy)")
                try:
                    async with session.post("/filter", data=fbodies[k], headers=headers) as r:
                        body = await r.read()
                    t_f = time.perf_counter()
                    res.filter_lat.append(t_f - due)
                    data = json.loads(body)
                    if r.status != 200 or data.get("Error"):
                        return fail(f"filter {r.status}: {body[:200]!r}")
                    pbody = go_json({"Pod": base[k], "Nodes": None, "NodeNames": data["NodeNames"]})
                    async with session.post("/prioritize", data=pbody, headers=headers) as r2:
                        await r2.read()
                    res.prio_lat.append(time.perf_counter() - t_f)
                    if r2.status != 200:
                        fail(f"prioritize {r2.status}")
                except (TimeoutError, aiohttp.ClientError) as exc:
                    fail(f"{type(exc).__name__}: {exc}")

        tasks = []
        c0 = cpu_seconds(pid)
        t0 = time.perf_counter()
        for i in range(pairs):
            due = t0 + i * interval
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, due)))
            res.sent += 2
        await asyncio.gather(*tasks)
        res.elapsed = time.perf_counter() - t0
        res.cpu_s = cpu_seconds(pid) - c0
    return res


class Prober(threading.Thread):
    """GETs ``/healthz`` and ``/readyz`` on a fresh connection every ``interval`` s until stopped; times each."""

    def __init__(self, port: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.interval = interval
        self.times: dict[str, list[float]] = {"/healthz": [], "/readyz": []}
        self.failures = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.interval):
            for path, times in self.times.items():
                a = time.perf_counter()
                try:
                    c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                    c.request("GET", path)
                    status = c.getresponse().status
                    c.close()
                except OSError:
                    status = 0
                times.append(time.perf_counter() - a)
                if status != 200:
                    self.failures += 1


def server(args: argparse.Namespace, *, static: bool, env_dir: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    port, mport = free_port(), free_port()
    flags = ["--metrics-port", str(mport), "--fleet-nodes", str(args.nodes), "--fleet-gpus", str(args.gpus)]
    env: dict[str, str] = {"KELVIN_METRICS_HOST": "127.0.0.1"}
    if static:
        policy = env_dir / "policy.yaml"
        policy.write_text("telemetry:\n  maxAgeSeconds: 7200\n")
        flags += ["--refresh-interval", "3600", "--policy-file", str(policy)]
        env["KELVIN_MAX_TELEMETRY_AGE_S"] = "7200"
    proc = start_extender(port, *flags, env=env)
    try:
        wait_for(f"http://127.0.0.1:{mport}/readyz", proc, "extender", timeout_s=600.0)  # slow on a loaded box
    except BaseException:
        stop(proc)  # never leave it running
        raise
    return proc, port, mport


def run(args: argparse.Namespace) -> int:
    print(f"{args.nodes} nodes x {args.gpus} GPUs, nodeCacheCapable (NodeNames); {load_line()}")
    print("pods cycle 1 GPU / 20Gi shared / 4 GPU nvlink-required / 1 GPU of gpu-models")
    with tempfile.TemporaryDirectory() as tmp:
        proc, port, _mport = server(args, static=True, env_dir=Path(tmp))
        try:
            rss_idle = rss_mib(proc.pid)
            phases = idle_phases(args, port, proc.pid)
            rss_after = rss_mib(proc.pid)
        finally:
            stop(proc)
        print(
            f"\n-- one pod at a time, static snapshot ({args.pods} pods per phase; server RSS {rss_idle:.0f} MiB "
            f"ready, {rss_after:.0f} MiB after) --"
        )
        print(f"{'phase':>34} {'server CPU/pod':>15} {'wall p50':>9} {'p99':>8}")
        for ph in phases:
            print(f"{ph.label:>34} {ph.cpu_ms():>12.2f} ms {pct(ph.wall, 50):>7.2f}ms {pct(ph.wall, 99):>6.2f}ms")
        cpu_pod = phases[3].cpu_ms()
        pair99 = pct(phases[2].wall, 99)
        settled = phases[5:8]
        cpu_settled = settled[1].cpu_ms() if settled else float("nan")
        pair99_settled = pct(settled[0].wall, 99) if settled else float("nan")
        if args.skip_load:
            print(
                f"\nCPU per pod (filter+prioritize+bind) {cpu_pod:.2f} ms, settled {cpu_settled:.2f} ms (target <= 2); "
                f"pair p99 {pair99:.2f} ms, settled {pair99_settled:.2f} ms (target <= 5)"
            )
            return 0
        proc, port, mport = server(args, static=False, env_dir=Path(tmp))
        prober = Prober(mport, args.probe_interval)
        try:
            prober.start()
            lr = asyncio.run(load(args, port, proc.pid))
        finally:
            prober.done.set()
            prober.join()
            stop(proc)
    got = (len(lr.filter_lat) + len(lr.prio_lat)) / lr.elapsed if lr.elapsed else 0.0
    probes = prober.times["/healthz"] + prober.times["/readyz"]
    print(
        f"\n-- sustained: {args.rate:g} req/s asked for {args.seconds:g} s, at most {args.connections} in flight, "
        "telemetry refresh every 5 s --"
    )
    print(f"sent {lr.sent}, answered {got:.0f} req/s, errors {lr.errors}; server CPU {lr.cpu_s / lr.elapsed:.2f} cores")
    for e in lr.first_errors:
        print(f"  error: {e}")
    print(
        f"filter from its scheduled time: p50 {pct(lr.filter_lat, 50):.1f} ms, p99 {pct(lr.filter_lat, 99):.1f} ms; "
        f"prioritize p50 {pct(lr.prio_lat, 50):.1f} ms, p99 {pct(lr.prio_lat, 99):.1f} ms"
    )
    print(
        f"probes (fresh connection each): /healthz p99 {pct(prober.times['/healthz'], 99):.1f} ms, /readyz p99 "
        f"{pct(prober.times['/readyz'], 99):.1f} ms, max {max(probes, default=0) * 1000:.1f} ms, "
        f"{len(probes)} probes, {prober.failures} failed"
    )
    print("\n-- side by side (target) --")
    print(f"CPU per pod, filter+prioritize+bind: {cpu_pod:.2f} ms, settled {cpu_settled:.2f} ms (<= 2)")
    print(f"filter+prioritize p99, one pod at a time: {pair99:.2f} ms, settled {pair99_settled:.2f} ms (<= 5)")
    print(f"sustained {args.rate:g} req/s for {args.seconds:g} s: {got:.0f} req/s answered, {lr.errors} errors (0)")
    print(f"probes p99 under load: {pct(probes, 99):.1f} ms (<= 50)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pods", type=int, default=300, help="pods per idle phase")
    ap.add_argument("--warmup", type=int, default=5, help="filter calls per pod kind before measuring")
    ap.add_argument("--rate", type=float, default=500.0, help="requests per second of the load phase")
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the load phase")
    ap.add_argument("--connections", type=int, default=32, help="most requests in flight in the load phase")
    ap.add_argument("--probe-interval", type=float, default=0.25, help="seconds between probes")
    ap.add_argument("--skip-load", action="store_true", help="CPU and idle latency only")
    ap.add_argument(
        "--settle",
        type=int,
        default=1500,
        help="after the first pods, bind this many more, then measure --pods again: the extender's learned workload "
        "has settled by then (republished every few hundred pods, not every few); 0: skip",
    )
    args = ap.parse_args()
    if args.rate <= 0 or args.seconds <= 0 or args.connections < 1 or args.pods < 1:
        ap.error("--rate, --seconds, --pods and --connections must be positive")
    if args.settle < 0:
        ap.error(f"--settle must be >= 0, got {args.settle}")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
