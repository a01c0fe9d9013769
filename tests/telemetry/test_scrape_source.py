"""ScrapeSource over real HTTP: a loopback stand-in for the API server's EndpointSlice list, and kelvin exporters
on the fake NVML backend."""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from scheduler_plugin.exporter.app import Exporter
from scheduler_plugin.kubeapi import KubeClient, KubeConfig
from scheduler_plugin.nvml.fake import FakeNvml
from scheduler_plugin.telemetry.scrape import ScrapeSource, targets_from_slices
from scheduler_plugin.telemetry.source import SourceError, TelemetrySource

SLICES_PATH = "/apis/discovery.k8s.io/v1/namespaces/kelvin-system/endpointslices"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def endpoint_slice(name: str, port: int, endpoints: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": "kelvin-system",
            "labels": {"kubernetes.io/service-name": "kelvin-exporter"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "metrics", "port": port, "protocol": "TCP"}],
        "endpoints": endpoints,
    }


def endpoint(ip: str, node: str, ready: bool = True) -> dict[str, Any]:
    return {
        "addresses": [ip],
        "conditions": {"ready": ready, "serving": ready, "terminating": False},
        "nodeName": node,
        "targetRef": {"kind": "Pod", "namespace": "kelvin-system", "name": f"exp-{node}"},
    }


class FakeApi:
    """Serves one EndpointSliceList (or an error status) for the kelvin-exporter service."""

    def __init__(self) -> None:
        self.slices: list[dict[str, Any]] = []
        self.status = 200
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                selector = parse_qs(url.query).get("labelSelector", [""])[0]
                if api.status != 200:
                    code, body = api.status, {"kind": "Status", "message": "endpointslices is forbidden", "code": 403}
                elif url.path == SLICES_PATH and selector == "kubernetes.io/service-name=kelvin-exporter":
                    code, body = (
                        200,
                        {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1", "items": api.slices},
                    )
                else:
                    code, body = 404, {"kind": "Status", "message": f"unexpected {self.path}", "code": 404}
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"


@pytest.fixture
def api() -> Iterator[FakeApi]:
    fake = FakeApi()
    yield fake
    fake.server.shutdown()


@pytest.fixture
def exporters(tmp_path: Path) -> Iterator[dict[str, tuple[Exporter, int]]]:
    out = {}
    for i, name in enumerate(["gpu-1", "gpu-2"]):
        exp = Exporter(FakeNvml(4, "A100-SXM-80GB", seed=i), name, proc_root=tmp_path, watch_xid=False)
        out[name] = (exp, exp.start("127.0.0.1", 0))
    yield out
    for exp, _ in out.values():
        exp.stop()


def source_for(api: FakeApi) -> ScrapeSource:
    return ScrapeSource(KubeClient(KubeConfig.load(server=api.url)), timeout_s=2)


async def test_scrapes_every_exporter_of_the_service(api: FakeApi, exporters: dict[str, tuple[Exporter, int]]) -> None:
    dead_port = free_port()
    api.slices = [
        endpoint_slice(f"kelvin-exporter-{n}", port, [endpoint("127.0.0.1", n)]) for n, (_, port) in exporters.items()
    ]
    api.slices.append(endpoint_slice("kelvin-exporter-x", dead_port, [endpoint("127.0.0.1", "gpu-never", False)]))
    source = source_for(api)
    assert isinstance(source, TelemetrySource)
    try:
        nodes = {n.name: n for n in await source.fetch()}
    finally:
        await source.close()
    assert set(nodes) == {"gpu-1", "gpu-2"}  # the dead exporter's node was never seen: nothing to report
    assert [g.model for g in nodes["gpu-1"].gpus] == ["NVIDIA A100-SXM4-80GB"] * 4
    assert nodes["gpu-1"].gpu(0).uuid != nodes["gpu-2"].gpu(0).uuid
    assert len(source.failed_targets) == 1 and str(dead_port) in source.failed_targets[0]


async def test_unreachable_exporter_leaves_its_node_stale(
    api: FakeApi, exporters: dict[str, tuple[Exporter, int]]
) -> None:
    api.slices = [endpoint_slice(f"s-{n}", port, [endpoint("127.0.0.1", n)]) for n, (_, port) in exporters.items()]
    source = source_for(api)
    try:
        first = {n.name: n for n in await source.fetch()}
        exporters["gpu-2"][0].stop()
        time.sleep(0.05)
        second = {n.name: n for n in await source.fetch()}
    finally:
        await source.close()
    assert second["gpu-2"].observed_at == first["gpu-2"].observed_at  # kept, with its old observation time
    assert (second["gpu-1"].observed_at or 0) > (first["gpu-1"].observed_at or 0)
    assert len(source.failed_targets) == 1


async def test_api_error_fails_the_refresh(api: FakeApi) -> None:
    api.status = 403
    source = source_for(api)
    with pytest.raises(SourceError, match=r"kelvin-system/kelvin-exporter.*403"):
        await source.fetch()
    await source.close()


def test_targets_from_slices() -> None:
    slices = {
        "items": [
            {
                "ports": [{"name": "metrics", "port": 9400}, {"name": "debug", "port": 6060}],
                "endpoints": [
                    endpoint("10.0.0.5", "a"),
                    {"addresses": ["10.0.0.6"], "conditions": {"terminating": True}, "nodeName": "b"},
                ],
            },
            {
                "addressType": "IPv6",
                "ports": [{"name": "http", "port": 9401}],
                "endpoints": [{"addresses": ["fd00::7"], "conditions": {"ready": True}, "nodeName": "c"}],
            },
            {"ports": None, "endpoints": [{"addresses": ["10.0.0.8"], "conditions": {}}]},
        ]
    }
    targets = targets_from_slices(slices, default_port=9400)
    assert [(t.url, t.node) for t in targets] == [
        ("http://10.0.0.5:9400", "a"),
        ("http://[fd00::7]:9401", "c"),
        ("http://10.0.0.8:9400", None),
    ]


async def test_a_gpu_the_exporter_could_not_read_is_logged_by_name(
    api: FakeApi, exporters: dict[str, tuple[Exporter, int]], caplog: pytest.LogCaptureFixture
) -> None:
    import pynvml

    exp, port = exporters["gpu-1"]
    exp.nvml.set_error("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=2)  # type: ignore[attr-defined]
    api.slices = [endpoint_slice("kelvin-exporter-1", port, [endpoint("127.0.0.1", "gpu-1")])]
    source = source_for(api)
    try:
        with caplog.at_level("WARNING", logger="scheduler_plugin.telemetry.scrape"):
            (node,) = await source.fetch()
    finally:
        await source.close()
    assert [g.index for g in node.gpus] == [0, 1, 3]
    assert any("node gpu-1" in r.getMessage() and "gpu 2: GPU is lost" in r.getMessage() for r in caplog.records)


class FakeExporter:
    """Serves one ``/v1/node`` document, optionally one byte every ``trickle_s``."""

    def __init__(self, doc: dict[str, Any], trickle_s: float = 0.0) -> None:
        body = json.dumps(doc).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    for i in range(0, len(body), 1 if trickle_s else len(body)):
                        self.wfile.write(body[i : i + (1 if trickle_s else len(body))])
                        self.wfile.flush()
                        time.sleep(trickle_s)
                except OSError:
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_port

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def node_doc(name: str, observed_at: float, totals: tuple[int, ...] = (80 << 30, 80 << 30)) -> dict[str, Any]:
    from scheduler_plugin.model import GpuInfo, GpuNode
    from scheduler_plugin.model.serde import node_to_json

    gpus = tuple(
        GpuInfo(index=i, uuid=f"GPU-{name}-{i}", model="NVIDIA H100 80GB HBM3", memory_total_bytes=80 << 30)
        for i in range(len(totals))
    )
    doc: dict[str, Any] = json.loads(node_to_json(GpuNode(name=name, gpus=gpus, observed_at=observed_at)))
    for gpu, total in zip(doc["gpus"], totals, strict=True):
        gpu["memory_total_bytes"] = total  # JSON integers: 10**30 is a valid one
    return doc


async def test_an_implausible_gpu_is_left_out_and_the_fleet_keeps_refreshing(
    api: FakeApi, caplog: pytest.LogCaptureFixture
) -> None:
    """A memory total of 10**30 bytes used to pass validation and fail every refresh in the cache (OverflowError in
    the int64 columns, naming nothing); now that GPU is left out, named once, and counted."""
    from prometheus_client import CollectorRegistry

    from scheduler_plugin.telemetry.cache import SnapshotCache, TelemetryMetrics

    now = time.time()
    fakes = [FakeExporter(node_doc("bad", now, (10**30, 80 << 30))), FakeExporter(node_doc("good", now))]
    api.slices = [endpoint_slice(f"s{i}", f.port, [endpoint("127.0.0.1", f"n{i}")]) for i, f in enumerate(fakes)]
    source = source_for(api)
    registry = CollectorRegistry()
    cache = SnapshotCache(source, metrics=TelemetryMetrics(registry, "scrape"))
    try:
        with caplog.at_level("WARNING", logger="scheduler_plugin.telemetry.scrape"):
            assert await cache.refresh_once(), cache.last_error
            assert await cache.refresh_once(), cache.last_error
    finally:
        await source.close()
        for f in fakes:
            f.stop()
    nodes = {n.name: n for n in cache.snapshot.nodes}
    assert [g.index for g in nodes["bad"].gpus] == [1] and len(nodes["good"].gpus) == 2
    warned = [r.getMessage() for r in caplog.records if "is left out" in r.getMessage()]
    assert len(warned) == 1 and f"memory_total_bytes {10**30}" in warned[0] and "(node bad) GPU 0" in warned[0]
    assert (
        registry.get_sample_value("kelvin_telemetry_bad_samples_total", {"source": "scrape", "reason": "out_of_range"})
        == 2
    )


async def test_a_trickling_exporter_is_cut_off_at_the_timeout(api: FakeApi) -> None:
    now = time.time()
    fakes = [FakeExporter(node_doc("slow", now), trickle_s=0.5), FakeExporter(node_doc("good", now))]
    api.slices = [endpoint_slice(f"s{i}", f.port, [endpoint("127.0.0.1", f"n{i}")]) for i, f in enumerate(fakes)]
    source = source_for(api)  # timeout 2 s
    try:
        started = time.perf_counter()
        nodes = await asyncio.wait_for(source.fetch(), 15)
        took = time.perf_counter() - started
    finally:
        await source.close()
        for f in fakes:
            f.stop()
    assert [n.name for n in nodes] == ["good"] and took < 2.0 + 1.0
    assert len(source.failed_targets) == 1 and "no whole answer within 2 s" in source.failed_targets[0]


async def test_an_exporter_clock_ahead_is_clamped(api: FakeApi) -> None:
    fake = FakeExporter(node_doc("ahead", time.time() + 86400))
    api.slices = [endpoint_slice("s", fake.port, [endpoint("127.0.0.1", "ahead")])]
    source = source_for(api)
    try:
        before = time.time()
        (node,) = await source.fetch()
    finally:
        await source.close()
        fake.stop()
    assert node.observed_at is not None and before <= node.observed_at <= time.time()
    assert source.bad_samples["future_timestamp"] == 1
