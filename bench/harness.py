"""What the benchmarks share: where ../shared is, the load they ran under, a free loopback port, ``kelvin extender``
in a subprocess from this checkout, waiting for an HTTP endpoint to answer 200, and stopping a process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from scheduler_plugin.simulator.trace import Trace

ROOT = Path(__file__).resolve().parent.parent
# ../shared (the real scheduler captures, the public traces; README.md, Test data); KELVIN_SHARED_DIR overrides it.
SHARED = Path(os.environ.get("KELVIN_SHARED_DIR", ROOT.parent / "shared"))


def shared_file(path: Path) -> Path:
    """``path`` (under SHARED, or as given on the command line), or exit the benchmark saying what is missing."""
    if not path.exists():
        raise SystemExit(f"error: {path} not found (shared test data: set KELVIN_SHARED_DIR, see README.md, Test data)")
    return path


def openb_default(traces: Path) -> Trace:
    """The openb default trace under ``traces`` (its node list and default pod list), or exit naming what is
    missing."""
    from scheduler_plugin.simulator.trace import load_trace

    return load_trace(
        shared_file(traces / "openb_node_list_gpu_node.csv"), shared_file(traces / "openb_pod_list_default.csv")
    )


def load_line() -> str:
    """The CPUs and the load average a benchmark ran under (other processes skew its tail latencies)."""
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} CPUs, load average {load} (1 / 5 / 15 min)"


def go_json(obj: object) -> bytes:
    """``obj`` as kube-scheduler's Go client sends it (``encoding/json``: compact, no blanks after ``,`` and ``:``),
    so that a server that recognises the text it answered with (the names a filter passed) sees what it would see
    in a cluster."""
    return json.dumps(obj, separators=(",", ":")).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def checkout_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child that runs this checkout without ``pip install``; the parent's ``KELVIN_*``
    settings are left out, so that only what the benchmark sets applies."""
    path = os.pathsep.join([str(ROOT), str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")])
    env = {k: v for k, v in os.environ.items() if not k.startswith("KELVIN_")} | {"PYTHONPATH": path}
    return env | dict(extra or {})


def start_extender(port: int, *flags: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``kelvin extender`` on 127.0.0.1:``port`` (verbs, and with ``--metrics-port 0`` the probes too), quiet logs."""
    cmd = [sys.executable, "-c", "from scheduler_plugin.cli import app; app()", "extender"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *flags]
    return subprocess.Popen(cmd, cwd=ROOT, env=checkout_env(env))


def wait_for(url: str, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 120.0) -> None:
    """Until ``url`` answers 200; exits the benchmark with the reason if ``proc`` dies or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the {what} exited with code {proc.returncode}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the {what} was not ready within {timeout_s:g} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
