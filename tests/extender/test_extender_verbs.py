"""The verbs table (extender/routes.py, extender/verbs.py) and the refusals' statuses (extender/errors.py): each verb is
served where kube-scheduler calls it, and an unexpected failure inside kelvin gets that verb's own reply."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from ext_helpers import args, make_extender, pod
from fastapi.testclient import TestClient

from scheduler_plugin.extender import errors
from scheduler_plugin.extender.app import create_app
from scheduler_plugin.extender.routes import verb_table
from scheduler_plugin.extender.service import Extender


@pytest.fixture
def ext() -> Extender:
    return make_extender()[0]


@pytest.fixture
def client(ext: Extender) -> Iterator[TestClient]:
    with TestClient(create_app(ext)) as c:
        yield c


def boom(*a: Any, **k: Any) -> Any:
    raise RuntimeError("exploded")


def test_the_table_serves_each_verb_where_kube_scheduler_calls_it(ext: Extender) -> None:
    paths = {v.name: v.paths for v in verb_table(ext)}
    assert paths == {
        "filter": ("/filter", "/scheduler/filter"),
        "prioritize": ("/prioritize", "/scheduler/prioritize"),
        "bind": ("/bind", "/scheduler/bind"),
        "explain": ("/explain",),
        "preempt": ("/preempt", "/scheduler/preempt"),
    }


@pytest.mark.parametrize(
    ("verb", "status", "body"),
    [
        ("filter", 200, {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}}),
        ("bind", 200, {}),
        ("prioritize", 503, {}),
        ("explain", 503, {}),
        ("preempt", 503, {}),
    ],
)
def test_each_verb_has_its_own_reply_to_an_unexpected_failure(
    ext: Extender, verb: str, status: int, body: dict[str, Any]
) -> None:
    (row,) = [v for v in verb_table(ext) if v.name == verb]
    reply, got = row.on_error("kelvin x failed: RuntimeError: exploded")
    assert got == status and reply == {**body, "Error": "kelvin x failed: RuntimeError: exploded"}


def test_explain_and_preempt_answer_an_internal_failure_with_503(
    ext: Extender, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ext.framework, "context", boom)
    e = client.post("/explain", json={"pod": pod(), "node": "gpu-node-1"})
    assert e.status_code == 503 and e.json() == {"Error": "kelvin explain failed: RuntimeError: exploded"}
    victims = {"gpu-node-1": {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0}}
    p = client.post("/preempt", content=json.dumps({"Pod": pod(), "NodeNameToMetaVictims": victims}))
    assert p.status_code == 503 and p.json() == {"Error": "kelvin preempt failed: RuntimeError: exploded"}
    m = ext.metrics
    assert m.requests.labels("explain", "503")._value.get() == 1
    assert m.requests.labels("preempt", "503")._value.get() == 1


def test_an_internal_failure_in_bind_is_a_failed_bind_and_leaves_no_record(
    ext: Extender, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert client.post("/filter", content=args(pod())).status_code == 200
    monkeypatch.setattr(ext.memo, "get", boom)
    b = client.post(
        "/bind", json={"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "gpu-node-1"}
    )
    assert b.status_code == 200 and b.json() == {"Error": "kelvin bind failed: RuntimeError: exploded"}
    assert ext.metrics.decisions.labels("bind", "error")._value.get() == 1
    assert ext.binds.get("uid-p1") is None  # nothing was assumed: a retry is a fresh bind


@pytest.mark.parametrize(
    ("exc", "status", "close"),
    [
        (errors.WireError("Pod: missing"), 400, False),
        (errors.too_many_names("NodeNames", 3, 2), 413, True),
        (errors.body_too_large("of 9", 8), 413, True),
        (errors.UnsupportedEncoding("gzip"), 415, True),
        (errors.ClientGone(), 499, False),
    ],
)
def test_each_refusal_carries_its_status(exc: errors.HttpError, status: int, close: bool) -> None:
    assert (exc.status, exc.close) == (status, close)
