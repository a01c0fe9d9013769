"""The exporter's metrics: the names of docs/metrics.md, absent-when-unsupported, and NVML failures survived."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pynvml
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from scheduler_plugin.exporter.app import Exporter
from scheduler_plugin.model import ThrottleReason
from scheduler_plugin.nvml.fake import FakeNvml, write_proc

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def documented_exporter_metrics() -> set[str]:
    """Sample names in the exporter table of docs/metrics.md (counters with their ``_total``)."""
    text = DOCS.read_text()
    section = text.split("## Exporter", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cell = line.split("|")[1]
        parts = re.findall(r"`([a-z_]+)`", cell)
        first = parts[0]
        for part in parts:
            if part.startswith("_"):
                stem = "_".join(first.split("_")[: -(part.count("_"))])
                names.add(stem + part)
            else:
                names.add(part)
    return names


def scrape(exporter: Exporter) -> list[Sample]:
    """What ``GET /metrics`` serves (static part cached), checked against the uncached registry's family names."""
    out: list[str] = []
    body = b"".join(exporter({"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics"}, lambda s, h: out.append(s)))
    assert out == ["200 OK"]
    fams = list(text_string_to_metric_families(body.decode()))
    names = [f.name for f in fams]
    assert len(names) == len(set(names))
    uncached = {f.name for f in text_string_to_metric_families(generate_latest(exporter.registry).decode())}
    assert set(names) == uncached
    return [s for fam in fams for s in fam.samples]


def values(samples: list[Sample], name: str, **labels: str) -> list[float]:
    return [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml(8, "H100-SXM-80GB", seed=4)


@pytest.fixture
def exporter(fake: FakeNvml, tmp_path: Path) -> Exporter:
    write_proc(fake, tmp_path / "proc", tmp_path / "pods")
    return Exporter(fake, "gpu-node-1", proc_root=tmp_path / "proc", pods_dir=tmp_path / "pods", watch_xid=False)


def test_every_documented_metric_is_produced_and_nothing_else(exporter: Exporter) -> None:
    documented = documented_exporter_metrics()
    assert len(documented) >= 25
    produced = {s.name for s in scrape(exporter)}
    assert produced == documented


def test_every_gpu_series_carries_node_gpu_uuid_model(exporter: Exporter, fake: FakeNvml) -> None:
    for s in scrape(exporter):
        if s.name.startswith("kelvin_gpu_"):
            assert s.labels["node"] == "gpu-node-1"
            assert s.labels["uuid"] == fake.gpus[int(s.labels["gpu"])].uuid
            assert s.labels["model"] == "NVIDIA H100 80GB HBM3"


def test_values_in_base_units(exporter: Exporter, fake: FakeNvml) -> None:
    fake.gpus[3].throttle_reasons = int(ThrottleReason.SW_POWER_CAP | ThrottleReason.HW_THERMAL_SLOWDOWN)
    samples = scrape(exporter)
    assert values(samples, "kelvin_exporter_nvml_up") == [1.0]
    assert values(samples, "kelvin_gpu_memory_total_bytes", gpu="0") == [81559 * 2**20]
    assert values(samples, "kelvin_gpu_sm_clock_max_hertz", gpu="0") == [1980e6]
    assert values(samples, "kelvin_gpu_utilization_ratio", gpu="0") == [0.85]
    assert values(samples, "kelvin_gpu_power_watts", gpu="0") == [520.0]
    assert values(samples, "kelvin_gpu_clocks_event_reasons", gpu="3") == [0x44]
    active = {
        s.labels["reason"]
        for s in samples
        if s.name == "kelvin_gpu_clocks_event_reason_active" and s.labels["gpu"] == "3" and s.value == 1
    }
    assert active == {"sw_power_cap", "hw_thermal_slowdown"}
    # closed label sets are pre-initialised to 0
    assert values(samples, "kelvin_gpu_ecc_errors_total", gpu="5", type="uncorrected") == [0.0]
    assert values(samples, "kelvin_gpu_xid_errors_total", gpu="5", xid="79") == [0.0]
    assert len(values(samples, "kelvin_gpu_nvlink_link_up", gpu="0", peer_gpu="nvswitch")) == 18
    assert values(samples, "kelvin_gpu_topology_level", gpu="0", peer_gpu="1") == [pynvml.NVML_TOPOLOGY_MULTIPLE]


def test_processes_are_attributed_to_pods(exporter: Exporter) -> None:
    procs = [s for s in scrape(exporter) if s.name == "kelvin_gpu_process_memory_used_bytes"]
    assert len(procs) == 6  # the two last GPUs idle
    first = next(s for s in procs if s.labels["gpu"] == "0")
    assert first.labels["namespace"] == "ml-team" and first.labels["pod"] == "train-4-0"
    assert first.labels["pod_uid"].startswith("00000004-7e1f-")
    assert first.value == 16 * 2**30


def test_not_supported_means_absent_not_a_sentinel(exporter: Exporter, fake: FakeNvml) -> None:
    fake.set_error("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=2)
    fake.set_error("nvmlDeviceGetTotalEccErrors", pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.set_error("nvmlDeviceGetNumaNodeId", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    fake.gpus[1].memory_temperature_celsius = None
    samples = scrape(exporter)
    assert values(samples, "kelvin_exporter_nvml_up") == [1.0]
    assert values(samples, "kelvin_gpu_power_watts", gpu="2") == []
    assert len(values(samples, "kelvin_gpu_power_watts")) == 7
    assert values(samples, "kelvin_gpu_ecc_errors_total") == []
    assert values(samples, "kelvin_gpu_numa_node") == []
    assert values(samples, "kelvin_gpu_memory_temperature_celsius", gpu="1") == []
    assert values(samples, "kelvin_gpu_memory_temperature_celsius", gpu="0") == [70.0]


def test_lost_gpu_sets_nvml_up_0_keeps_the_others_and_recovers(exporter: Exporter, fake: FakeNvml) -> None:
    fake.lose_gpu(6)
    samples = scrape(exporter)
    assert values(samples, "kelvin_exporter_nvml_up") == [0.0]
    assert sorted(s.labels["gpu"] for s in samples if s.name == "kelvin_gpu_memory_used_bytes") == list("0123457")
    fake.restore_gpu(6)
    samples = scrape(exporter)
    assert values(samples, "kelvin_exporter_nvml_up") == [1.0]
    assert len(values(samples, "kelvin_gpu_memory_used_bytes")) == 8


def test_driver_gone_and_back(exporter: Exporter, fake: FakeNvml, caplog: pytest.LogCaptureFixture) -> None:
    assert values(scrape(exporter), "kelvin_exporter_nvml_up") == [1.0]
    fake.driver_down()
    samples = scrape(exporter)
    assert values(samples, "kelvin_exporter_nvml_up") == [0.0]
    assert values(samples, "kelvin_gpu_memory_used_bytes") == []
    assert "NVML" in caplog.text
    fake.driver_up()
    assert values(scrape(exporter), "kelvin_exporter_nvml_up") == [1.0]


def test_init_failure_is_reported_not_raised(fake: FakeNvml, tmp_path: Path) -> None:
    fake.set_error("nvmlInit", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    exporter = Exporter(fake, "n", proc_root=tmp_path, watch_xid=False)
    samples = scrape(exporter)
    assert values(samples, "kelvin_exporter_nvml_up") == [0.0]
    assert {s.name for s in samples} == {"kelvin_exporter_nvml_up", "kelvin_exporter_collect_duration_seconds"}
    fake.clear_errors()
    assert values(scrape(exporter), "kelvin_exporter_nvml_up") == [1.0]


def test_mig_and_nvlink_state(exporter: Exporter, fake: FakeNvml) -> None:
    fake.gpus[0].mig_enabled, fake.gpus[0].mig_devices = True, 3
    fake.gpus[1].nvlink_down = {4}
    samples = scrape(exporter)
    assert values(samples, "kelvin_gpu_mig_mode", gpu="0") == [1.0]
    assert values(samples, "kelvin_gpu_mig_instances", gpu="0") == [3.0]
    assert values(samples, "kelvin_gpu_mig_instances", gpu="1") == [0.0]
    assert values(samples, "kelvin_gpu_nvlink_link_up", gpu="1", link="4") == [0.0]
    assert values(samples, "kelvin_gpu_nvlink_link_up", gpu="1", link="5") == [1.0]


def test_xid_events_are_counted_per_code(fake: FakeNvml, tmp_path: Path) -> None:
    exporter = Exporter(fake, "n", proc_root=tmp_path)
    exporter.watcher.start()
    try:
        for _ in range(200):
            if exporter.watcher.registered:
                break
            time.sleep(0.01)
        fake.inject_xid(3, 79)
        fake.inject_xid(3, 79)
        fake.inject_xid(5, 48)
        for _ in range(200):
            if sum(exporter.watcher.counts().values()) == 3:
                break
            time.sleep(0.01)
        samples = scrape(exporter)
    finally:
        exporter.stop()
    assert values(samples, "kelvin_gpu_xid_errors_total", gpu="3", xid="79") == [2.0]
    assert values(samples, "kelvin_gpu_xid_errors_total", gpu="5", xid="48") == [1.0]
    assert values(samples, "kelvin_gpu_xid_errors_total", gpu="5", xid="79") == [0.0]


def test_xid_watcher_survives_a_driver_reload(fake: FakeNvml, tmp_path: Path) -> None:
    exporter = Exporter(fake, "n", proc_root=tmp_path)
    exporter.watcher._retry_s = 0.05
    exporter.watcher._wait_ms = 20
    exporter.watcher.start()
    try:
        fake.driver_down()
        for _ in range(200):
            if not exporter.watcher.registered:
                break
            time.sleep(0.01)
        fake.driver_up()
        for _ in range(300):
            if exporter.watcher.registered:
                break
            time.sleep(0.01)
        fake.inject_xid(0, 13)
        for _ in range(300):
            if exporter.watcher.counts():
                break
            time.sleep(0.01)
    finally:
        exporter.stop()
    assert exporter.watcher.counts() == {(0, 13): 1}
