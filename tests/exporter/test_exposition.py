"""The /metrics body (cached hardware-only part + fresh workload part) against prometheus_client's uncached rendering.

Both are parsed with prometheus_client's own parsers; equality is on (name, labels, value) of every sample.
"""

from __future__ import annotations

import gzip
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as om_generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families

from scheduler_plugin.exporter.app import Exporter
from scheduler_plugin.exporter.exposition import ScrapeRenderer
from scheduler_plugin.exporter.metrics import (
    CACHED_PARTS,
    dynamic_families,
    families,
    hardware_families,
    hardware_key,
)
from scheduler_plugin.model import ThrottleReason
from scheduler_plugin.nvml.fake import FakeNvml, write_proc

OPENMETRICS = "application/openmetrics-text;version=1.0.0;escaping=underscores;q=0.5,text/plain;version=0.0.4;q=0.3"
Row = tuple[str, tuple[tuple[str, str], ...], float | None]
#: Samples whose value moves with wall time even on a non-varying fake: compared by name and labels only.
TIMED = {"kelvin_exporter_collect_duration_seconds", "kelvin_gpu_energy_joules_total", "kelvin_gpu_energy_joules"}


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml(8, "H100-SXM-80GB", seed=4)


@pytest.fixture
def exporter(fake: FakeNvml, tmp_path: Path) -> Exporter:
    write_proc(fake, tmp_path / "proc", tmp_path / "pods")
    return Exporter(fake, "gpu-node-1", proc_root=tmp_path / "proc", pods_dir=tmp_path / "pods", watch_xid=False)


def get(exporter: Exporter, **headers: str) -> tuple[bytes, dict[str, str]]:
    got: dict[str, str] = {}

    def start_response(status: str, hdrs: list[tuple[str, str]]) -> None:
        assert status == "200 OK"
        got.update(hdrs)

    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "", **headers}
    return b"".join(exporter(environ, start_response)), got


def rows(text: str, *, openmetrics: bool = False) -> list[Row]:
    fams = list((om_parse if openmetrics else text_string_to_metric_families)(text))
    names = [f.name for f in fams]
    assert len(names) == len(set(names)), "a family appears twice"
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), None if s.name in TIMED else s.value) for f in fams for s in f.samples
    )


def test_served_text_equals_the_uncached_rendering(exporter: Exporter) -> None:
    body, headers = get(exporter)
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert int(headers["Content-Length"]) == len(body)
    served = rows(body.decode())
    assert len(served) > 500
    assert served == rows(generate_latest(exporter.registry).decode())


def test_served_openmetrics_equals_the_uncached_rendering_and_ends_once(exporter: Exporter) -> None:
    for _ in range(2):  # the second body's static part comes from the cache
        body, headers = get(exporter, HTTP_ACCEPT=OPENMETRICS)
        assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        text = body.decode()
        assert text.endswith("# EOF\n") and text.count("# EOF") == 1
        uncached = om_generate_latest(exporter.registry).decode()  # type: ignore[no-untyped-call]
        assert rows(text, openmetrics=True) == rows(uncached, openmetrics=True)
    assert exporter.renderer.renders["hardware"] == 1


def test_gzip_when_accepted(exporter: Exporter) -> None:
    body, headers = get(exporter, HTTP_ACCEPT_ENCODING="gzip")
    assert headers["Content-Encoding"] == "gzip"
    assert rows(gzip.decompress(body).decode()) == rows(get(exporter)[0].decode())


def test_static_part_is_cached_until_the_hardware_changes(exporter: Exporter, fake: FakeNvml) -> None:
    get(exporter)
    get(exporter)
    assert exporter.renderer.renders["hardware"] == 1
    fake.gpus[1].nvlink_down = {4}
    up = [r for r in rows(get(exporter)[0].decode()) if r[0] == "kelvin_gpu_nvlink_link_up"]
    assert exporter.renderer.renders["hardware"] == 2
    assert ("kelvin_gpu_nvlink_link_up", _labels(gpu="1", link="4"), 0.0) in [(n, _pick(lb), v) for n, lb, v in up]
    fake.gpus[0].mig_enabled, fake.gpus[0].mig_devices = True, 2
    served = rows(get(exporter)[0].decode())
    assert exporter.renderer.renders["hardware"] == 3
    assert [v for n, lb, v in served if n == "kelvin_gpu_mig_mode" and ("gpu", "0") in lb] == [1.0]


def test_lost_gpu_and_driver_down_are_not_served_from_the_cache(exporter: Exporter, fake: FakeNvml) -> None:
    get(exporter)
    fake.lose_gpu(3)
    served = rows(get(exporter)[0].decode())
    assert ("kelvin_exporter_nvml_up", (), 0.0) in served
    assert not [r for r in served if r[0] == "kelvin_gpu_info" and ("gpu", "3") in r[1]]
    assert len([r for r in served if r[0] == "kelvin_gpu_info"]) == 7
    fake.driver_down()
    served = rows(get(exporter)[0].decode())
    assert served == [("kelvin_exporter_collect_duration_seconds", (), None), ("kelvin_exporter_nvml_up", (), 0.0)]
    fake.driver_up()
    fake.restore_gpu(3)
    served = rows(get(exporter)[0].decode())
    assert ("kelvin_exporter_nvml_up", (), 1.0) in served
    assert len([r for r in served if r[0] == "kelvin_gpu_info"]) == 8


def test_name_filter_keeps_the_named_families(exporter: Exporter) -> None:
    body, _ = get(exporter, QUERY_STRING="name[]=kelvin_exporter_nvml_up&name%5B%5D=kelvin_gpu_energy_joules_total")
    names = [f.name for f in text_string_to_metric_families(body.decode())]
    assert sorted(names) == ["kelvin_exporter_nvml_up", "kelvin_gpu_energy_joules"]


def test_throttle_part_follows_the_reason_bitmask(exporter: Exporter, fake: FakeNvml) -> None:
    get(exporter)
    get(exporter)
    assert exporter.renderer.renders["throttle"] == 1
    fake.gpus[2].throttle_reasons = int(ThrottleReason.SW_POWER_CAP | ThrottleReason.HW_SLOWDOWN)
    served = rows(get(exporter)[0].decode())
    assert exporter.renderer.renders["throttle"] == 2
    active = {
        dict(lb)["reason"]
        for n, lb, v in served
        if n == "kelvin_gpu_clocks_event_reason_active" and dict(lb)["gpu"] == "2" and v == 1.0
    }
    assert active == {"sw_power_cap", "hw_slowdown"}
    assert ("kelvin_gpu_clocks_event_reasons", 12.0) in [(n, v) for n, lb, v in served if dict(lb).get("gpu") == "2"]


def test_xid_part_follows_the_counts(exporter: Exporter) -> None:
    reading = exporter.collector.read()
    renderer = ScrapeRenderer()
    renderer.render(reading)
    renderer.render(reading)
    assert renderer.renders["xid"] == 1
    body, _ = renderer.render(replace(reading, xid_counts={(3, 79): 2, (5, 48): 1, (5, 999): 1}))
    assert renderer.renders["xid"] == 2
    xids = {(dict(lb)["gpu"], dict(lb)["xid"]): v for n, lb, v in rows(body.decode()) if n.startswith("kelvin_gpu_xid")}
    assert xids[("3", "79")] == 2.0 and xids[("5", "48")] == 1.0 and xids[("5", "999")] == 1.0
    assert xids[("0", "79")] == 0.0 and ("0", "999") not in xids


def test_the_parts_split_the_families_and_each_key_covers_its_part() -> None:
    exporter = Exporter(FakeNvml(4, "H200", seed=2, vary=True), "n", watch_xid=False)
    first, second = exporter.collector.read(), exporter.collector.read()
    names = [[f.name for f in part.families(first)] for part in CACHED_PARTS] + [
        [f.name for f in dynamic_families(first)]
    ]
    flat = [n for part in names for n in part]
    assert len(flat) == len(set(flat)) and sorted(flat) == sorted(f.name for f in families(first))
    # the workload moved (vary=True) but the hardware did not: same key, same hardware samples
    assert hardware_key(first) == hardware_key(second)
    assert [f.samples for f in hardware_families(first)] == [f.samples for f in hardware_families(second)]


def _labels(**kv: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(kv.items()))


def _pick(labels: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in labels if k in ("gpu", "link"))
