"""Request limits (issue 10, item 6): body size and node count answered 413 naming the setting, duplicate nodes
dropped with valid replies, big bodies decoded off the event loop, Node objects echoed back verbatim."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from ext_helpers import args, load_capture, make_extender, pod
from fastapi.testclient import TestClient

from scheduler_plugin.extender import routes, wire
from scheduler_plugin.extender.app import create_app
from scheduler_plugin.extender.errors import WireError
from scheduler_plugin.extender.server import ServerThread
from scheduler_plugin.settings import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_NODE_NAMES, Settings

NodesBody = Callable[[list[str]], bytes]


def client_for(**settings: Any) -> TestClient:
    return TestClient(create_app(make_extender(**settings)[0]))


@pytest.fixture
def small() -> Iterator[TestClient]:
    with client_for(max_body_bytes=4096, max_node_names=3) as c:
        yield c


@pytest.fixture
def nodes_body(fixtures_dir: Path) -> NodesBody:
    """A filter body of Node objects named ``names``, each the real capture's Node (skipped without ../shared)."""
    node = load_capture(fixtures_dir / "filter-nodecache-false-ok-001.json")["request"]["Nodes"]["items"][0]

    def body(names: list[str]) -> bytes:
        items = [{**node, "metadata": {**node["metadata"], "name": n}} for n in names]
        return json.dumps({"Pod": pod("p1"), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}).encode()

    return body


# -- body size -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "explain", "scheduler/filter"])
def test_a_body_over_max_body_bytes_is_413_by_its_content_length(small: TestClient, verb: str) -> None:
    body = args(pod("p1"), [f"gpu-node-{i}" for i in range(400)])
    assert len(body) > 4096
    resp = small.post(f"/{verb}", content=body)
    assert resp.status_code == 413
    error = resp.json()["Error"]
    assert f"of {len(body)} bytes is over max_body_bytes (4096 bytes, env KELVIN_MAX_BODY_BYTES)" in error
    assert resp.headers["connection"] == "close"
    code = verb.split("/")[-1]
    assert f'kelvin_extender_requests_total{{code="413",verb="{code}"}} 1.0' in small.get("/metrics").text


def test_a_chunked_body_over_max_body_bytes_is_413_while_it_streams() -> None:
    """No Content-Length (Transfer-Encoding: chunked, over a real server): the bytes are counted as they come, so the
    413 arrives while the client is still sending (the body's last chunk is never sent: a server that read the whole
    body before counting would never answer)."""
    ext = make_extender(max_body_bytes=4096)[0]
    head = b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["gpu-node-1"'
    more = b', "gpu-node-2", "gpu-node-2", "gpu-node-2", "gpu-n"' * 100  # 5,000 bytes: over the limit
    with ServerThread(create_app(ext)) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
            sock.sendall(b"Transfer-Encoding: chunked\r\n\r\n")
            for chunk in (head, more):
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            # no terminating "0\r\n\r\n": the body is still streaming
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                got = sock.recv(65536)  # times out (10 s) if the server waits for the end of the body
                if not got:
                    break
                answer += got
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line.startswith(b"HTTP/1.1 413"), answer
        error = json.loads(rest.partition(b"\r\n\r\n")[2])["Error"]
        assert "of more than 4096 bytes is over max_body_bytes (4096 bytes, env KELVIN_MAX_BODY_BYTES)" in error
        with httpx.Client(base_url=url, timeout=10) as c:  # a new connection; the server is fine
            ok = c.post("/filter", content=args(pod("p2")))
            assert ok.status_code == 200 and ok.json()["NodeNames"] == ["gpu-node-1", "gpu-node-2"]


def test_a_body_within_the_limit_is_served(small: TestClient) -> None:
    assert small.post("/prioritize", content=args(pod("p1"))).status_code == 200


# -- node count ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_more_node_names_than_max_node_names_is_413(verb: str) -> None:
    with client_for(max_node_names=3) as c:
        resp = c.post(f"/{verb}", content=args(pod("p1"), ["a", "b", "c", "d"]))
        assert resp.status_code == 413
        assert resp.json()["Error"].startswith(
            "NodeNames: 4 nodes, more than max_node_names (3, env KELVIN_MAX_NODE_NAMES)"
        )
        assert c.post(f"/{verb}", content=args(pod("p1"), ["a", "b", "c"])).status_code == 200


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_more_node_objects_than_max_node_names_is_413(nodes_body: NodesBody, verb: str) -> None:
    with client_for(max_node_names=1) as c:
        resp = c.post(f"/{verb}", content=nodes_body(["gpu-node-1", "gpu-node-2"]))
        assert resp.status_code == 413
        assert "Nodes.items: 2 nodes, more than max_node_names (1, env KELVIN_MAX_NODE_NAMES)" in resp.json()["Error"]


def test_explain_candidates_are_limited_too() -> None:
    with client_for(max_node_names=2) as c:
        body = {"pod": pod("p1"), "node": "gpu-node-1", "candidates": ["gpu-node-1", "gpu-node-2", "x"]}
        resp = c.post("/explain", json=body)
        assert resp.status_code == 413 and "candidates: 3 nodes" in resp.json()["Error"]


def test_limits_default_and_validation() -> None:
    s = Settings()
    assert s.max_body_bytes == DEFAULT_MAX_BODY_BYTES == 64 * 1024 * 1024
    assert s.max_node_names == DEFAULT_MAX_NODE_NAMES == 100_000
    with pytest.raises(ValueError, match="max_body_bytes"):
        Settings(max_body_bytes=10)
    with pytest.raises(ValueError, match="max_node_names"):
        Settings(max_node_names=0)


def test_the_default_body_limit_holds_5000_real_nodes(nodes_body: NodesBody) -> None:
    """5,000 nodes of the real capture's Node object fit the default body limit many times over."""
    assert len(nodes_body([f"gpu-node-{i}" for i in range(5000)])) < DEFAULT_MAX_BODY_BYTES / 4


# -- duplicates ------------------------------------------------------------------------------------------------------


def test_duplicate_node_names_are_dropped_keeping_the_order() -> None:
    with client_for() as c:
        names = ["gpu-node-2", "gpu-node-1", "gpu-node-2", "gpu-node-1", "gpu-node-2"]
        prio = c.post("/prioritize", content=args(pod("p1"), names)).json()
        assert [h["Host"] for h in prio] == ["gpu-node-2", "gpu-node-1"]  # a HostPriorityList, each host once
        f = c.post("/filter", content=args(pod("p1"), names)).json()
        assert f["NodeNames"] == ["gpu-node-2", "gpu-node-1"]


def test_duplicate_node_objects_are_dropped_and_the_rest_echoed_verbatim(nodes_body: NodesBody) -> None:
    body = nodes_body(["gpu-node-1", "gpu-node-2", "gpu-node-1"])
    sent = json.loads(body)["Nodes"]["items"]
    with client_for() as c:
        f = c.post("/filter", content=body).json()
        assert f["NodeNames"] is None and f["Error"] == ""
        assert f["Nodes"]["items"] == sent[:2]  # whole Node objects, as received, once each
        prio = c.post("/prioritize", content=body).json()
        assert [h["Host"] for h in prio] == ["gpu-node-1", "gpu-node-2"]


def test_node_objects_are_kept_undecoded(nodes_body: NodesBody) -> None:
    parsed = wire.parse_args(nodes_body(["gpu-node-1", "gpu-node-2"]))
    assert parsed.names == ["gpu-node-1", "gpu-node-2"] and not parsed.node_cache_capable
    assert parsed.node_objects is not None
    assert all(isinstance(o, orjson.Fragment) for o in parsed.node_objects)  # JSON text, not a tree of dicts


# -- parsing off the event loop --------------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_a_big_body_is_decoded_in_a_worker_thread_a_small_one_inline(
    monkeypatch: pytest.MonkeyPatch, verb: str
) -> None:
    """A big body is decoded in a worker thread (so the loop can serve /healthz meanwhile), a small one inline."""
    on_loop: list[bool] = []
    real = wire.parse_args

    def spy(body: bytes, **kw: Any) -> wire.ParsedArgs:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return real(body, **kw)

    monkeypatch.setattr(wire, "parse_args", spy)
    big = args(
        pod("p1"), ["gpu-node-1", "gpu-node-2"] + [f"n-{i:07d}" for i in range(routes.PARSE_INLINE_MAX_BYTES // 8)]
    )
    assert len(big) > routes.PARSE_INLINE_MAX_BYTES
    with client_for() as c:
        assert c.post(f"/{verb}", content=args(pod("p1"))).status_code == 200
        assert c.post(f"/{verb}", content=big).status_code == 200
    assert on_loop == [True, False]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": 5}', "Nodes: must be a NodeList object, not int"),
        (b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [1]}}', "Nodes.items[0].metadata.name: missing"),
        (b'{"Pod": 1, "Nodes": {"items": 1}}', "Pod: must be a Pod object, not int"),
        (b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": {}}}', "Nodes.items: must be a list"),
    ],
)
def test_bodies_of_another_shape_name_the_field(body: bytes, words: str) -> None:
    with pytest.raises(WireError, match=words.replace("[", r"\[").replace("]", r"\]")):
        wire.parse_args(body)


def test_node_names_next_to_an_odd_nodes_field_are_read_as_before() -> None:
    parsed = wire.parse_args(b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": 5, "NodeNames": ["a", "a", "b"]}')
    assert parsed.names == ["a", "b"] and parsed.node_cache_capable
