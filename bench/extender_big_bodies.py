"""Big request bodies against a real ``kelvin extender``: time, peak RSS and /healthz latency while one is served.

For each case it starts a fresh ``kelvin extender`` subprocess (so that the peak RSS, ``VmHWM``, is that request's)
with a simulated fleet, waits for ``/readyz``, then posts one big body while a second connection polls ``/healthz``
every 20 ms. Cases (sizes in MB, default 10 and 50):

* ``prioritize-names``: nodeCacheCapable true, ``NodeNames`` only (about 15 bytes a name: 10 MB is ~650,000 names);
* ``prioritize-nodes`` / ``filter-nodes``: nodeCacheCapable false, ``Nodes.items`` holding copies of the real Node
  object of ``fixtures/extender/filter-nodecache-false-ok-001.json`` (2.5 kB each) under distinct names.

Prints per case: HTTP status, request seconds, baseline and peak RSS, and the worst /healthz latency seen during it.
Limits: pass ``--max-body-bytes`` / ``--max-node-names`` (exported as ``KELVIN_MAX_BODY_BYTES`` /
``KELVIN_MAX_NODE_NAMES``) to lift the defaults and see the cost of bodies they would refuse.

    python bench/extender_big_bodies.py                          # defaults: 10 and 50 MB, limits as configured
    python bench/extender_big_bodies.py --max-body-bytes 100000000 --max-node-names 10000000
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import httpx
from harness import SHARED, free_port, shared_file, start_extender, stop

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = SHARED / "fixtures" / "extender" / "filter-nodecache-false-ok-001.json"


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def body_for(case: str, mb: float, fleet: int) -> bytes:
    capture = json.loads(shared_file(CAPTURE).read_text())["request"]
    pod, node = capture["Pod"], capture["Nodes"]["items"][0]
    target = int(mb * 1_000_000)
    if case == "prioritize-names":
        n = target // len('"gpu-node-100000",')
        return json.dumps(
            {"Pod": pod, "Nodes": None, "NodeNames": [f"gpu-node-{i % (2 * fleet) + 1}-{i}" for i in range(n)]}
        ).encode()
    size = len(json.dumps(node))
    items = []
    for i in range(max(1, target // size)):
        nd = dict(node)
        nd["metadata"] = {**node["metadata"], "name": f"gpu-node-{i + 1}"}
        items.append(nd)
    return json.dumps({"Pod": pod, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}).encode()


def run_case(case: str, mb: float, args: argparse.Namespace) -> str:
    port = free_port()
    env = {"KELVIN_METRICS_PORT": str(free_port())}
    if args.max_body_bytes:
        env["KELVIN_MAX_BODY_BYTES"] = str(args.max_body_bytes)
    if args.max_node_names:
        env["KELVIN_MAX_NODE_NAMES"] = str(args.max_node_names)
    proc = start_extender(port, "--fleet-nodes", str(args.fleet_nodes), env=env)
    body = body_for(case, mb, args.fleet_nodes)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=300.0) as client:
            deadline = time.monotonic() + 180
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"the extender exited with code {proc.returncode}")
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the extender did not start")
                time.sleep(0.2)
            time.sleep(1.0)  # the first snapshot
            rss0 = status_kb(proc.pid, "VmRSS")
            worst: list[float] = [0.0]
            done = threading.Event()
            polling = threading.Event()

            def poll() -> None:
                with httpx.Client(base_url=base, timeout=60.0) as c:
                    while not done.is_set():
                        t = time.perf_counter()
                        c.get("/healthz")
                        worst[0] = max(worst[0], time.perf_counter() - t)
                        polling.set()
                        time.sleep(0.02)

            th = threading.Thread(target=poll, daemon=True)
            th.start()
            polling.wait(30)
            t0 = time.perf_counter()
            r = client.post(f"/{case.split('-')[0]}", content=body, headers={"Content-Type": "application/json"})
            elapsed = time.perf_counter() - t0
            done.set()
            th.join()
            peak = status_kb(proc.pid, "VmHWM")
    finally:
        stop(proc)
    return (
        f"{case:>17} {len(body) / 1e6:>6.1f} MB  HTTP {r.status_code}  {elapsed:>6.2f} s  RSS {rss0 / 1024:>5.0f} -> "
        f"{peak / 1024:>5.0f} MiB  /healthz worst {worst[0] * 1000:>7.1f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=float, nargs="+", default=[10, 50], help="body sizes in MB")
    p.add_argument("--cases", nargs="+", default=["prioritize-names", "prioritize-nodes", "filter-nodes"])
    p.add_argument("--fleet-nodes", type=int, default=2000)
    p.add_argument("--max-body-bytes", type=int, default=0)
    p.add_argument("--max-node-names", type=int, default=0)
    args = p.parse_args(argv)
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load}; fleet {args.fleet_nodes} simulated nodes")
    for mb in args.sizes:
        for case in args.cases:
            print(run_case(case, mb, args), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
