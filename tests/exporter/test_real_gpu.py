"""The exporter on a real NVIDIA GPU (pynvml over libnvidia-ml). Skipped, with the reason, where NVML cannot start."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scheduler_plugin.exporter.app import Exporter
from scheduler_plugin.nvml.backend import NvmlApi

pytestmark = pytest.mark.gpu


def test_real_scrape_has_the_core_series(nvml: NvmlApi) -> None:
    exporter = Exporter(nvml, "real-node", proc_root=Path("/proc"), watch_xid=False)
    text = generate_latest(exporter.registry).decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    names = {s.name for s in samples}
    up = [s.value for s in samples if s.name == "kelvin_exporter_nvml_up"]
    assert up == [1.0], exporter.collector.last.errors if exporter.collector.last else None
    for name in (
        "kelvin_gpu_memory_total_bytes",
        "kelvin_gpu_temperature_celsius",
        "kelvin_gpu_power_watts",
        "kelvin_gpu_sm_clock_max_hertz",
        "kelvin_gpu_slowdown_temperature_celsius",
    ):
        assert name in names, name
    total = [s.value for s in samples if s.name == "kelvin_gpu_memory_total_bytes"]
    assert all(v > 8 * 2**30 for v in total)
    # no sentinel values: what NVML does not support is absent, so every value is finite and non-negative
    assert all(s.value >= 0 for s in samples if s.name.startswith("kelvin_gpu_"))
    print(text)


def test_real_node_snapshot(nvml: NvmlApi) -> None:
    from scheduler_plugin.exporter.node import to_gpu_node

    exporter = Exporter(nvml, "real-node", watch_xid=False)
    node = to_gpu_node(exporter.reader.read())
    assert node.gpus and all(g.uuid.startswith(("GPU-", "MIG-")) for g in node.gpus)
    assert all(0 < g.slowdown_celsius < g.shutdown_celsius for g in node.gpus)
    print(node)
