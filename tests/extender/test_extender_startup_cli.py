"""``kelvin extender`` as a process with both listeners: uvicorn's process lines are logged once, not per listener."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_started_server_process_is_logged_once_with_two_listeners() -> None:
    verbs, metrics = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'operator'}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler_plugin.cli", "extender", "--source", "simulated", "--fleet-nodes", "4",
         "--port", str(verbs), "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        deadline, up = time.monotonic() + 90, False
        while not up and time.monotonic() < deadline and proc.poll() is None:
            try:
                up = httpx.get(f"http://127.0.0.1:{metrics}/healthz", timeout=2).status_code == 200
                up = up and httpx.get(f"http://127.0.0.1:{verbs}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                time.sleep(0.2)
        assert up, "the extender did not come up within 90 s"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert err.count("Started server process") == 1, err
    assert err.count("Finished server process") <= 1, err
    assert "Traceback" not in err, err
