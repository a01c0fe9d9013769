"""The two reads of a Prometheus vector answer (telemetry/prom_vector.py): the typed read serves well-formed answers,
and gives exactly the careful read's samples; every other answer goes the careful way (bad samples dropped with their
reason, a bad document refused with its problem named)."""

from __future__ import annotations

import logging
import math
from typing import Any

import orjson
import pytest

from scheduler_plugin.telemetry import prom_vector
from scheduler_plugin.telemetry.prom_vector import decode_vector
from scheduler_plugin.telemetry.sanity import ANY, BYTES, CELSIUS, Range, SampleIssues
from scheduler_plugin.telemetry.source import SourceError


def answer(result: Any, **top: Any) -> bytes:
    doc = {"status": "success", "data": {"resultType": "vector", "result": result}}
    doc.update(top)
    return orjson.dumps(doc)


def series(node: str, gpu: int, value: Any, **labels: str) -> dict[str, Any]:
    return {"metric": {"node": node, "gpu": str(gpu), **labels}, "value": [1_700_000_000.5, value]}


GOOD = [series(f"n{i}", g, str(1000 * i + g), uuid=f"GPU-{i}-{g}") for i in range(50) for g in range(8)]


def issues() -> SampleIssues:
    return SampleIssues(logging.getLogger("test"))


def both(content: bytes, rng: Range) -> tuple[list[Any], dict[str, int], list[Any], dict[str, int]]:
    fast_issues, slow_issues = issues(), issues()
    fast = decode_vector(content, "q", rng, fast_issues)
    slow = prom_vector._careful(orjson.loads(content), "q", rng, slow_issues)
    return fast, dict(fast_issues.counts), slow, dict(slow_issues.counts)


def test_a_well_formed_answer_is_read_typed_with_the_careful_read_s_samples() -> None:
    content = answer(GOOD)
    typed = prom_vector._typed(content, BYTES)
    assert typed is not None and len(typed) == 400  # the fast path is taken, not declined
    fast, fast_counts, slow, slow_counts = both(content, BYTES)
    assert fast == slow == typed and fast_counts == slow_counts == {}
    assert fast[9] == ({"node": "n1", "gpu": "1", "uuid": "GPU-1-1"}, 1001.0)


@pytest.mark.parametrize(
    "content",
    [
        answer([]),
        orjson.dumps({"status": "success", "data": {"resultType": "vector"}}),
        orjson.dumps({"status": "success", "data": {"resultType": "vector", "result": None}}),
        answer([{"value": [0, "5"]}]),  # no labels at all
        answer(GOOD, warnings=["partial"]),  # fields kelvin does not read
        answer([series("n1", 0, " 5 "), series("n1", 1, "1e3")]),  # what Python's float reads
    ],
)
def test_edge_answers_read_alike(content: bytes) -> None:
    fast, fast_counts, slow, slow_counts = both(content, BYTES)
    assert fast == slow and fast_counts == slow_counts


@pytest.mark.parametrize(
    ("bad", "reason", "rng"),
    [
        ({"metric": {"node": "n1", "gpu": 3}, "value": [0, "1"]}, "bad_labels", BYTES),
        ({"metric": {"node": "n1", "gpu": "0"}, "value": [0, "x"]}, "bad_value", BYTES),
        ({"metric": {"node": "n1", "gpu": "0"}, "value": [0]}, "bad_value", BYTES),
        ({"metric": {"node": "n1", "gpu": "0"}}, "bad_value", BYTES),
        ({"metric": {"node": "n1", "gpu": "0"}, "value": [0, "NaN"]}, "out_of_range", ANY),
        ({"metric": {"node": "n1", "gpu": "0"}, "value": [0, "+Inf"]}, "out_of_range", ANY),
        ({"metric": {"node": "n1", "gpu": "0"}, "value": [0, "-1"]}, "out_of_range", BYTES),
        ({"metric": {"node": "n1", "gpu": "0"}, "value": [0, "500"]}, "out_of_range", CELSIUS),
        ("not a sample", "bad_sample", BYTES),
    ],
)
def test_an_answer_with_one_bad_sample_drops_that_one_with_its_reason(bad: Any, reason: str, rng: Range) -> None:
    good = [series("n0", 0, "42"), series("n0", 1, "43")]
    content = answer([good[0], bad, good[1]])
    assert prom_vector._typed(content, rng) is None  # declined: read the careful way
    fast, fast_counts, slow, slow_counts = both(content, rng)
    assert fast == slow == [(good[0]["metric"], 42.0), (good[1]["metric"], 43.0)]
    assert fast_counts == slow_counts == {reason: 1}


def test_typed_values_are_the_numbers_prometheus_wrote() -> None:
    content = answer([series("n0", 0, "0.1"), series("n0", 1, "1.7976931348623157e308")])
    values = [v for _, v in decode_vector(content, "q", ANY, issues())]
    assert values == [0.1, 1.7976931348623157e308] and all(math.isfinite(v) for v in values)


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"status": "error", "error": "bad_data: parse error"}, "failed: bad_data: parse error"),
        ({"status": "success", "data": {"resultType": "matrix", "result": []}}, "expected a vector, got 'matrix'"),
        ({"status": "success", "data": [1]}, "data is not an object"),
        ({"status": "success", "data": {"resultType": "vector", "result": {"a": 1}}}, "data.result is not a list"),
    ],
)
def test_a_bad_answer_is_refused_with_its_problem_named(doc: dict[str, Any], words: str) -> None:
    with pytest.raises(SourceError, match=words):
        decode_vector(orjson.dumps(doc), "q", BYTES, issues())


def test_an_answer_that_is_not_json_raises_the_json_error() -> None:
    with pytest.raises(orjson.JSONDecodeError):
        decode_vector(b"<html>bad gateway</html>", "q", BYTES, issues())
