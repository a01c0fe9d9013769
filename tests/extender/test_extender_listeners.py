"""Two listeners (issue 10, item 7): the verbs on loopback, /healthz /readyz /metrics on the metrics port, in one
process; a port clash or a port in use stops startup naming the settings."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from ext_helpers import args, make_extender, pod
from typer.testing import CliRunner

from scheduler_plugin.cli import app
from scheduler_plugin.extender.app import StartupError
from scheduler_plugin.extender.server import ExtenderServers, listen
from scheduler_plugin.extender.service import Extender
from scheduler_plugin.settings import ConfigError, Settings, is_loopback, load_settings


def test_defaults_keep_the_verbs_on_loopback() -> None:
    s = Settings()
    assert (s.host, s.port) == ("127.0.0.1", 8888)
    assert (s.metrics_host, s.metrics_port) == ("0.0.0.0", 8889)
    assert is_loopback(s.host) and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback(s.metrics_host) and not is_loopback("10.0.0.7")


@pytest.mark.parametrize(
    ("host", "metrics_host"),
    [("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "127.0.0.1"), ("127.0.0.1", "0.0.0.0"), ("10.1.2.3", "::")],
)
def test_the_metrics_port_on_the_verbs_port_is_refused(host: str, metrics_host: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(host=host, port=9000, metrics_host=metrics_host, metrics_port=9000)
    assert "metrics_port (KELVIN_METRICS_PORT) 9000 is also port (KELVIN_PORT)" in str(err.value)


def test_same_port_on_two_distinct_addresses_and_a_disabled_metrics_port_are_fine() -> None:
    assert load_settings(host="127.0.0.1", port=9000, metrics_host="10.1.2.3", metrics_port=9000).port == 9000
    assert load_settings(port=9000, metrics_port=0).metrics_port == 0


def test_the_cli_refuses_the_clash_naming_both_settings() -> None:
    result = CliRunner().invoke(app, ["extender", "--port", "9100", "--metrics-port", "9100"])
    assert result.exit_code == 2
    assert "metrics_port (KELVIN_METRICS_PORT) 9100 is also port (KELVIN_PORT)" in result.output


def test_a_port_in_use_is_named() -> None:
    ext = make_extender()[0]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        settings = Settings(port=0, metrics_host="127.0.0.1", metrics_port=port)
        with pytest.raises(StartupError) as err:
            ExtenderServers(ext, settings)
    assert f"(KELVIN_METRICS_HOST, KELVIN_METRICS_PORT): cannot listen on 127.0.0.1:{port}: Address" in str(err.value)


def _loopback() -> socket.socket:
    return listen("127.0.0.1", 0, "test")


@pytest.fixture
def extender() -> Extender:
    return make_extender()[0]


@pytest.fixture
def servers(extender: Extender) -> Iterator[ExtenderServers]:
    ext = extender
    srv = ExtenderServers(ext, ext.settings, log_level="warning", sockets=(_loopback(), _loopback()))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert th.is_alive() and time.monotonic() < deadline, "the servers did not start"
        time.sleep(0.01)
    yield srv
    srv.request_stop()
    th.join(timeout=10)
    assert not th.is_alive()


def test_the_verbs_are_not_served_on_the_metrics_port(servers: ExtenderServers) -> None:
    assert servers.metrics_url is not None
    with httpx.Client(base_url=servers.metrics_url, timeout=10) as m:
        for verb in ("filter", "prioritize", "bind", "explain", "scheduler/filter", "scheduler/bind"):
            assert m.post(f"/{verb}", content=args(pod("p1"))).status_code == 404, verb
        assert "kelvin_extender_request_duration_seconds_bucket" in m.get("/metrics").text
        assert m.get("/healthz").json() == {"status": "ok"}
        assert m.get("/readyz").status_code == 200


def test_the_verbs_port_serves_the_verbs_and_healthz_but_not_metrics(servers: ExtenderServers) -> None:
    assert servers.verbs_url.startswith("http://127.0.0.1:")
    with httpx.Client(base_url=servers.verbs_url, timeout=10) as v:
        f = v.post("/scheduler/filter", content=args(pod("p1"))).json()
        assert f["NodeNames"] == ["gpu-node-1", "gpu-node-2"]
        assert v.get("/healthz").status_code == 200
        assert v.get("/metrics").status_code == 404
        assert v.get("/readyz").status_code == 404
    assert servers.metrics_url is not None
    text = httpx.get(servers.metrics_url + "/metrics", timeout=10).text
    assert 'kelvin_extender_requests_total{code="200",verb="filter"} 1.0' in text  # one Extender, shared


def test_metrics_port_0_serves_everything_on_the_verbs_port() -> None:
    ext = make_extender()[0]
    srv = ExtenderServers(ext, ext.settings, log_level="warning", sockets=(_loopback(), None))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    try:
        deadline = time.monotonic() + 30
        while not srv.started:
            assert th.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        assert srv.metrics_url is None
        assert httpx.get(srv.verbs_url + "/metrics", timeout=10).status_code == 200
    finally:
        srv.request_stop()
        th.join(timeout=10)


def test_verbs_on_a_non_loopback_address_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    ext = make_extender(host="0.0.0.0")[0]
    srv = ExtenderServers(ext, ext.settings, log_level="warning", sockets=(_loopback(), None))
    srv.request_stop()  # serve() warns, then stops at once
    with caplog.at_level(logging.WARNING, logger="scheduler_plugin.extender.server"):
        srv.run()
    assert "listen on 0.0.0.0, not on loopback" in caplog.text


def test_bind_timeout_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().bind_timeout_s == 4.0
    monkeypatch.setenv("KELVIN_BIND_TIMEOUT_S", "9")
    assert load_settings().bind_timeout_s == 9.0
    for bad in ("0", "61", "-1"):
        monkeypatch.setenv("KELVIN_BIND_TIMEOUT_S", bad)
        with pytest.raises(ConfigError, match=r"bind_timeout_s \(KELVIN_BIND_TIMEOUT_S\)"):
            load_settings()


async def _broken_start() -> None:
    raise RuntimeError("telemetry exploded")


@pytest.mark.parametrize("uvicorn_style", ["current", "before 0.30"])
def test_a_failed_startup_is_an_error_not_a_clean_exit(monkeypatch: pytest.MonkeyPatch, uvicorn_style: str) -> None:
    """uvicorn before 0.30 (allowed by pyproject) returns normally when the lifespan fails; later ones exit 3. Either
    way ExtenderServers.run raises StartupError, which the CLI turns into exit status 3 and one line."""
    ext = make_extender()[0]
    monkeypatch.setattr(ext.cache, "start", _broken_start)
    if uvicorn_style != "current":
        real_startup = uvicorn.Server.startup

        async def old_startup(self: uvicorn.Server, sockets: Any = None) -> None:
            if self.config.lifespan == "off":  # the metrics listener
                return await real_startup(self, sockets)
            await self.lifespan.startup()
            assert self.lifespan.should_exit, "the lifespan should have failed"
            self.should_exit = True

        monkeypatch.setattr(uvicorn.Server, "startup", old_startup)
    srv = ExtenderServers(ext, ext.settings, log_level="critical", sockets=(_loopback(), _loopback()))
    with pytest.raises(StartupError, match="did not start"):
        srv.run()


def test_the_cli_exits_3_when_startup_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler_plugin.telemetry.cache import SnapshotCache

    monkeypatch.setattr(SnapshotCache, "start", lambda self: _broken_start())
    r = CliRunner().invoke(app, ["extender", "--port", "0", "--metrics-port", "0", "--log-level", "critical"])
    assert r.exit_code == 3, r.output
    assert "did not start" in r.stderr and "Traceback" not in r.output


def test_probes_answer_while_the_verbs_loop_is_busy(
    extender: Extender, servers: ExtenderServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metrics listener has its own thread and event loop: a verb that holds the verbs' loop (here for 3 s, as
    a queue of 5,000-node requests does under load) does not delay /healthz, /readyz or /metrics."""
    ext = extender
    real_put = ext.memo.remember

    def slow_put(req: Any) -> None:  # called by every filter (the verbs table holds ext.filter itself)
        time.sleep(3.0)  # CPU work on the loop: nothing else on that loop runs meanwhile
        real_put(req)

    monkeypatch.setattr(ext.memo, "remember", slow_put)
    busy = threading.Thread(
        target=lambda: httpx.post(servers.verbs_url + "/filter", content=args(pod("p1")), timeout=30), daemon=True
    )
    busy.start()
    time.sleep(0.5)  # the filter is running
    assert servers.metrics_url is not None
    with httpx.Client(base_url=servers.metrics_url, timeout=1.5) as m:
        for path in ("/healthz", "/readyz", "/metrics"):
            started = time.monotonic()
            assert m.get(path).status_code == 200, path
            assert time.monotonic() - started < 1.0, path
    assert busy.is_alive()  # the verb was still holding its loop
    busy.join(timeout=30)
