"""Cost of one exporter scrape for 8 GPUs on the fake NVML backend: what ``GET /metrics`` serves (NVML read +
exposition, the hardware-only families from the cache), without the socket. Target: p50 <= 5 ms.

Rows: the WSGI handler as curl asks (text 0.0.4, no gzip), as Prometheus asks (OpenMetrics + gzip), the old
uncached path (``generate_latest`` over the whole registry) for comparison, and the NVML read alone.

python bench/exporter_scrape.py [--gpus 8] [--model H100-SXM-80GB] [--scrapes 2000]
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import load_line
from prometheus_client import generate_latest

from scheduler_plugin.exporter.app import Exporter
from scheduler_plugin.nvml.fake import FakeNvml, write_proc

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=underscores;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


def _get(exporter: Exporter, headers: dict[str, str]) -> Callable[[], bytes]:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "", **headers}

    def start_response(status: str, _headers: list[tuple[str, str]]) -> Any:
        assert status == "200 OK", status

    def call() -> bytes:
        return b"".join(exporter(dict(environ), start_response))

    return call


def _time(fn: Callable[[], object], n: int) -> list[float]:
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return xs


def _row(name: str, xs: list[float]) -> float:
    xs = sorted(xs)
    p50, p99 = xs[len(xs) // 2] * 1e3, xs[int(len(xs) * 0.99)] * 1e3
    print(f"{name:40s} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  mean {statistics.fmean(xs) * 1e3:6.2f} ms")
    return p50


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--model", default="H100-SXM-80GB")
    ap.add_argument("--scrapes", type=int, default=2000)
    args = ap.parse_args()
    fake = FakeNvml(args.gpus, args.model, vary=True)
    with tempfile.TemporaryDirectory() as tmp:
        write_proc(fake, Path(tmp) / "proc", Path(tmp) / "pods")
        exporter = Exporter(
            fake, "bench-node", proc_root=Path(tmp) / "proc", pods_dir=Path(tmp) / "pods", watch_xid=False
        )
        plain = _get(exporter, {})
        prom = _get(exporter, {"HTTP_ACCEPT": PROMETHEUS_ACCEPT, "HTTP_ACCEPT_ENCODING": "gzip"})
        body, om = plain(), gzip.decompress(prom())  # warm-up: NVML init, discovery, static renderings
        collect: list[float] = []

        def served() -> None:
            plain()
            assert exporter.collector.last is not None
            collect.append(exporter.collector.last.duration_s)

        rows = {
            "GET /metrics (text 0.0.4)": _time(served, args.scrapes),
            "GET /metrics (OpenMetrics + gzip)": _time(prom, args.scrapes),
            "uncached generate_latest(registry)": _time(lambda: generate_latest(exporter.registry), args.scrapes),
        }
        rows["NVML read only (in the first row)"] = collect
        p50s = {name: _row(name, xs) for name, xs in rows.items()}
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    print(
        f"{args.gpus} x {args.model}, {args.scrapes} scrapes per row, text {len(body)} bytes / OpenMetrics "
        f"{len(om)} bytes, {samples} samples; cached parts rendered {exporter.renderer.renders}"
    )
    met = p50s["GET /metrics (text 0.0.4)"] <= 5
    print(f"target p50 <= 5 ms (GET /metrics, text): {'met' if met else 'MISSED'}")
    print(load_line())


if __name__ == "__main__":
    main()
