"""A stand-in for Prometheus' ``/api/v1/query`` on 127.0.0.1: answers kelvin's queries from a table the test edits,
and can answer slowly (``delay_s`` before each answer) or trickle each answer (one byte every ``trickle_s``)."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlparse

from scheduler_plugin.model import GIB
from scheduler_plugin.telemetry.prometheus import KELVIN_QUERIES

#: The query text of each kelvin signal (the source's default XID window).
QUERY_KEY = {q.replace("{xid_window}", "10m"): k for k, q in KELVIN_QUERIES.items()}


class FakePrometheus:
    def __init__(self) -> None:
        self.series: dict[str, list[dict[str, Any]]] = {}
        """Signal key (``total``, ``used``, ``seen`` ...) -> the ``result`` items answered for it."""
        self.delay_s = 0.0
        self.trickle_s = 0.0
        self.asked: list[str] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlparse(self.path).query).get("query", [""])[0]
                key = QUERY_KEY.get(query, "")
                fake.asked.append(key)
                body = json.dumps(
                    {"status": "success", "data": {"resultType": "vector", "result": fake.series.get(key, [])}}
                ).encode()
                if fake.delay_s:
                    time.sleep(fake.delay_s)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    if fake.trickle_s:
                        for i in range(len(body)):
                            self.wfile.write(body[i : i + 1])
                            self.wfile.flush()
                            time.sleep(fake.trickle_s)
                    else:
                        self.wfile.write(body)
                except OSError:  # the client gave up
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def set_gpus(
        self,
        now: float,
        nodes: dict[str, int],
        *,
        seen: float | None = None,
        overrides: dict[tuple[str, str], list[dict[str, Any]]] | None = None,
    ) -> None:
        """Healthy H100 series for ``nodes`` (name -> GPU count), sampled at ``now`` (``seen``: the samples' own
        timestamp, default ``now``); ``overrides[(signal, node)]`` replaces that node's items of that signal."""
        stamp = now if seen is None else seen
        values = {
            "total": str(80 * GIB),
            "used": str(GIB),
            "temp": "45",
            "slowdown": "87",
            "shutdown": "92",
            "clock": "1.98e9",
            "clock_max": "1.98e9",
            "util": "0",
            "mem_util": "0",
            "power": "100",
            "numa": "0",
        }
        self.series = {}
        for key in KELVIN_QUERIES:
            items: list[dict[str, Any]] = []
            for node, count in nodes.items():
                if overrides and (key, node) in overrides:
                    items += overrides[(key, node)]
                elif key == "seen":
                    items.append({"metric": {"node": node}, "value": [now, repr(stamp)]})
                elif key in values:
                    for g in range(count):
                        labels = {"node": node, "gpu": str(g)}
                        if key == "total":
                            labels |= {"uuid": f"GPU-{node}-{g}", "model": "NVIDIA H100 80GB HBM3"}
                        items.append({"metric": labels, "value": [now, values[key]]})
            self.series[key] = items

    @contextmanager
    def running(self) -> Iterator[FakePrometheus]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()
            thread.join(5)
