"""Decoding one Prometheus instant-query answer (``/api/v1/query``, a vector) into ``(labels, value)`` samples.

A 5,000-node fleet answers each of kelvin's queries with some 40,000 samples (one per GPU), a few MB of JSON, and a
refresh reads a dozen of them: decoding is most of a refresh's CPU. So an answer is read in two ways:

* **typed** (:func:`_typed`): msgspec decodes the document straight into structs of the exact shapes Prometheus
  sends (label values strings, ``value`` a ``[timestamp, "number"]`` pair), checking every type in C, and the values'
  plausible range is checked over the whole vector at once. It accepts an answer only when *every* sample is well
  formed and in range;
* **careful** (:func:`_careful`): any other answer (a sample that is not an object, a label that is not a string, a
  value that is not a number or is out of range, an error status) is read again item by item, which drops each bad
  sample with its reason (:class:`~.sanity.SampleIssues`) and keeps the rest, or raises :class:`~.source.SourceError`
  naming what is wrong with the answer as a whole.

Both give the same samples for an answer the typed read accepts (the tests compare them); the careful one is the
definition, the typed one only its fast path.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import orjson

from .sanity import Range, SampleIssues
from .source import SourceError

Sample = tuple[dict[str, str], float]


class _Series(msgspec.Struct):
    value: tuple[float, str]
    metric: dict[str, str] = msgspec.field(default_factory=dict)


class _Data(msgspec.Struct):
    resultType: str = ""
    result: list[_Series] = msgspec.field(default_factory=list)


class _Answer(msgspec.Struct):
    status: str = ""
    data: _Data = msgspec.field(default_factory=_Data)


_DECODER = msgspec.json.Decoder(_Answer)


def decode_vector(content: bytes, query: str, rng: Range, issues: SampleIssues) -> list[Sample]:
    """The samples of ``content``, the answer to ``query``, values within ``rng``; bad samples dropped and reported
    to ``issues``. Raises :class:`~.source.SourceError` for an answer that is not a successful vector (an error
    status, another result type, a malformed document) and ``orjson.JSONDecodeError`` for one that is not JSON."""
    fast = _typed(content, rng)
    if fast is not None:
        return fast
    return _careful(orjson.loads(content), query, rng, issues)


def _typed(content: bytes, rng: Range) -> list[Sample] | None:
    """The samples of a well-formed successful vector whose every value is within ``rng``, else ``None``."""
    try:
        answer = _DECODER.decode(content)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if answer.status != "success" or answer.data.resultType != "vector":
        return None
    series = answer.data.result
    try:
        values = [float(s.value[1]) for s in series]
    except (ValueError, OverflowError):
        return None
    v = np.asarray(values, dtype=np.float64)
    if not (np.isfinite(v).all() and (v >= rng.lo).all() and (v <= rng.hi).all()):
        return None
    return [(s.metric, x) for s, x in zip(series, values, strict=True)]


def _careful(doc: Any, query: str, rng: Range, issues: SampleIssues) -> list[Sample]:
    """The samples of ``doc`` (the decoded answer) item by item: each bad sample dropped with its reason."""
    if not isinstance(doc, dict) or doc.get("status") != "success":
        error = doc.get("error", "no status") if isinstance(doc, dict) else "not a JSON object"
        raise SourceError(f"prometheus query {query!r} failed: {error}")
    data = doc.get("data") or {}
    if not isinstance(data, dict):
        raise SourceError(f"prometheus query {query!r}: data is not an object ({type(data).__name__})")
    if data.get("resultType") != "vector":
        raise SourceError(f"prometheus query {query!r}: expected a vector, got {data.get('resultType')!r}")
    result = data.get("result")
    result = [] if result is None else result
    if not isinstance(result, list):
        raise SourceError(f"prometheus query {query!r}: data.result is not a list ({type(result).__name__})")
    out: list[Sample] = []
    for item in result:
        if not isinstance(item, dict):
            issues.report(
                "bad_sample",
                f"{query}:bad_sample",
                f"prometheus query {query!r}: dropped a sample that is not an object: {item!r:.200}",
            )
            continue
        metric = item.get("metric") or {}
        if not isinstance(metric, dict):
            raise SourceError(f"prometheus query {query!r}: a sample's metric is not a label map ({metric!r:.80})")
        raw: Any = item.get("value")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
            issues.report(
                "bad_labels",
                f"{query}:bad_labels",
                f"prometheus query {query!r}: dropped series {metric!r:.300} (value {raw!r:.80}): label values must "
                "be strings",
            )
            continue
        try:
            text = raw[1]
            value = float(text)
        except (IndexError, KeyError, TypeError, ValueError, OverflowError):
            issues.report(
                "bad_value",
                f"{query}:bad_value",
                f"prometheus query {query!r}: dropped series {metric!r:.300}: its value {raw!r:.80} is not a "
                '[timestamp, "number"] pair',
            )
            continue
        why = rng.check(value)
        if why is not None:
            issues.report(
                "out_of_range",
                f"{query}:out_of_range",
                f"prometheus query {query!r}: dropped series {metric!r:.300}: value {text!r:.80} is {why}",
            )
            continue
        out.append((metric, value))
    return out
