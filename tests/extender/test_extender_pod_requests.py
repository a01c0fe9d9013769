"""Pods parsed once per Pod text (extender.pod_requests): prioritize reuses what filter parsed for the same Pod, an
edited pod (same UID, another text) is parsed again, a pod that does not parse is never kept."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from scheduler_plugin.extender import pod_requests, service, wire
from scheduler_plugin.extender.errors import WireError
from scheduler_plugin.model import GpuRequest, parse_pod
from tests.extender.ext_helpers import args, make_extender, pod


def test_prioritize_reuses_the_request_filter_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []

    def counted(p: Any, **kw: Any) -> GpuRequest:
        calls.append(p)
        return parse_pod(p, **kw)

    for module in (pod_requests, service):
        monkeypatch.setattr(module, "parse_pod", counted)
    ext, _, _ = make_extender()
    p = pod("p1", gpus=1)
    ext.filter(args(p))
    ext.prioritize(args(p))
    assert len(calls) == 1 and ext.pods.parsed == 1
    ext.filter(args(pod("p2", gpus=1)))
    assert len(calls) == 2


def test_an_edited_pod_is_parsed_again_and_answered_as_edited() -> None:
    ext, _, _ = make_extender()
    p = pod("p1", gpus=1)
    ext.filter(args(p))
    edited = pod("p1", gpus=1, annotations={"kelvin.dev/gpu-memory": "not-a-size"})  # same UID, another text
    with pytest.raises(WireError, match=r"kelvin\.dev/gpu-memory"):
        ext.prioritize(args(edited))
    assert ext.pods.parsed == 2
    fresh, _, _ = make_extender()
    two = pod("p1", gpus=2)
    assert orjson.dumps(ext.prioritize(args(two))) == orjson.dumps(fresh.prioritize(args(two)))


def test_a_pod_that_does_not_parse_is_not_kept() -> None:
    ext, _, _ = make_extender()
    bad = pod("p1", annotations={"kelvin.dev/gpu-memory": "lots"})
    for _ in range(2):
        reply = ext.filter(args(bad))
        assert all("invalid pod" in why for why in reply["FailedAndUnresolvableNodes"].values())
    assert ext.pods.parsed == 2


def test_the_pod_text_is_the_pod_as_sent() -> None:
    p = pod("p1", annotations={"a": "é"})
    text = json.dumps(p, ensure_ascii=False).encode()
    parsed = wire.parse_args(b'{"Pod":' + text + b',"NodeNames":["n1"]}')
    assert parsed.pod_text == text and parsed.pod == orjson.loads(text)
    assert wire.parse_args(b'{"Pod":' + text + b',"NodeNames":null,"Nodes":{"items":[]}}').pod_text == text
