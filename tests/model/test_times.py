"""RFC 3339 times: one parser for the operator's annotations, pod times and the extender's bind time."""

from __future__ import annotations

import pytest

from scheduler_plugin.model.times import format_time, format_time_ns, parse_time, parse_time_ns

T = 1_767_323_045  # 2026-01-02T03:04:05Z


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("2026-01-02T03:04:05Z", T * 10**9),
        ("2026-01-02T03:04:05z", T * 10**9),
        ("2026-01-02T03:04:05", T * 10**9),  # no offset: UTC
        ("2026-01-02T04:04:05.5+01:00", T * 10**9 + 500_000_000),
        ("2026-01-02T03:04:05.123456789Z", T * 10**9 + 123_456_789),  # nanoseconds kept (datetime has micro)
        (" 2026-01-02T03:04:05Z ", T * 10**9),
    ],
)
def test_parse(text: str, ns: int) -> None:
    assert parse_time_ns(text) == ns
    assert parse_time(text) == pytest.approx(ns / 1e9)


@pytest.mark.parametrize("text", ["", "x", "2026-13-02T03:04:05Z", "2026-01-02", "2026-01-02T03:04:05.1234567891Z", 5])
def test_not_a_time(text: object) -> None:
    assert parse_time_ns(text) is None and parse_time(text) is None


def test_round_trips() -> None:
    ns = T * 10**9 + 1
    assert format_time_ns(ns) == "2026-01-02T03:04:05.000000001Z" and parse_time_ns(format_time_ns(ns)) == ns
    assert format_time(T + 0.25) == "2026-01-02T03:04:05.250000Z" and parse_time(format_time(T + 0.25)) == T + 0.25
