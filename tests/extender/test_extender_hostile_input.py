"""Bodies built to break the extender (issue 14): sums that overflow int64, JSON nested past the decoder's depth,
invalid UTF-8, non-ASCII numbers. Each gets a 400 naming the field, and none of them can poison the state later
requests share (the learned workload, the request memo)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from ext_helpers import args, make_extender, pod
from fastapi.testclient import TestClient

from scheduler_plugin.extender.app import create_app
from scheduler_plugin.extender.binder import LocalBinder
from scheduler_plugin.extender.service import Extender


@pytest.fixture
def ext() -> Extender:
    return make_extender(binder=LocalBinder())[0]


@pytest.fixture
def client(ext: Extender) -> Iterator[TestClient]:
    with TestClient(create_app(ext)) as c:
        yield c


def containers_pod(name: str, resource: str, value: str, n: int = 2) -> dict[str, Any]:
    """A 1-GPU pod with ``n`` containers each requesting ``resource: value`` (each value alone is in range)."""
    p = pod(name)
    p["spec"]["containers"] = [
        {"name": f"c{i}", "resources": {"requests": {"nvidia.com/gpu": "1" if i == 0 else "0", resource: value}}}
        for i in range(n)
    ]
    return p


def assert_normal_pod_is_served(c: TestClient, name: str) -> None:
    """prioritize, explain and bind of an ordinary 1-GPU pod all succeed."""
    p = pod(name)
    r = c.post("/prioritize", content=args(p))
    assert r.status_code == 200, r.text
    assert [h["Host"] for h in r.json()] == ["gpu-node-1", "gpu-node-2"]
    r = c.post("/explain", json={"pod": p, "node": "gpu-node-2"})
    assert r.status_code == 200, r.text
    assert r.json()["fits"] is True
    r = c.post("/filter", content=args(p))
    assert r.status_code == 200 and r.json()["Error"] == ""
    bind = {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}", "Node": "gpu-node-2"}
    r = c.post("/bind", json=bind)
    assert r.status_code == 200 and r.json() == {"Error": ""}, r.text


# -- item 1 and 2: sums of a pod's requests are checked like single values ------------------------------------------


@pytest.mark.parametrize(
    ("resource", "value"),
    [("memory", "7Ei"), ("cpu", "9223372036854775")],
)
def test_requests_that_add_up_past_int64_are_400_naming_the_resource_and_poison_nothing(
    client: TestClient, resource: str, value: str
) -> None:
    # each value alone is accepted: the single-value bound is not what refuses the pod
    one = client.post("/prioritize", content=args(containers_pod("single", resource, value, n=1)))
    assert one.status_code == 200, one.text
    for i in range(12):
        body = args(containers_pod(f"big-{i}", resource, value))
        r = client.post("/prioritize", content=body)
        assert r.status_code == 400, r.text
        assert f"resource {resource}" in r.json()["Error"] and "more than 9223372036854775807" in r.json()["Error"]
        f = client.post("/filter", content=body).json()
        assert f["Error"] == "" and f["NodeNames"] == []
        assert f"resource {resource}" in f["FailedAndUnresolvableNodes"]["gpu-node-1"]
    r = client.post("/explain", json={"pod": containers_pod("big-x", resource, value), "node": "gpu-node-1"})
    assert r.status_code == 400, r.text
    assert f"resource {resource}" in r.json()["Error"]
    assert_normal_pod_is_served(client, "normal")


def test_overhead_on_top_of_the_containers_is_checked_too(client: TestClient) -> None:
    p = containers_pod("ovh", "memory", "7Ei", n=1)
    p["spec"]["overhead"] = {"memory": "2Ei"}
    r = client.post("/prioritize", content=args(p))
    assert r.status_code == 400 and "resource memory" in r.json()["Error"]


def test_pods_as_big_as_int64_allows_do_not_break_the_learned_workload(client: TestClient) -> None:
    """Pods at the very top of the accepted range, seen many times: the workload they feed stays usable."""
    for i in range(40):
        p = containers_pod(f"huge-{i}", "memory", "7Ei", n=1)
        p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "9223372036854775"
        assert client.post("/prioritize", content=args(p)).status_code == 200
    assert_normal_pod_is_served(client, "after-huge")


def test_whole_gpus_summed_over_containers_are_bounded(client: TestClient) -> None:
    p = pod("many")
    p["spec"]["containers"] = [{"name": f"c{i}", "resources": {"limits": {"nvidia.com/gpu": "1024"}}} for i in range(2)]
    r = client.post("/prioritize", content=args(p))
    assert r.status_code == 400 and "resource nvidia.com/gpu" in r.json()["Error"]


def test_a_gpu_request_that_differs_from_its_limit_is_a_400_naming_the_container(client: TestClient) -> None:
    """The API server refuses such a pod; kelvin's one pod reader (model/pod.py) too, instead of reading the request
    here and the limit in the device plugin (issue 15 item 6)."""
    p = pod("differs")
    p["spec"]["containers"] = [
        {"name": "main", "resources": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "1"}}}
    ]
    named = "container 'main' resource nvidia.com/gpu"
    r = client.post("/prioritize", content=args(p))
    assert r.status_code == 400 and named in r.json()["Error"] and "must be equal" in r.json()["Error"]
    f = client.post("/filter", content=args(p)).json()  # filter fails every node, unresolvable, with the reason
    assert f["NodeNames"] == [] and named in f["FailedAndUnresolvableNodes"]["gpu-node-1"]
    assert_normal_pod_is_served(client, "after-differs")


# -- item 3: JSON nested past the decoder's depth ---------------------------------------------------------------------


@pytest.fixture
def default_recursion_limit() -> Iterator[None]:
    """The interpreter's default recursion limit, as in production: msgspec's depth limit on Python 3.11 is the
    recursion limit, and importing celpy (the chart tests' CEL evaluator) raises it to 2,500 for the process."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


def _deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


@pytest.mark.parametrize(
    "body",
    [
        b'{"Pod": ' + _deep(1024) + b', "NodeNames": []}',
        b'{"Pod": {"metadata": {"name": "p", "labels": ' + _deep(1024) + b'}}, "NodeNames": ["gpu-node-1"]}',
        b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"metadata": {"name": "n"}, "x": '
        + _deep(1024)
        + b"}]}}",
    ],
    ids=["pod", "inside-pod", "inside-node"],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize", "explain"])
@pytest.mark.usefixtures("default_recursion_limit")
def test_json_nested_too_deep_is_400(client: TestClient, verb: str, body: bytes) -> None:
    r = client.post(f"/{verb}", content=body)
    assert r.status_code == 400, r.text
    assert "JSON" in r.json()["Error"] and ("deep" in r.json()["Error"] or "recursion" in r.json()["Error"])
    assert_normal_pod_is_served(client, f"after-deep-{verb}")


# -- item 4: invalid UTF-8 in Node objects ----------------------------------------------------------------------------


def _nodes_body(node_json: bytes) -> bytes:
    return b'{"Pod": %s, "Nodes": {"items": [%s, {"metadata": {"name": "gpu-node-2"}}]}}' % (
        json.dumps(pod()).encode(),
        node_json,
    )


@pytest.mark.parametrize(
    "node_json",
    [
        b'{"metadata": {"name": "gpu-node-\xff1"}}',
        b'{"metadata": {"name": "gpu-node-1", "labels": {"zone": "a\xc3"}}}',
        b'{"metadata": {"name": "gpu-node-1"}, "status": {"x": "\xed\xa0\x80"}}',  # an encoded surrogate
    ],
    ids=["name", "label", "surrogate"],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_invalid_utf8_in_a_node_object_is_400_naming_the_node(client: TestClient, verb: str, node_json: bytes) -> None:
    r = client.post(f"/{verb}", content=_nodes_body(node_json))
    assert r.status_code == 400, r.content
    assert "Nodes.items[0]" in r.json()["Error"] and "UTF-8" in r.json()["Error"]
    r.content.decode("utf-8")  # kelvin's reply is valid UTF-8


def test_node_objects_with_valid_non_ascii_text_are_echoed_verbatim(client: TestClient) -> None:
    node = '{"metadata": {"name": "gpu-node-1", "labels": {"team": "Zürich-ü"}}}'.encode()
    r = client.post("/filter", content=_nodes_body(node))
    assert r.status_code == 200 and r.json()["Error"] == ""
    assert node.replace(b" ", b"") in r.content.replace(b" ", b"")


def test_invalid_utf8_in_names_mode_is_400(client: TestClient) -> None:
    body = b'{"Pod": %s, "NodeNames": ["gpu-node-\xff"]}' % json.dumps(pod()).encode()
    for verb in ("filter", "prioritize"):
        r = client.post(f"/{verb}", content=body)
        assert r.status_code == 400 and "not valid JSON" in r.json()["Error"]


# -- item 5: annotations and quantities are ASCII ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        ("kelvin.dev/gpu-share", "٥٠٠"),
        ("kelvin.dev/gpu-share", "5_00"),
        ("kelvin.dev/gpu-share", "१००"),
        ("kelvin.dev/gpu-memory", "２０Gi"),
        ("kelvin.dev/max-temperature", "٧٨"),
        ("kelvin.dev/max-temperature", "7_8"),
    ],
)
def test_non_ascii_numbers_in_annotations_are_refused(client: TestClient, annotation: str, value: str) -> None:
    body = client.post("/filter", content=args(pod(annotations={annotation: value}))).json()
    assert body["NodeNames"] == [] and body["Error"] == ""
    assert annotation in body["FailedAndUnresolvableNodes"]["gpu-node-1"]
    r = client.post("/prioritize", content=args(pod(annotations={annotation: value})))
    assert r.status_code == 400 and annotation in r.json()["Error"]


@pytest.mark.parametrize("value", ["١", "２", "1_0"])
def test_non_ascii_quantities_in_container_requests_are_refused(client: TestClient, value: str) -> None:
    p = pod("q")
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = value
    r = client.post("/prioritize", content=args(p))
    assert r.status_code == 400 and "nvidia.com/gpu" in r.json()["Error"]
    p = containers_pod("m", "memory", f"{value}Gi", n=1)
    r = client.post("/prioritize", content=args(p))
    assert r.status_code == 400 and "memory" in r.json()["Error"]
