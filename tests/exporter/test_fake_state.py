"""``kelvin exporter --fake --fake-state-file``: the fake GPUs follow a file that tests rewrite at run time."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pynvml
import pytest
import typer
from typer.testing import CliRunner

from scheduler_plugin.exporter.app import Exporter
from scheduler_plugin.exporter.cli import exporter
from scheduler_plugin.model import GIB, ThrottleReason
from scheduler_plugin.nvml.fake import FakeNvml
from scheduler_plugin.nvml.fake_state import FakeStateError, FakeStateFile, load_state


def _write(path: Path, text: str) -> None:
    """Atomically, as the docs ask (a rename), with a distinct mtime so the watcher sees every version."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _reading(fake: FakeNvml) -> dict[int, tuple[float | None, int | None, int | None]]:
    """GPU index -> (temperature, memory used, throttle reasons) as the exporter's reader sees them."""
    app = Exporter(fake, "n1", watch_xid=False)
    reading = app.reader.read()
    return {g.index: (g.temperature_celsius, g.memory_used_bytes, g.clocks_event_reasons) for g in reading.gpus}


def test_state_file_heats_idles_and_restores_gpus(tmp_path: Path) -> None:
    fake = FakeNvml(8, "H100-SXM-80GB")
    before = _reading(fake)
    assert (before[0][1] or 0) > 16 * GIB  # GPU 0 runs the fake's training pod at start
    path = tmp_path / "state.yaml"
    _write(
        path,
        """
gpus:
  all: {busy: false}
  "3": {temperature: 93, throttleReasons: [HW_THERMAL_SLOWDOWN], memoryUsed: 2Gi,
        processes: [{pid: 4242, used: 30Gi, podUid: 11111111-2222-3333-4444-555555555555, pod: p}]}
""",
    )
    watcher = FakeStateFile(path, fake)
    after = _reading(fake)
    assert after[0] == (38.0, 512 * 2**20, int(ThrottleReason.GPU_IDLE))  # idle: no process, idle temperature
    assert after[3] == (93.0, 32 * GIB, int(ThrottleReason.HW_THERMAL_SLOWDOWN))
    handle = fake.nvmlDeviceGetHandleByIndex(3)
    fake.nvmlInit()
    (proc,) = fake.nvmlDeviceGetComputeRunningProcesses(handle)
    assert proc.pid == 4242 and proc.usedGpuMemory == 30 * GIB

    # declarative: a key removed puts the GPU back as it started; the file removed, every GPU
    _write(path, 'gpus: {"3": {temperature: 70}}\n')
    assert watcher.reload()
    assert _reading(fake)[0] == before[0] and _reading(fake)[3][0] == 70.0
    path.unlink()
    assert watcher.reload()
    assert _reading(fake) == before


def test_bad_file_at_runtime_keeps_the_last_good_state(tmp_path: Path) -> None:
    fake = FakeNvml(2, "H100-SXM-80GB")
    path = tmp_path / "state.yaml"
    _write(path, 'gpus: {"1": {temperature: 88}}\n')
    watcher = FakeStateFile(path, fake)
    _write(path, 'gpus: {"1": {temperature: hot}}\n')
    assert not watcher.reload()
    assert _reading(fake)[1][0] == 88.0


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('gpus: {"1": {temperature: hot}}', "gpus.1.temperature"),
        ('gpus: {"9": {temperature: 50}}', "gpus.9: the fake has GPUs 0..7"),
        ("gpus: {first: {}}", "must be a GPU index"),
        ('gpus: {"0": {throttleReasons: [TOO_HOT]}}', "unknown throttle reason 'TOO_HOT'"),
        ('gpus: {"0": {memoryUsed: lots}}', "gpus.0.memoryUsed"),
        ('gpus: {"0": {temprature: 50}}', "gpus.0.temprature"),
        ("[1, 2]", "must be a mapping"),
        ("gpus: {", "not valid YAML"),
    ],
)
def test_bad_state_names_the_field(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "state.yaml"
    path.write_text(text)
    with pytest.raises(FakeStateError, match=r"state\.yaml") as err:
        FakeStateFile(path, FakeNvml(8, "H100-SXM-80GB"))
    assert named in str(err.value)


def test_missing_file_is_the_start_up_state(tmp_path: Path) -> None:
    assert load_state(tmp_path / "absent.yaml").gpus == {}


def test_watcher_thread_applies_a_change(tmp_path: Path) -> None:
    fake = FakeNvml(2, "H100-SXM-80GB")
    path = tmp_path / "state.json"
    watcher = FakeStateFile(path, fake, interval_s=0.02)
    watcher.start()
    try:
        _write(path, '{"gpus": {"0": {"temperature": 95}}}')
        deadline = time.monotonic() + 5
        while fake.gpus[0].temperature_celsius != 95 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watcher.stop()
    fake.nvmlInit()
    assert fake.nvmlDeviceGetTemperature(fake.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_TEMPERATURE_GPU) == 95


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(exporter)
    return app


def test_cli_refuses_a_bad_state_file_naming_the_flag_and_field(tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    path.write_text('gpus: {"0": {temperature: -5}}')
    result = CliRunner().invoke(_app(), ["--fake", "--fake-state-file", str(path), "--port", "0"])
    assert result.exit_code == 2
    assert "--fake-state-file" in result.output and "gpus.0.temperature" in result.output
    assert "Traceback" not in result.output


def test_cli_state_file_needs_the_fake_backend(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), ["--fake-state-file", str(tmp_path / "s.yaml"), "--port", "0"])
    assert result.exit_code == 2 and "--fake" in result.output
