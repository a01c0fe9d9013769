"""The exporter over real HTTP on loopback: /metrics, /v1/node, /healthz, and the JSON model helpers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from scheduler_plugin.exporter.app import Exporter
from scheduler_plugin.model import GpuAssignment, GpuInfo, GpuNode, GpuProcess
from scheduler_plugin.model.serde import ModelJSONError, node_from_json, node_to_json, nodes_from_json, nodes_to_json
from scheduler_plugin.nvml.fake import FakeNvml, write_proc


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, FakeNvml]]:
    fake = FakeNvml(8, "H200", seed=9)
    write_proc(fake, tmp_path / "proc", tmp_path / "pods")
    exporter = Exporter(fake, "h200-node", proc_root=tmp_path / "proc", pods_dir=tmp_path / "pods")
    port = exporter.start("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}", fake
    finally:
        exporter.stop()


def test_metrics_endpoint_parses_with_prometheus_client(served: tuple[str, FakeNvml]) -> None:
    url, _ = served
    r = httpx.get(f"{url}/metrics", timeout=5)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert fams["kelvin_gpu_energy_joules"].type == "counter"
    assert fams["kelvin_gpu_temperature_celsius"].type == "gauge"
    assert len(fams["kelvin_gpu_memory_total_bytes"].samples) == 8


def test_v1_node_is_the_shared_model(served: tuple[str, FakeNvml]) -> None:
    url, fake = served
    r = httpx.get(f"{url}/v1/node", timeout=5)
    assert r.status_code == 200
    node = node_from_json(r.content)
    assert node.name == "h200-node" and len(node.gpus) == 8 and node.observed_at is not None
    g0 = node.gpu(0)
    assert g0.uuid == fake.gpus[0].uuid and g0.model == "NVIDIA H200"
    assert g0.memory_total_bytes == 143771 * 2**20 and g0.slowdown_celsius == 90.0
    assert g0.nvlink_peers == frozenset(range(1, 8))
    assert g0.pcie_switch == node.gpu(1).pcie_switch != node.gpu(2).pcie_switch
    (proc,) = g0.processes
    assert (proc.pod_namespace, proc.pod_name) == ("ml-team", "train-9-0") and proc.pod_uid
    assert node.gpu(7).processes == () and node.gpu(7).utilization == 0.0


def test_v1_node_is_503_while_nvml_is_down(served: tuple[str, FakeNvml]) -> None:
    url, fake = served
    fake.driver_down()
    r = httpx.get(f"{url}/v1/node", timeout=5)
    assert r.status_code == 503 and "Driver Not Loaded" in r.json()["error"]
    health = httpx.get(f"{url}/healthz", timeout=5)
    assert health.status_code == 200 and health.json()["node"] == "h200-node"


def test_unknown_path_and_method(served: tuple[str, FakeNvml]) -> None:
    url, _ = served
    assert httpx.get(f"{url}/nope", timeout=5).status_code == 404
    assert httpx.post(f"{url}/metrics", timeout=5).status_code == 405


def test_serde_round_trip() -> None:
    node = GpuNode(
        name="n1",
        gpus=(
            GpuInfo(
                index=0,
                uuid="GPU-a",
                model="NVIDIA H100 80GB HBM3",
                memory_total_bytes=80 * 2**30,
                nvlink_peers=frozenset({1}),
                processes=(GpuProcess(12, 2**30, "uid", "ns", "p"),),
            ),
            GpuInfo(
                index=1,
                uuid="GPU-b",
                model="NVIDIA H100 80GB HBM3",
                memory_total_bytes=80 * 2**30,
                power_watts=None,
                nvlink_peers=frozenset({0}),
            ),
        ),
        assignments=(GpuAssignment("ns/p", (0,), 500, 2**30, "uid"),),
        labels={"kelvin.dev/pool": "a"},
        observed_at=123.5,
    )
    assert node_from_json(node_to_json(node)) == node
    assert nodes_from_json(nodes_to_json([node, node])) == [node, node]


def test_serde_names_the_bad_field() -> None:
    with pytest.raises(ModelJSONError, match=r"gpus\.0\.memory_total_bytes"):
        node_from_json(b'{"name": "n", "gpus": [{"index": 0, "uuid": "u", "model": "m", "memory_total_bytes": "x"}]}')
    with pytest.raises(ModelJSONError, match="name"):
        node_from_json(b'{"gpus": []}')
    with pytest.raises(ModelJSONError):
        node_from_json(b"not json")


def test_v1_node_keeps_an_unknown_temperature_unknown(served: tuple[str, FakeNvml]) -> None:
    import math

    import pynvml

    url, fake = served
    fake.set_error("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=1)
    node = node_from_json(httpx.get(f"{url}/v1/node", timeout=5).content)
    assert math.isnan(node.gpu(1).temperature_celsius)  # not 0 °C, the coolest GPU of the fleet
    assert not math.isnan(node.gpu(0).temperature_celsius)


def test_v1_node_names_the_gpus_it_could_not_read(served: tuple[str, FakeNvml]) -> None:
    import pynvml

    from scheduler_plugin.model.serde import GPU_ERRORS_HEADER

    url, fake = served
    fake.set_error("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=1)
    r = httpx.get(f"{url}/v1/node", timeout=5)
    assert r.status_code == 200
    node = node_from_json(r.content)
    assert [g.index for g in node.gpus] == [0, 2, 3, 4, 5, 6, 7]
    assert r.headers[GPU_ERRORS_HEADER].startswith("gpu 1: ") and "lost" in r.headers[GPU_ERRORS_HEADER]


def test_two_nvlink_islands_are_two_groups_in_v1_node_and_metrics(tmp_path: Path) -> None:
    """``nvlink_islands=2``: GPUs 0-3 and 4-7 linked directly within their island, none across, no NVSwitch."""
    fake = FakeNvml(8, "H100-SXM-80GB", seed=3, nvlink_islands=2)
    exporter = Exporter(fake, "islands", proc_root=tmp_path / "proc", pods_dir=tmp_path / "pods", watch_xid=False)
    port = exporter.start("127.0.0.1", 0)
    try:
        node = node_from_json(httpx.get(f"http://127.0.0.1:{port}/v1/node", timeout=5).content)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        exporter.stop()
    for g in node.gpus:
        island = set(range(0, 4)) if g.index < 4 else set(range(4, 8))
        assert g.nvlink_peers == frozenset(island - {g.index}), g.index
    peers = {
        (s.labels["gpu"], s.labels["peer_gpu"])
        for f in text_string_to_metric_families(text)
        if f.name == "kelvin_gpu_nvlink_link_up"
        for s in f.samples
    }
    assert ("0", "3") in peers and ("5", "4") in peers
    assert not any(p == "nvswitch" or (int(g) < 4) != (int(p) < 4) for g, p in peers), peers


@pytest.mark.parametrize(
    ("gpus", "islands", "model", "words"),
    [(8, 3, "H100-SXM-80GB", "equal islands"), (8, 0, "H100-SXM-80GB", "at least 1"),
     (8, 2, "H100-PCIE-80GB", "has no NVLink")],
)  # fmt: skip
def test_bad_nvlink_islands_name_the_problem(gpus: int, islands: int, model: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        FakeNvml(gpus, model, nvlink_islands=islands)
