"""``kelvin device-plugin``: bad options give one clear line; the real command serves and registers (--fake)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
from dpkit import FakeKubelet
from typer.testing import CliRunner

from scheduler_plugin.cli import app
from scheduler_plugin.model import annotations as ann

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "node name is empty (set NODE_NAME or --node-name)"),
        (["--node-name", "n1", "--resource", "amd.com/gpu"], "'amd.com/gpu' is not one of"),
        (["--node-name", "n1", "--shared-slots-per-gpu", "0"], "shared slots per GPU must be 1..128"),
        (["--node-name", "n1", "--device-list-strategy", "volume-mounts"], "'volume-mounts' is not one of env, cdi"),
        (["--node-name", "n1", "--log-level", "chatty"], "'chatty' is not one of 'debug', 'info', 'warning'"),
        (["--node-name", "n1", "--fake-model", "Z9000"], "fake model: unknown GPU model 'Z9000'"),
    ],
)
def test_bad_options_are_one_clear_error(args: list[str], message: str, socket_dir: Path) -> None:
    result = CliRunner().invoke(
        app, ["device-plugin", "--fake", "--socket-dir", str(socket_dir), "--api-server", "http://127.0.0.1:9", *args]
    )
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.replace("│", " ").split()), result.output
    assert "Traceback" not in result.output


def test_missing_socket_dir_is_named(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["device-plugin", "--fake", "--node-name", "n1", "--socket-dir", str(tmp_path / "x")]
    )
    text = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and "is not a folder" in text and "Traceback" not in text, result.output


async def test_the_command_registers_with_the_kubelet_and_stops_on_sigterm(socket_dir: Path) -> None:
    kubelet = FakeKubelet(socket_dir)
    await kubelet.start()
    env = {**os.environ, "NODE_NAME": "gpu-node-1", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'operator'}"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from scheduler_plugin.cli import app; app()",
        "device-plugin",
        "--fake",
        "--fake-gpus",
        "2",
        "--shared-slots-per-gpu",
        "2",
        "--socket-dir",
        str(socket_dir),
        "--api-server",
        "http://127.0.0.1:9",
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        reqs = await kubelet.wait_registrations(2, timeout_s=60)
        assert {r.resource_name for r in reqs} == {ann.GPU_RESOURCE, ann.SHARED_GPU_RESOURCE}
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        await kubelet.stop()
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err
