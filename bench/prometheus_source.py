"""Refresh cost of PrometheusSource for a 5,000-node x 8-GPU fleet, from a query-response fixture of that size.

A child process answers ``/api/v1/query`` on loopback with pre-rendered Prometheus API responses shaped exactly as
Prometheus answers kelvin's queries (one vector per signal, every node at once, the kelvin exporter's label set), so
the figure is the source's own cost: HTTP, JSON decoding and building the nodes. Prints wall time and the source
process's CPU time (``time.process_time``: the fixture server runs in another process) per refresh, for the source as
it runs (``typed``: each answer decoded by msgspec into typed structs, :mod:`scheduler_plugin.telemetry.prom_vector`)
and with every answer read the careful way (``careful``: orjson, then item by item, the only way before the typed
read, and still the way for an answer with a bad sample), alternately in one run, and the ratio. Each refresh runs
with the cyclic collector paused and then frozen, as ``kelvin extender``'s snapshot cache runs it
(``CacheSettings.freeze_gc``; with the collector running, a refresh here costs about half as much again).

    python bench/prometheus_source.py [--nodes 5000] [--gpus 8] [--refreshes 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.server
import multiprocessing as mp
import socket
import statistics
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlparse

import orjson
from harness import load_line

from scheduler_plugin.telemetry import prom_vector
from scheduler_plugin.telemetry.prometheus import KELVIN_QUERIES, KELVIN_STATIC, PrometheusSource

XID_WINDOW = "10m"


def _series(nodes: int, gpus: int, now: float) -> dict[str, list[dict[str, Any]]]:
    """Query text -> result vector, for every query PrometheusSource sends in kelvin mode."""
    per_key: dict[str, list[dict[str, Any]]] = {k: [] for k in KELVIN_QUERIES}
    for n in range(nodes):
        node = f"gpu-node-{n:05d}"
        per_key["seen"].append({"metric": {"node": node}, "value": [now, repr(now - n % 5)]})
        if n % 1000 == 0:  # a few GPUs with recent XIDs (the query returns only those)
            per_key["xid"].append({"metric": {"node": node, "gpu": "0"}, "value": [now, "1"]})
        for g in range(gpus):
            base = {
                "node": node,
                "gpu": str(g),
                "uuid": f"GPU-{n:08x}-{g:04x}-4000-8000-000000000000",
                "model": "NVIDIA H100 80GB HBM3",
            }
            busy = (n + g) % 3 != 0

            key_labels = {"node": node, "gpu": str(g)}

            def add(
                key: str,
                value: float,
                labels: dict[str, str] | None = None,
                ts: float = now,
                base: dict[str, str] = base,
                key_labels: dict[str, str] = key_labels,
            ) -> None:
                # the queries aggregate "by (node, gpu, ...)": only those labels come back, except for "total"
                kept = base if key == "total" else key_labels
                per_key[key].append({"metric": {**kept, **(labels or {})}, "value": [ts, repr(value)]})

            add("total", 85520809984)
            add("used", 17716740096 if busy else 536870912)
            add("temp", 62.0 if busy else 38.0)
            add("mem_temp", 70.0 if busy else 45.0)
            add("slowdown", 90.0)
            add("shutdown", 92.0)
            if not busy:
                add("reasons", 1)  # GPU_IDLE; the query returns only GPUs with a reason set
            add("clock", 1.755e9 if busy else 3.45e8)
            add("clock_max", 1.98e9)
            add("util", 0.85 if busy else 0.0)
            add("mem_util", 0.4 if busy else 0.0)
            add("power", 520.0 if busy else 72.0)
            add("numa", float(g // (gpus // 2 or 1)))
            add("nvlink", 1.0, {"peer_gpu": "nvswitch"})
            add("topology", 20.0, {"peer_gpu": str(g ^ 1)})
            if busy:
                add(
                    "procs",
                    17179869184,
                    {
                        "pid": str(200000 + g),
                        "pod_uid": f"{n:08x}-7e1f-4a00-9b3c-{g:012x}",
                        "namespace": "ml-team",
                        "pod": f"train-{n}-{g}",
                    },
                )
    return {KELVIN_QUERIES[k].replace("{xid_window}", XID_WINDOW): v for k, v in per_key.items()}


def _serve(port: int, nodes: int, gpus: int, ready: Any) -> None:
    now = time.time()
    bodies = {
        q: orjson.dumps({"status": "success", "data": {"resultType": "vector", "result": r}})
        for q, r in _series(nodes, gpus, now).items()
    }

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            query = parse_qs(urlparse(self.path).query).get("query", [""])[0]
            body = bodies.get(query) or orjson.dumps({"status": "error", "error": f"unknown query {query}"})
            self.send_response(200 if query in bodies else 400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    http.server.ThreadingHTTPServer.request_queue_size = 128
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    ready.set()
    server.serve_forever()


@dataclass
class Refreshes:
    """One mode's refreshes: wall and CPU seconds of each (the first of each source apart: it reads every signal),
    the nodes and GPUs of the last."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    first_wall: list[float] = field(default_factory=list)
    first_cpu: list[float] = field(default_factory=list)
    nodes: int = 0
    gpus: int = 0


async def _run(url: str, refreshes: int, careful: bool, into: Refreshes) -> None:
    """``refreshes`` refreshes of a fresh source (the first reads the static signals too) into ``into``; ``careful``:
    every answer read the careful way (the typed read declines all)."""
    source = PrometheusSource(url, metrics="kelvin", timeout_s=120)
    typed = prom_vector._typed
    if careful:
        prom_vector._typed = lambda content, rng: None  # type: ignore[assignment]
    nodes: Any = []
    try:
        for i in range(refreshes):
            t0, c0 = time.perf_counter(), time.process_time()
            gc.disable()  # as the extender's snapshot cache runs a refresh (CacheSettings.freeze_gc)
            try:
                nodes = await source.fetch()
            finally:
                gc.freeze()
                gc.enable()
            (into.first_wall if i == 0 else into.wall).append(time.perf_counter() - t0)
            (into.first_cpu if i == 0 else into.cpu).append(time.process_time() - c0)
    finally:
        prom_vector._typed = typed
        await source.close()
    into.nodes, into.gpus = len(nodes), sum(len(n.gpus) for n in nodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--refreshes", type=int, default=4, help="refreshes per mode and round (the first reads all)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, each running both modes")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = mp.Event()
    server = mp.Process(target=_serve, args=(port, args.nodes, args.gpus, ready), daemon=True)
    t0 = time.perf_counter()
    server.start()
    if not ready.wait(600):
        raise SystemExit("the fixture server did not start")
    print(
        f"fixture: {len(KELVIN_QUERIES)} queries x {args.nodes * args.gpus} GPUs, rendered in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    modes = {"typed": Refreshes(), "careful": Refreshes()}
    try:
        for _ in range(args.rounds):
            for mode, into in modes.items():
                asyncio.run(_run(f"http://127.0.0.1:{port}", args.refreshes, mode == "careful", into))
    finally:
        server.terminate()
    n_steady = len(KELVIN_QUERIES) - len(KELVIN_STATIC)
    print(
        f"{args.nodes} nodes / {args.nodes * args.gpus} GPUs; {args.rounds} rounds of {args.refreshes} refreshes per "
        f"mode, alternating; steady refreshes: {n_steady} queries (static signals cached), first: all "
        f"{len(KELVIN_QUERIES)}"
    )
    print(f"{'mode':>8} {'first wall':>11} {'first CPU':>10} {'steady wall p50':>16} {'steady CPU p50':>15}")
    for mode, r in modes.items():
        assert r.nodes == args.nodes and r.gpus == args.nodes * args.gpus, (mode, r.nodes, r.gpus)
        print(
            f"{mode:>8} {statistics.median(r.first_wall):>9.2f} s {statistics.median(r.first_cpu):>8.2f} s "
            f"{statistics.median(r.wall):>14.2f} s {statistics.median(r.cpu):>13.2f} s"
        )
    t, c = modes["typed"], modes["careful"]
    print(
        f"typed / careful, steady: wall {statistics.median(t.wall) / statistics.median(c.wall):.2f}, "
        f"CPU {statistics.median(t.cpu) / statistics.median(c.cpu):.2f}"
    )
    print(load_line())


if __name__ == "__main__":
    main()
