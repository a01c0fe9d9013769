"""How long a *new* connection waits for its first answer while established connections keep the verbs busy.

Starts ``kelvin extender`` on a free loopback port (simulated fleet, probes on the verbs port), then for
``--seconds`` (at most 30) runs ``--clients`` keep-alive clients in a separate process, each looping ``filter`` +
``prioritize`` over every node (nodeCacheCapable, as kube-scheduler sends them), while this process opens a fresh TCP
connection every ``--probe-every`` seconds and times ``GET /healthz`` on it (connect, and connect to the answer), then
a ``filter`` on another new connection.

Prints p50 / p99 / max of the established clients' requests and of the fresh connections (issue 14 item 17: 64
clients gave established p99 0.46 s and up to 10 s on a fresh connection).

    python bench/extender_fresh_connections.py                 # 64 clients, 20 s, 1000 nodes
    python bench/extender_fresh_connections.py --clients 16 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import socket
import time
from typing import Any

import numpy as np
from harness import free_port, start_extender, stop, wait_for

MAX_SECONDS = 30.0


def _pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"load-{i}", "namespace": "default", "uid": f"uid-load-{i}"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }


def _request(path: str, body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    return head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body


async def _read_reply(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return status


async def _client(port: int, i: int, names: list[str], until: float, out: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"Pod": _pod(i), "Nodes": None, "NodeNames": names}).encode()
    reqs = [_request("/filter", body), _request("/prioritize", body)]
    n = 0
    while time.monotonic() < until:
        t = time.perf_counter()
        writer.write(reqs[n % 2])
        status = await _read_reply(reader)
        out.append(time.perf_counter() - t)
        if status != 200:
            raise SystemExit(f"client {i}: HTTP {status}")
        n += 1
    writer.close()


def _load(port: int, clients: int, names: list[str], seconds: float, q: Any) -> None:
    async def main() -> list[float]:
        until = time.monotonic() + seconds
        out: list[float] = []
        await asyncio.gather(*(_client(port, i, names, until, out) for i in range(clients)))
        return out

    q.put(asyncio.run(main()))


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def _fresh(port: int, request: bytes) -> tuple[float, float]:
    """(connect, connect to the first byte of the answer) of ``request`` on a new connection."""
    t = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        connected = time.perf_counter() - t
        s.sendall(request)
        s.recv(1)
        return connected, time.perf_counter() - t


def _pct(xs: list[float]) -> str:
    a = np.asarray(xs) * 1000
    return (
        f"n={len(a):5d}  p50 {np.percentile(a, 50):8.1f} ms  p99 {np.percentile(a, 99):8.1f} ms  max {a.max():8.1f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--probe-every", type=float, default=0.25)
    a = ap.parse_args()
    seconds = min(a.seconds, MAX_SECONDS)
    port = free_port()
    proc = start_extender(port, "--metrics-port", "0", "--fleet-nodes", str(a.nodes))
    try:
        wait_for(f"http://127.0.0.1:{port}/readyz", proc, "extender")
        names = [f"gpu-node-{i + 1}" for i in range(a.nodes)]
        q: Any = mp.get_context("spawn").Queue()
        load = mp.get_context("spawn").Process(target=_load, args=(port, a.clients, names, seconds, q))
        load.start()
        time.sleep(1.0)  # the clients are connected and busy
        connects: list[float] = []
        healthz: list[float] = []
        filters: list[float] = []
        probe_filter = _request("/filter", json.dumps({"Pod": _pod(-1), "Nodes": None, "NodeNames": names}).encode())
        until = time.monotonic() + seconds - 1.5
        while time.monotonic() < until:
            c, f = _fresh(port, HEALTHZ)
            connects.append(c)
            healthz.append(f)
            filters.append(_fresh(port, probe_filter)[1])
            time.sleep(a.probe_every)
        established = q.get(timeout=MAX_SECONDS + 30)
        load.join(timeout=30)
    finally:
        stop(proc)
    print(f"{a.clients} clients, {a.nodes} nodes, {seconds:g} s")
    print(f"  established requests      {_pct(established)}")
    print(f"  fresh connection: connect {_pct(connects)}")
    print(f"  fresh connection: /healthz {_pct(healthz)}")
    print(f"  fresh connection: /filter  {_pct(filters)}")


if __name__ == "__main__":
    main()
