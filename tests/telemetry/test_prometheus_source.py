"""PrometheusSource against a real Prometheus (Debian package) scraping kelvin exporters on the fake NVML backend and
a dcgm-exporter exposition served on loopback. One Prometheus per test session; scrape interval 1 s."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from scheduler_plugin.exporter.app import Exporter
from scheduler_plugin.model import GIB, MIB, GpuNode, ThrottleReason
from scheduler_plugin.nvml.fake import FakeNvml
from scheduler_plugin.telemetry.prometheus import PrometheusSource
from scheduler_plugin.telemetry.source import SourceError, TelemetrySource

pytestmark = pytest.mark.prometheus
DCGM_TEXT = Path(__file__).resolve().parents[1] / "fixtures_local" / "dcgm_exposition.txt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _DcgmHandler(http.server.BaseHTTPRequestHandler):
    body = DCGM_TEXT.read_bytes()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    """Prometheus gives up on a scrape at its 1 s timeout and closes the connection: the handler's write then fails
    with a broken pipe, which socketserver prints as a traceback to whatever ``sys.stderr`` is at that moment (the
    session-scoped lab outlives this module: it was another test's captured output). Dropped connections are a
    scraper's business; any other error is still printed."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


@dataclass
class Lab:
    url: str
    exporters: dict[str, Exporter]
    fakes: dict[str, FakeNvml]


def _wait(what: str, check: Callable[[], bool], tries: int = 120, pause: float = 0.25) -> None:
    for _ in range(tries):
        if check():
            return
        time.sleep(pause)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="session")
def lab(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("prometheus")
    fakes = {
        "node-a": FakeNvml(8, "H100-SXM-80GB", seed=1),
        "node-b": FakeNvml(4, "A100-SXM-80GB", seed=2),
        "node-s": FakeNvml(2, "H200", seed=3),  # stopped by the staleness test
    }
    fakes["node-b"].gpus[3].temperature_celsius = 88
    fakes["node-b"].gpus[3].throttle_reasons = int(ThrottleReason.SW_THERMAL_SLOWDOWN)
    exporters = {name: Exporter(fake, name, proc_root=tmp / "no-proc") for name, fake in fakes.items()}
    ports = {name: exp.start("127.0.0.1", 0) for name, exp in exporters.items()}
    dcgm = _QuietServer(("127.0.0.1", 0), _DcgmHandler)
    threading.Thread(target=dcgm.serve_forever, daemon=True).start()
    targets = ", ".join(f"'127.0.0.1:{p}'" for p in ports.values())
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - {{job_name: kelvin-exporter, honor_labels: true, static_configs: [{{targets: [{targets}]}}]}}\n"
        f"  - {{job_name: dcgm-exporter, static_configs: [{{targets: ['127.0.0.1:{dcgm.server_port}']}}]}}\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            prometheus_bin,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"

    def all_up() -> bool:
        try:
            r = httpx.get(f"{url}/api/v1/query", params={"query": "count(up == 1)"}, timeout=1)
            res = r.json()["data"]["result"]
            # two scrapes done: increase() and timestamps have what they need
            return bool(res) and res[0]["value"][1] == str(len(ports) + 1) and _scrapes(url) >= 2
        except (httpx.HTTPError, KeyError, ValueError):
            return False

    try:
        _wait("Prometheus to scrape every target", all_up)
        # an XID after the first scrapes, so that increase() sees the counter go up
        fakes["node-b"].inject_xid(1, 79)
        _wait(
            "the XID to reach Prometheus", lambda: _has(url, 'increase(kelvin_gpu_xid_errors_total{xid="79"}[1m]) > 0')
        )
        yield Lab(url, exporters, fakes)
    finally:
        proc.terminate()
        proc.wait(10)
        dcgm.shutdown()
        dcgm.server_close()
        for exp in exporters.values():
            exp.stop()


def _has(url: str, query: str) -> bool:
    r = httpx.get(f"{url}/api/v1/query", params={"query": query}, timeout=1)
    return bool(r.json()["data"]["result"])


def _scrapes(url: str) -> int:
    r = httpx.get(f"{url}/api/v1/query", params={"query": "min(count_over_time(up[1m]))"}, timeout=1)
    res = r.json()["data"]["result"]
    return int(float(res[0]["value"][1])) if res else 0


def _by_name(nodes: list[GpuNode]) -> dict[str, GpuNode]:
    return {n.name: n for n in nodes}


async def test_is_a_telemetry_source(lab: Lab) -> None:
    source = PrometheusSource(lab.url)
    assert isinstance(source, TelemetrySource)
    await source.close()


async def test_snapshot_from_kelvin_metrics(lab: Lab) -> None:
    source = PrometheusSource(lab.url, metrics="kelvin")
    try:
        nodes = _by_name(list(await source.fetch()))
    finally:
        await source.close()
    assert {"node-a", "node-b"} <= nodes.keys()
    assert "node-c" not in nodes  # dcgm series are ignored in kelvin mode
    a, b = nodes["node-a"], nodes["node-b"]
    assert [g.index for g in a.gpus] == list(range(8))
    fake_a = lab.fakes["node-a"]
    g0 = a.gpu(0)
    assert g0.uuid == fake_a.gpus[0].uuid and g0.model == "NVIDIA H100 80GB HBM3"
    assert g0.memory_total_bytes == 81559 * MIB
    assert g0.memory_used_bytes == 512 * MIB + 16 * GIB
    assert (g0.slowdown_celsius, g0.shutdown_celsius, g0.sm_clock_max_mhz) == (90.0, 92.0, 1980.0)
    assert g0.utilization == pytest.approx(0.85) and g0.memory_utilization == pytest.approx(0.40)
    assert g0.temperature_celsius == 62 and g0.memory_temperature_celsius == 70
    assert g0.power_watts == pytest.approx(520.0)
    assert g0.nvlink_peers == frozenset(range(1, 8))  # NVSwitch fabric
    assert a.gpu(0).pcie_switch == a.gpu(1).pcie_switch != a.gpu(2).pcie_switch
    assert [g.numa_node for g in a.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert a.gpu(7).processes == () and a.gpu(0).processes[0].used_bytes == 16 * GIB
    hot = b.gpu(3)
    assert hot.model == "NVIDIA A100-SXM4-80GB" and hot.memory_total_bytes == 81920 * MIB
    assert hot.temperature_celsius == 88 and hot.thermally_throttled
    assert b.gpu(1).xid_errors == 1 and b.gpu(0).xid_errors == 0
    now = time.time()
    for node in (a, b):
        assert node.observed_at is not None and 0 <= now - node.observed_at < 60


async def test_snapshot_from_dcgm_metrics(lab: Lab) -> None:
    source = PrometheusSource(lab.url, metrics="dcgm")
    try:
        nodes = _by_name(list(await source.fetch()))
    finally:
        await source.close()
    assert set(nodes) == {"node-c", "node-d"}
    c0, c1 = nodes["node-c"].gpu(0), nodes["node-c"].gpu(1)
    assert c0.uuid == "GPU-3c5f1a2b-8d7e-4f60-a1b2-c3d4e5f60718" and c0.model == "NVIDIA H100 80GB HBM3"
    assert c0.memory_total_bytes == (71380 + 9607 + 572) * MIB
    assert c0.memory_free_bytes == 9607 * MIB
    assert c0.temperature_celsius == 86 and c0.memory_temperature_celsius == 81
    assert c0.throttle_reasons == int(ThrottleReason.SW_THERMAL_SLOWDOWN) and c0.thermally_throttled
    assert c0.utilization == pytest.approx(0.97) and c0.memory_utilization == pytest.approx(0.45)
    assert c0.power_watts == pytest.approx(612.447) and c0.sm_clock_mhz == 1755
    assert c0.xid_errors == 3 and c1.xid_errors == 0
    # dcgm lacks thresholds and the max clock: the H100 defaults fill them
    assert (c0.slowdown_celsius, c0.shutdown_celsius, c0.sm_clock_max_mhz) == (90.0, 92.0, 1980.0)
    assert c0.nvlink_peers == frozenset({1})  # HGX: NVSwitch fabric
    (proc,) = c0.processes
    assert (proc.pod_namespace, proc.pod_name, proc.used_bytes) == ("ml-team", "llm-train-0", 71380 * MIB)
    assert c1.processes == ()
    d0, d1 = nodes["node-d"].gpu(0), nodes["node-d"].gpu(1)  # lowercase hostname, older label and metric names
    assert d1.throttle_reasons == int(ThrottleReason.SW_POWER_CAP) and d0.throttle_reasons == 1
    assert (d1.processes[0].pod_namespace, d1.processes[0].pod_name) == ("research", "bert-ft-7")
    assert d0.processes == () and d1.slowdown_celsius == 89.0 and d1.sm_clock_max_mhz == 1410.0


async def test_auto_mode_reads_both_flavours(lab: Lab) -> None:
    source = PrometheusSource(lab.url)
    try:
        nodes = _by_name(list(await source.fetch()))
    finally:
        await source.close()
    assert {"node-a", "node-b", "node-c", "node-d"} <= nodes.keys()


async def test_model_defaults_can_be_overridden(lab: Lab) -> None:
    from dataclasses import replace

    from scheduler_plugin.model.catalogue import CATALOGUE

    custom = replace(CATALOGUE["H100-SXM-80GB"], slowdown_celsius=84.0)
    source = PrometheusSource(lab.url, metrics="dcgm", model_overrides={"H100-SXM-80GB": custom})
    try:
        nodes = _by_name(list(await source.fetch()))
    finally:
        await source.close()
    assert nodes["node-c"].gpu(0).slowdown_celsius == 84.0
    assert nodes["node-d"].gpu(0).slowdown_celsius == 89.0


async def test_unreachable_prometheus_raises_source_error() -> None:
    source = PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout_s=1)
    with pytest.raises(SourceError, match="unreachable"):
        await source.fetch()
    await source.close()


async def test_prometheus_error_answer_raises_source_error(lab: Lab) -> None:
    source = PrometheusSource(lab.url, metrics="kelvin", xid_window="not-a-duration")
    with pytest.raises(SourceError, match="failed"):
        await source.fetch()
    await source.close()


async def test_stopped_exporter_marks_its_node_stale(lab: Lab) -> None:
    max_age = 2.0
    source = PrometheusSource(lab.url, metrics="kelvin")
    try:
        before = _by_name(list(await source.fetch()))
        assert before["node-s"].age_seconds(time.time()) is not None
        lab.exporters["node-s"].stop()
        stale: dict[str, GpuNode] = {}

        async def node_s_stale() -> bool:
            nonlocal stale
            stale = _by_name(list(await source.fetch()))
            age = stale["node-s"].age_seconds(time.time())
            return age is not None and age > max_age

        for _ in range(60):
            if await node_s_stale():
                break
            time.sleep(0.25)
        else:
            raise AssertionError("node-s never became stale")
    finally:
        await source.close()
    # the stopped node is kept, with its GPUs, at its last observation; the others keep refreshing
    assert len(stale["node-s"].gpus) == 2
    last_seen = stale["node-s"].observed_at
    assert last_seen is not None and last_seen <= (before["node-s"].observed_at or 0) + 2
    assert (stale["node-a"].observed_at or 0) > last_seen


async def test_static_signals_are_cached_until_a_new_gpu_appears() -> None:
    from scheduler_plugin.telemetry.prometheus import KELVIN_QUERIES, KELVIN_STATIC

    now = time.time()
    gpus = [("n1", "0")]
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        asked.append(query)
        key = next(k for k, q in KELVIN_QUERIES.items() if q.replace("{xid_window}", "10m") == query)
        result = (
            [
                {
                    "metric": {"node": n, "gpu": g, "uuid": f"GPU-{n}-{g}", "model": "NVIDIA H100 80GB HBM3"},
                    "value": [now, "1" if key != "seen" else str(now)],
                }
                for n, g in gpus
            ]
            if key not in ("nvlink", "topology", "procs")
            else []
        )
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    source = PrometheusSource("http://prom", metrics="kelvin", transport=httpx.MockTransport(answer))
    try:
        assert [n.name for n in await source.fetch()] == ["n1"]
        assert len(asked) == len(KELVIN_QUERIES)
        asked.clear()
        await source.fetch()
        assert len(asked) == len(KELVIN_QUERIES) - len(KELVIN_STATIC)
        asked.clear()
        gpus.append(("n2", "0"))  # a new node: its identity is read at once
        nodes = await source.fetch()
        assert [n.name for n in nodes] == ["n1", "n2"] and nodes[1].gpus[0].uuid == "GPU-n2-0"
        assert len(asked) == len(KELVIN_QUERIES)
    finally:
        await source.close()


async def test_a_missing_temperature_is_unknown_not_cool(caplog: pytest.LogCaptureFixture) -> None:
    """No temperature series for n1's GPU: NaN (warned once), and the thermal score gives it no headroom, where
    reading it as 0 °C made it the coolest GPU of the fleet."""
    import math

    import numpy as np

    from scheduler_plugin.model import GpuRequest, build_arrays
    from scheduler_plugin.policies.base import CycleContext
    from scheduler_plugin.policies.thermal import ThermalArgs, ThermalScore
    from scheduler_plugin.telemetry.prometheus import KELVIN_QUERIES

    now = time.time()

    def answer(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        key = next(k for k, q in KELVIN_QUERIES.items() if q.replace("{xid_window}", "10m") == query)
        values = {"seen": str(now), "temp": "50", "total": str(80 * GIB), "slowdown": "87", "shutdown": "92"}
        result = [
            {
                "metric": {"node": n, "gpu": "0", "uuid": f"GPU-{n}", "model": "NVIDIA H100 80GB HBM3"},
                "value": [now, values.get(key, "0")],
            }
            for n in ("n1", "n2")
            if key not in ("nvlink", "topology", "procs") and not (key == "temp" and n == "n1")
        ]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    source = PrometheusSource("http://prom", metrics="kelvin", transport=httpx.MockTransport(answer))
    try:
        with caplog.at_level("WARNING", logger="scheduler_plugin.telemetry.prometheus"):
            nodes = _by_name(await source.fetch())
            await source.fetch()
    finally:
        await source.close()
    assert math.isnan(nodes["n1"].gpus[0].temperature_celsius)
    assert nodes["n2"].gpus[0].temperature_celsius == 50
    warned = [r.getMessage() for r in caplog.records if "no temperature series" in r.getMessage()]
    assert len(warned) == 1 and "node n1 GPU 0" in warned[0] and "kelvin_gpu_temperature_celsius" in warned[0]
    fleet = build_arrays([nodes["n1"], nodes["n2"]])
    raw = ThermalScore(ThermalArgs()).score(GpuRequest(count=1), fleet, np.arange(2), CycleContext(now=now))
    assert raw[0] == 0.0 and raw[1] > 0.5


async def test_dcgm_series_scraped_twice_count_once() -> None:
    from scheduler_plugin.telemetry.prometheus import DCGM_QUERIES

    now = time.time()
    base = {"Hostname": "n1", "gpu": "0", "UUID": "GPU-1", "modelName": "NVIDIA H100 80GB HBM3"}
    per_key = {
        "fb_used": ({**base, "pod": "train-0", "namespace": "ml"}, "1024"),
        "fb_free": (base, "80000"),
        "seen": (base, str(now)),
        "temp": (base, "60"),
        "xid": ({**base, "xid": "79"}, "1"),
    }

    def answer(request: httpx.Request) -> httpx.Response:
        key = next(k for k, q in DCGM_QUERIES.items() if q == request.url.params["query"])
        result = []
        if key in per_key:
            labels, value = per_key[key]
            # two scrape jobs on the same exporter: the same series with another instance/job label
            result = [
                {"metric": {**labels, "instance": i, "job": j}, "value": [now, value]}
                for i, j in (("a", "x"), ("b", "y"))
            ]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    source = PrometheusSource("http://prom", metrics="dcgm", transport=httpx.MockTransport(answer))
    try:
        (node,) = await source.fetch()
    finally:
        await source.close()
    gpu = node.gpu(0)
    assert gpu.xid_errors == 1 and len(gpu.processes) == 1 and gpu.processes[0].pod_name == "train-0"


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"status": "success", "data": [1]}, "data is not an object"),
        ({"status": "success", "data": {"resultType": "vector", "result": {"a": 1}}}, "data.result is not a list"),
        (
            {"status": "success", "data": {"resultType": "vector", "result": [{"metric": "x", "value": [0, "1"]}]}},
            "a sample's metric is not a label map",
        ),
    ],
)
async def test_a_malformed_answer_names_the_query(doc: dict[str, object], words: str) -> None:
    source = PrometheusSource(
        "http://prom", metrics="kelvin", transport=httpx.MockTransport(lambda r: httpx.Response(200, json=doc))
    )
    try:
        with pytest.raises(SourceError, match=f"prometheus query '.*': {words}"):
            await source.fetch()
    finally:
        await source.close()


async def test_a_gpu_without_memory_total_is_named_once_and_not_requeried(caplog: pytest.LogCaptureFixture) -> None:
    from scheduler_plugin.telemetry.prometheus import KELVIN_QUERIES, KELVIN_STATIC

    now = time.time()
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        asked.append(query)
        key = next(k for k, q in KELVIN_QUERIES.items() if q.replace("{xid_window}", "10m") == query)
        result = [
            {"metric": {"node": n, "gpu": "0", "uuid": f"GPU-{n}", "model": "NVIDIA H100 80GB HBM3"}, "value": [now, v]}
            for n in ("n1", "n2")
            if key not in ("nvlink", "topology", "procs") and not (key == "total" and n == "n2")
            for v in [str(now) if key == "seen" else "1"]
        ]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    source = PrometheusSource("http://prom", metrics="kelvin", transport=httpx.MockTransport(answer))
    try:
        with caplog.at_level("WARNING", logger="scheduler_plugin.telemetry.prometheus"):
            for i in range(4):
                asked.clear()
                nodes = await source.fetch()
                assert [n.name for n in nodes] == ["n1"]
                assert len(asked) == len(KELVIN_QUERIES) - (len(KELVIN_STATIC) if i else 0)
    finally:
        await source.close()
    warned = [r.getMessage() for r in caplog.records if "kelvin_gpu_memory_total_bytes is missing" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("node n2 GPU 0")
