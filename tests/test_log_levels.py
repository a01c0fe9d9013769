"""Per-query lines at DEBUG: httpx's request lines held at WARNING by kelvin's logging setup (console.setup_logging)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scheduler_plugin.console import QUIET_LOGGERS, LogLevel, setup_logging
from scheduler_plugin.telemetry.prometheus import PrometheusSource

EMPTY = {"status": "success", "data": {"resultType": "vector", "result": []}}


@pytest.fixture
def kelvin_logging() -> Iterator[None]:
    """setup_logging as a command runs it; the library loggers' levels are put back afterwards."""
    saved = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    setup_logging(LogLevel.info)
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("kelvin_logging")
async def test_prometheus_queries_are_not_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    source = PrometheusSource(
        "http://prom", metrics="kelvin", transport=httpx.MockTransport(lambda r: httpx.Response(200, json=EMPTY))
    )
    try:
        with caplog.at_level(logging.DEBUG):  # even with the root logger at DEBUG
            await source.fetch()
    finally:
        await source.close()
    loud = [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert loud == []
    per_query = [r for r in caplog.records if r.getMessage().startswith("prometheus query ")]
    assert per_query and {r.levelno for r in per_query} == {logging.DEBUG}
    assert "HTTP 200, 0 samples" in per_query[0].getMessage()


@pytest.mark.parametrize(("level", "expected"), [(LogLevel.info, logging.WARNING), (LogLevel.error, logging.ERROR)])
def test_httpx_is_held_at_warning_or_above(level: LogLevel, expected: int) -> None:
    saved = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    try:
        setup_logging(level)
        assert {logging.getLogger(n).level for n in ("httpx", "httpcore")} == {expected}
    finally:
        for name, lv in saved.items():
            logging.getLogger(name).setLevel(lv)


def test_every_command_logs_through_setup_logging() -> None:
    """No command configures logging itself: each calls setup_logging, so httpx is quiet in all of them."""
    root = Path(__file__).resolve().parents[1]
    sources = [*(root / "scheduler_plugin").rglob("*.py"), *(root / "operator").rglob("*.py")]
    own = [p.relative_to(root).as_posix() for p in sources if "logging.basicConfig(" in p.read_text()]
    assert own == ["scheduler_plugin/console.py"]
    callers = {p.relative_to(root).as_posix() for p in sources if "setup_logging(log_level)" in p.read_text()}
    assert {
        "scheduler_plugin/extender/cli.py",
        "scheduler_plugin/exporter/cli.py",
        "scheduler_plugin/deviceplugin/cli.py",
        "operator/kelvin_operator/cli.py",
    } <= callers
