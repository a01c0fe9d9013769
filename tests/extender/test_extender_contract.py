"""Contract tests: every real kube-scheduler capture in ../shared/fixtures/extender/ gets a well-formed reply."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ext_helpers import load_capture, make_extender
from fastapi.testclient import TestClient

from scheduler_plugin.extender.app import create_app
from scheduler_plugin.extender.wire import ExtenderArgs, ExtenderFilterResult, HostPriority
from scheduler_plugin.model import parse_pod

FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


def test_captures_found(fixtures_dir: Path) -> None:
    """test_capture runs once per capture (its ``capture`` parameters come from tests/conftest.py)."""
    assert len(list(fixtures_dir.glob("*.json"))) >= 40


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    ext, _, _ = make_extender()
    with TestClient(create_app(ext)) as c:
        yield c


def _names(request: dict[str, Any]) -> list[str]:
    if request.get("NodeNames") is not None:
        return list(request["NodeNames"])
    return [n["metadata"]["name"] for n in request["Nodes"]["items"]]


def _pascal(keys: Any) -> bool:
    return all(isinstance(k, str) and k[:1].isupper() for k in keys)


def test_capture(client: TestClient, fixtures_dir: Path, capture: Path) -> None:
    cap = load_capture(capture)
    request = cap["request"]
    ExtenderArgs.model_validate(request)  # the documented schema accepts what a real scheduler sends
    req = parse_pod(request["Pod"])
    assert req.count == 1 and req.pod_key.startswith("default/")
    names = _names(request)
    resp = client.post(cap["request_path"], content=json.dumps(request))
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    if cap["verb"] == "filter":
        assert set(body) == FILTER_KEYS and _pascal(body)
        ExtenderFilterResult.model_validate(body)
        assert body["Error"] == ""
        decided = set(body["FailedNodes"]) | set(body["FailedAndUnresolvableNodes"])
        if request.get("NodeNames") is not None:  # nodeCacheCapable: true
            assert body["Nodes"] is None
            passed = body["NodeNames"]
        else:  # nodeCacheCapable: false -> the scheduler reads only Nodes
            assert body["NodeNames"] is None
            assert set(body["Nodes"]) == {"metadata", "items"}
            passed = [n["metadata"]["name"] for n in body["Nodes"]["items"]]
            by_name = {n["metadata"]["name"]: n for n in request["Nodes"]["items"]}
            assert all(n == by_name[n["metadata"]["name"]] for n in body["Nodes"]["items"])  # returned as received
        assert set(passed) | decided == set(names) and not set(passed) & decided
        assert passed == [n for n in names if n in passed]  # order kept
        assert passed == names  # both capture nodes have free GPUs for a 1-GPU pod
        if isinstance(cap["response"], dict):  # the reply has the captured extender's shape
            assert set(cap["response"]) == set(body)
            assert (cap["response"]["Nodes"] is None) == (body["Nodes"] is None) or cap["mode"] != "ok"
    else:
        assert isinstance(body, list) and [h["Host"] for h in body] == names
        for h in body:
            assert set(h) == {"Host", "Score"}
            HostPriority.model_validate(h)
            assert isinstance(h["Score"], int) and 0 <= h["Score"] <= 10
        ext = client.app.state.extender  # type: ignore[attr-defined]
        fleet = ext.cache.snapshot.arrays
        rows = np.array([fleet.index[n] for n in names], dtype=np.int64)
        want, _ = ext.framework.prioritize(req, fleet, rows, ext.framework.context(fleet, ext.clock()))
        assert [h["Score"] for h in body] == want.tolist()  # each host gets its own node's score


@pytest.mark.parametrize("mode", ["nodecache-false", "nodecache-true"])
def test_rejection_in_both_modes(client: TestClient, fixtures_dir: Path, mode: str) -> None:
    """A 4-GPU pod: gpu-node-1 has 2 free GPUs (resolvable by preemption), gpu-node-2 has 7."""
    cap = load_capture(fixtures_dir / f"filter-{mode}-ok-001.json")
    request = copy.deepcopy(cap["request"])
    for c in request["Pod"]["spec"]["containers"]:
        c["resources"] = {"limits": {"nvidia.com/gpu": "4"}, "requests": {"nvidia.com/gpu": "4"}}
    body = client.post("/scheduler/filter", content=json.dumps(request)).json()
    assert list(body["FailedNodes"]) == ["gpu-node-1"]
    assert "free" in body["FailedNodes"]["gpu-node-1"]  # e.g. "2 of 8 usable GPUs are free; ..."
    assert body["FailedAndUnresolvableNodes"] == {}
    if mode == "nodecache-true":
        assert body["NodeNames"] == ["gpu-node-2"] and body["Nodes"] is None
    else:
        assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["gpu-node-2"]
        assert body["NodeNames"] is None


def test_unresolvable_when_no_node_can_ever_fit(client: TestClient, fixtures_dir: Path) -> None:
    cap = load_capture(fixtures_dir / "filter-reject-nodecache-false-reject-001.json")
    request = copy.deepcopy(cap["request"])
    request["Pod"]["metadata"].setdefault("annotations", {})["kelvin.dev/gpu-models"] = "A100-SXM4-80GB"
    body = client.post("/scheduler/filter", content=json.dumps(request)).json()
    assert body["Nodes"] == {"metadata": {}, "items": []}
    assert set(body["FailedAndUnresolvableNodes"]) == {"gpu-node-1", "gpu-node-2"}
    assert "A100-SXM4-80GB" in body["FailedAndUnresolvableNodes"]["gpu-node-1"]


def test_scores_are_mapped_to_their_hosts(
    client: TestClient, fixtures_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the policies say, host i gets the score of its own snapshot row (order of the request kept)."""
    ext = client.app.state.extender  # type: ignore[attr-defined]

    def by_row(req: Any, fleet: Any, rows: Any, ctx: Any) -> tuple[Any, Any]:
        return np.asarray(rows, dtype=np.int64) * 3 + 1, np.zeros(len(rows))

    monkeypatch.setattr(ext.framework, "prioritize", by_row)
    cap = load_capture(fixtures_dir / "prioritize-nodecache-true-ok-002.json")
    request = copy.deepcopy(cap["request"])
    request["NodeNames"] = ["gpu-node-2", "unknown-node", "gpu-node-1"]
    body = client.post("/scheduler/prioritize", content=json.dumps(request)).json()
    index = ext.cache.snapshot.arrays.index
    assert body == [
        {"Host": "gpu-node-2", "Score": index["gpu-node-2"] * 3 + 1},
        {"Host": "unknown-node", "Score": 0},
        {"Host": "gpu-node-1", "Score": index["gpu-node-1"] * 3 + 1},
    ]
