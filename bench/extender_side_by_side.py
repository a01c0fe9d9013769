"""Server CPU per pod of two checkouts over HTTP, at the same time: a fair comparison on a machine whose speed moves.

On a shared or throttled box the same code measures tens of percent apart from one minute to the next, so runs one
after the other cannot show a 10 % change. This starts ``kelvin extender`` from this checkout and from ``--base``
(another checkout, e.g. ``git worktree add ../base main``) on the same simulated fleet, each pinned to its own core
(``taskset``; ``--swap`` exchanges the cores), and sends every pod to both, in alternating order: filter with every
name, prioritize with the names that passed, bind to the best-scored node (each pod has its own UID: its bind is
charged to the ledger). Both servers' CPU (``/proc/PID/stat``) is read around each phase: the first ``--pods`` new
pods (the learned workload moving) and, after ``--settle`` more, ``--pods`` again (settled). The client runs on the
same machine; two servers at once make both figures higher than one alone (shared caches and memory bandwidth), so
only the ratio is the result.

The servers read the wall clock (the ledger's TTL, the burst window), so their answers may drift apart over a long
run even for identical code; ``bench/extender_verbs.py`` digests compare answers exactly.

    git worktree add ../base main
    python bench/extender_side_by_side.py --base ../base
    python bench/extender_side_by_side.py --base ../base --swap
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from extender_latency import pods
from extender_load import cpu_seconds, pct
from extender_verbs import pod_with_uid
from harness import ROOT, free_port, go_json, load_line, stop, wait_for


class Server:
    """One checkout's ``kelvin extender`` (static simulated fleet) on a core of its own, and a client for it."""

    def __init__(self, label: str, root: Path, core: int, args: argparse.Namespace, tmp: Path) -> None:
        self.label, self.core = label, core
        port, mport = free_port(), free_port()
        policy = tmp / f"policy-{label}.yaml"
        policy.write_text("telemetry:\n  maxAgeSeconds: 7200\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KELVIN_")}
        env |= {
            "PYTHONPATH": os.pathsep.join([str(root), str(root / "operator")]),
            "KELVIN_METRICS_HOST": "127.0.0.1",
            "KELVIN_MAX_TELEMETRY_AGE_S": "7200",
        }
        cmd = ["taskset", "-c", str(core), sys.executable, "-c", "from scheduler_plugin.cli import app; app()"]
        cmd += ["extender", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
        cmd += ["--metrics-port", str(mport), "--fleet-nodes", str(args.nodes), "--fleet-gpus", str(args.gpus)]
        cmd += ["--refresh-interval", "3600", "--policy-file", str(policy)]
        self.proc = subprocess.Popen(cmd, cwd=root, env=env)
        self.ready_url = f"http://127.0.0.1:{mport}/readyz"
        transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0, transport=transport)
        self.wall: list[float] = []

    def post(self, path: str, body: dict[str, Any]) -> tuple[Any, float]:
        data = go_json(body)
        a = time.perf_counter()
        r = self.client.post(path, content=data, headers={"Content-Type": "application/json"})
        b = time.perf_counter()
        if r.status_code != 200:
            raise SystemExit(f"{self.label}: {path} answered {r.status_code}: {r.text[:300]}")
        return r.json(), b - a

    def pod(self, p: dict[str, Any], names: list[str]) -> None:
        """Filter, prioritize and bind ``p``; the pair's wall time is kept."""
        res, tf = self.post("/filter", {"Pod": p, "Nodes": None, "NodeNames": names})
        ok = res["NodeNames"] or []
        prio, tp = self.post("/prioritize", {"Pod": p, "Nodes": None, "NodeNames": ok})
        best = max(prio, key=lambda h: h["Score"])["Host"] if prio else names[0]
        meta = p["metadata"]
        bind = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": best}
        bound, _ = self.post("/bind", bind)
        if bound.get("Error"):
            raise SystemExit(f"{self.label}: bind answered Error: {bound['Error']}")
        self.wall.append(tf + tp)

    def close(self) -> None:
        self.client.close()
        stop(self.proc)


def phase(servers: list[Server], names: list[str], first: int, count: int, label: str | None) -> None:
    """Pods ``first``.. to every server, alternating which goes first; prints CPU per pod and pair latency."""
    base = pods()
    for s in servers:
        s.wall = []
    cpu0 = [cpu_seconds(s.proc.pid) for s in servers]
    for i in range(first, first + count):
        p = pod_with_uid(base, i)
        for s in servers if i % 2 else servers[::-1]:
            s.pod(p, names)
    if label is None:
        return
    cpus = [(cpu_seconds(s.proc.pid) - c0) / count * 1e3 for s, c0 in zip(servers, cpu0, strict=True)]
    for s, cpu in zip(servers, cpus, strict=True):
        print(
            f"{label:>28} {s.label:>5} (core {s.core}): server CPU/pod {cpu:6.2f} ms, "
            f"pair p50 {pct(s.wall, 50):6.2f} ms, p99 {pct(s.wall, 99):6.2f} ms"
        )
    print(f"{label:>28} ratio this / base: {cpus[0] / cpus[1]:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="the other checkout (its root folder)")
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pods", type=int, default=300, help="pods per measured phase")
    ap.add_argument("--settle", type=int, default=1500, help="pods bound between the two measured phases")
    ap.add_argument("--swap", action="store_true", help="this checkout on core 0, the base on core 1")
    args = ap.parse_args()
    if args.nodes < 1 or args.gpus < 1 or args.pods < 1 or args.settle < 0:
        ap.error("--nodes, --gpus and --pods must be positive, --settle at least 0")
    if not (args.base / "scheduler_plugin").is_dir():
        ap.error(f"--base {args.base}: not a kelvin checkout (no scheduler_plugin folder)")
    if (os.cpu_count() or 1) < 2:
        ap.error("needs 2 CPUs: one per server")
    print(f"{args.nodes} nodes x {args.gpus} GPUs, nodeCacheCapable; this {ROOT} vs base {args.base.resolve()}")
    print(load_line())
    names = [f"gpu-node-{i}" for i in range(1, args.nodes + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        core = 0 if args.swap else 1
        servers: list[Server] = []
        try:
            servers.append(Server("this", ROOT, core, args, Path(tmp)))
            servers.append(Server("base", args.base.resolve(), 1 - core, args, Path(tmp)))
            for s in servers:
                wait_for(s.ready_url, s.proc, f"{s.label} extender", timeout_s=600.0)
            phase(servers, names, 0, args.pods, "first pods")
            if args.settle:
                phase(servers, names, args.pods, args.settle, None)
                phase(servers, names, args.pods + args.settle, args.pods, f"after {args.settle} more (settled)")
        finally:
            for s in servers:
                s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
