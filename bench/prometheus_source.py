"""Refresh cost of PrometheusSource for a 5,000-node x 8-GPU fleet, from a query-response fixture of that size.

A child process answers ``/api/v1/query`` on loopback with pre-rendered Prometheus API responses shaped exactly as
Prometheus answers kelvin's queries (one vector per signal, every node at once, the kelvin exporter's label set), so
the figure is the source's own cost: HTTP, JSON decoding and building the nodes.

    python bench/prometheus_source.py [--nodes 5000] [--gpus 8] [--refreshes 5]
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import multiprocessing as mp
import socket
import statistics
import time
from typing import Any
from urllib.parse import parse_qs, urlparse

import orjson
from harness import load_line

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


async def _run(url: str, refreshes: int) -> tuple[list[float], int, int]:
    source = PrometheusSource(url, metrics="kelvin", timeout_s=120)
    times = []
    nodes: Any = []
    try:
        for _ in range(refreshes):
            t0 = time.perf_counter()
            nodes = await source.fetch()
            times.append(time.perf_counter() - t0)
    finally:
        await source.close()
    return times, len(nodes), sum(len(n.gpus) for n in nodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--refreshes", type=int, default=5)
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
    try:
        times, n_nodes, n_gpus = asyncio.run(_run(f"http://127.0.0.1:{port}", args.refreshes))
    finally:
        server.terminate()
    assert n_nodes == args.nodes and n_gpus == args.nodes * args.gpus, (n_nodes, n_gpus)
    print(f"first refresh (all {len(KELVIN_QUERIES)} queries): {times[0]:.2f} s")
    rest = times[1:] or times
    print(
        f"steady refreshes ({len(KELVIN_QUERIES) - len(KELVIN_STATIC)} queries; static signals cached) of {n_nodes} "
        f"nodes / {n_gpus} GPUs: min {min(rest):.2f} s  median {statistics.median(rest):.2f} s  max {max(rest):.2f} s"
    )
    print(load_line())


if __name__ == "__main__":
    main()
