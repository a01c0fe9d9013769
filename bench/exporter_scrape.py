"""Cost of one exporter scrape (collect + text exposition) for 8 GPUs on the fake NVML backend. Target: <= 5 ms.

python bench/exporter_scrape.py [--gpus 8] [--model H100-SXM-80GB] [--scrapes 2000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from prometheus_client import generate_latest

from scheduler_plugin.exporter.app import Exporter
from scheduler_plugin.exporter.fake_nvml import FakeNvml, write_proc


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
        body = generate_latest(exporter.registry)  # warm-up: NVML init, link and topology discovery
        scrape, collect = [], []
        for _ in range(args.scrapes):
            t0 = time.perf_counter()
            generate_latest(exporter.registry)
            scrape.append(time.perf_counter() - t0)
            assert exporter.collector.last is not None
            collect.append(exporter.collector.last.duration_s)
    for name, xs in (("scrape (collect + exposition)", scrape), ("NVML read only", collect)):
        xs.sort()
        p50, p99 = xs[len(xs) // 2] * 1e3, xs[int(len(xs) * 0.99)] * 1e3
        print(f"{name:32s} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  mean {statistics.fmean(xs) * 1e3:6.2f} ms")
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    print(f"{args.gpus} x {args.model}, {args.scrapes} scrapes, exposition {len(body)} bytes, {samples} samples")
    print(f"target p50 <= 5 ms: {'met' if scrape[len(scrape) // 2] * 1e3 <= 5 else 'MISSED'}")


if __name__ == "__main__":
    main()
