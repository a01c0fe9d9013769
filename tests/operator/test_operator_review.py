"""The AdmissionReview envelope (:mod:`kelvin_operator.review`): malformed bodies are refused naming the field, and
whatever it lets through the admission handlers process without an exception."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kelvin_operator.review import ReviewError, read_review
from kelvin_operator.webhooks import GpuSizes, mutate, validate
from opkit import gpu, node, pod

from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.snapshot import Snapshot

SNAP = Snapshot(nodes=(node("a", gpu(0, total_gib=80), mps=True),), taken_at=0.0)
SIZES = GpuSizes.of(SNAP)


def review(obj: Any = None, operation: str = "CREATE", **request: Any) -> dict[str, Any]:
    """An AdmissionReview as the API server sends it (a pool pod with env, selector and init container by default)."""
    if obj is None:
        obj = pod("p", gpus=1, annotations={ann.GPU_MEMORY: "20Gi", ann.GPU_SHARE: "250"})
        obj["spec"]["nodeSelector"] = {"kelvin.dev/mps": "true"}
        obj["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
        obj["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "1"}}}]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": operation,
            "namespace": "ml",
            "name": "p",
            "object": obj,
            "userInfo": {"username": "tester"},
            "dryRun": False,
            **request,
        },
    }


def edit(change: Callable[[dict[str, Any]], object]) -> bytes:
    r = review()
    change(r)
    return json.dumps(r).encode()


def obj(r: dict[str, Any]) -> dict[str, Any]:
    o: dict[str, Any] = r["request"]["object"]
    return o


def deep(depth: int) -> bytes:
    """A review whose pod spec holds arrays nested ``depth`` deep (written as text: json.dumps would recurse)."""
    return edit(lambda r: obj(r)["spec"].update(x="DEEP")).replace(b'"DEEP"', b"[" * depth + b"]" * depth)


# (what, body, what the message must say)
MALFORMED: list[tuple[str, bytes, str]] = [
    ("empty body", b"", "not UTF-8 JSON"),
    ("not JSON", b"hello", "not UTF-8 JSON"),
    ("JSON null", b"null", "the body: must be an object, not null"),
    ("an array", b"[]", "the body: must be an object, not an array"),
    ("an array of a review", json.dumps([review()]).encode(), "must be an object, not an array"),
    ("a string", b'"AdmissionReview"', "the body: must be an object, not a string"),
    ("a number", b"42", "must be an object, not a number"),
    ("UTF-16", json.dumps(review()).encode("utf-16"), "not UTF-8 JSON"),
    ("UTF-16-LE without BOM", json.dumps(review()).encode("utf-16-le"), "not UTF-8 JSON"),
    ("invalid UTF-8", edit(lambda r: obj(r)["metadata"].update(name="\udcff")).replace(b"\\udcff", b"\xff"), "UTF-8"),
    ("a lone surrogate", edit(lambda r: obj(r)["metadata"].update(name="\udcff")), "not UTF-8 JSON"),
    ("1,000 deep", deep(1000), "nested at most 200 deep"),
    ("10,000 deep", b"[" * 10000 + b"]" * 10000, "nested at most 200 deep"),
    ("trailing garbage", json.dumps(review()).encode() + b"}", "not UTF-8 JSON"),
    ("request missing", edit(lambda r: r.pop("request")), "request: missing"),
    ("request null", edit(lambda r: r.update(request=None)), "request: must be an object, not null"),
    ("request a string", edit(lambda r: r.update(request="x")), "request: must be an object, not a string"),
    ("wrong apiVersion", edit(lambda r: r.update(apiVersion="admission.k8s.io/v1beta1")), "apiVersion"),
    ("wrong kind", edit(lambda r: r.update(kind="Pod")), "kind"),
    ("uid missing", edit(lambda r: r["request"].pop("uid")), "request.uid: missing"),
    ("uid a number", edit(lambda r: r["request"].update(uid=7)), "request.uid"),
    ("operation unknown", edit(lambda r: r["request"].update(operation="PATCH")), "request.operation"),
    ("userInfo missing", edit(lambda r: r["request"].pop("userInfo")), "request.userInfo: missing"),
    ("resource missing", edit(lambda r: r["request"].pop("resource")), "request.resource: missing"),
    ("resource a string", edit(lambda r: r["request"].update(resource="pods")), "request.resource: must be an object"),
    (
        "not pods",
        edit(lambda r: r["request"]["resource"].update(group="apps", resource="deployments")),
        "judge pods (v1), not apps/v1/deployments",
    ),
    ("object missing", edit(lambda r: r["request"].pop("object")), "request.object: missing"),
    ("object null", edit(lambda r: r["request"].update(object=None)), "request.object: missing"),
    ("object a string", edit(lambda r: r["request"].update(object="pod")), "request.object: must be an object"),
    ("object an array", edit(lambda r: r["request"].update(object=[])), "request.object: must be an object"),
    ("metadata missing", edit(lambda r: obj(r).pop("metadata")), "request.object.metadata: missing"),
    ("metadata a string", edit(lambda r: obj(r).update(metadata="m")), "request.object.metadata: must be an object"),
    ("metadata null", edit(lambda r: obj(r).update(metadata=None)), "request.object.metadata: must be an object"),
    ("metadata an array", edit(lambda r: obj(r).update(metadata=[])), "request.object.metadata: must be an object"),
    ("annotations a list", edit(lambda r: obj(r)["metadata"].update(annotations=[])), "metadata.annotations"),
    (
        "an annotation a number",
        edit(lambda r: obj(r)["metadata"]["annotations"].update({ann.GPU_SHARE: 250})),
        f"request.object.metadata.annotations.{ann.GPU_SHARE}",
    ),
    ("spec a string", edit(lambda r: obj(r).update(spec="s")), "request.object.spec: must be an object"),
    ("containers an object", edit(lambda r: obj(r)["spec"].update(containers={})), "request.object.spec.containers"),
    ("a container a string", edit(lambda r: obj(r)["spec"].update(containers=["c"])), "spec.containers.0"),
    ("env a string", edit(lambda r: obj(r)["spec"]["containers"][0].update(env="A=1")), "spec.containers.0.env"),
    ("an env var a string", edit(lambda r: obj(r)["spec"]["containers"][0].update(env=["A"])), "containers.0.env.0"),
    ("an env var nameless", edit(lambda r: obj(r)["spec"]["containers"][0].update(env=[{}])), "env.0.name: missing"),
    (
        "resources a list",
        edit(lambda r: obj(r)["spec"]["containers"][0].update(resources=[])),
        "containers.0.resources",
    ),
    (
        "limits a string",
        edit(lambda r: obj(r)["spec"]["containers"][0]["resources"].update(limits="gpu")),
        "containers.0.resources.limits",
    ),
    (
        "a quantity an object",
        edit(lambda r: obj(r)["spec"]["containers"][0]["resources"]["limits"].update({ann.GPU_RESOURCE: {}})),
        f"resources.limits.{ann.GPU_RESOURCE}",
    ),
    (
        "a quantity a boolean",
        edit(lambda r: obj(r)["spec"]["containers"][0]["resources"]["limits"].update({ann.GPU_RESOURCE: True})),
        f"resources.limits.{ann.GPU_RESOURCE}",
    ),
    ("nodeSelector a list", edit(lambda r: obj(r)["spec"].update(nodeSelector=["a"])), "spec.nodeSelector"),
    ("initContainers a string", edit(lambda r: obj(r)["spec"].update(initContainers="i")), "spec.initContainers"),
    (
        "a DELETE without the object",
        edit(lambda r: r["request"].update(operation="DELETE", object=None)),
        "request.oldObject: missing",
    ),
    (
        "oldObject's metadata a string",
        edit(lambda r: r["request"].update(oldObject={"metadata": "m"})),
        "request.oldObject.metadata: must be an object",
    ),
]


@pytest.mark.parametrize(("what", "body", "says"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_review_is_refused_naming_the_field(what: str, body: bytes, says: str) -> None:
    with pytest.raises(ReviewError) as err:
        read_review(body)
    assert says in str(err.value), (what, str(err.value))
    assert "\n" not in str(err.value) and len(str(err.value)) < 600


def test_a_review_from_the_api_server_is_kept_as_sent() -> None:
    r = review()
    r["request"]["object"]["status"] = {"phase": "Pending", "conditions": [{"type": "x"}]}
    r["request"]["options"] = {"kind": "CreateOptions"}
    assert read_review(json.dumps(r).encode()) == r
    # a pod nested as deep as real ones get (affinity terms, volumes) is read
    r["request"]["object"]["spec"]["affinity"] = json.loads('{"a":' * 40 + "1" + "}" * 40)
    assert read_review(json.dumps(r).encode()) == r
    # CONNECT reviews carry options, not a pod (exec, attach, port-forward): not typed as one
    connect = review({"kind": "PodExecOptions", "command": ["sh"]}, "CONNECT", subResource="exec")
    assert read_review(json.dumps(connect).encode()) == connect
    # a DELETE carries the old object only
    delete = review(None, "DELETE")
    delete["request"]["oldObject"], delete["request"]["object"] = delete["request"]["object"], None
    assert read_review(json.dumps(delete).encode())["request"]["oldObject"]["metadata"]["name"] == "p"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*prefix, i))
    return out


BASE = review()
PATHS = [p for p in paths(BASE) if p]


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 6)
    if kind == 6:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(3))]
    if kind == 7:
        return {
            rng.choice(["", "name", "a", "metadata", "x"]): random_json(rng, depth + 1) for _ in range(rng.randrange(3))
        }
    return [
        None,
        True,
        rng.randrange(-(2**70), 2**70),
        rng.random() * 1e300,
        rng.choice(["", "x", "1", "20Gi", "\u00e9"]),
        {},
    ][kind]


def mutations(n: int, seed: int = 14) -> list[bytes]:
    """``n`` reviews, each :data:`BASE` with one field replaced by a random JSON value or removed (seeded)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = copy.deepcopy(BASE)
        where = rng.choice(PATHS)
        parent: Any = r
        for key in where[:-1]:
            parent = parent[key]
        if rng.random() < 0.2:
            del parent[where[-1]]
        else:
            parent[where[-1]] = random_json(rng)
        out.append(json.dumps(r).encode())
    return out


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(where=st.sampled_from(PATHS), value=JSON | st.just("__delete__"), shared=st.booleans())
def test_any_review_is_refused_or_handled_without_an_exception(
    where: tuple[Any, ...], value: Any, shared: bool
) -> None:
    """Any one field of a valid review replaced by any JSON value (or removed): either :func:`read_review` refuses
    it (a ReviewError naming a field) or both webhooks' decisions run on it without raising."""
    r = copy.deepcopy(BASE)
    parent: Any = r
    for key in where[:-1]:
        parent = parent[key]
    if value == "__delete__":
        del parent[where[-1]]
    else:
        parent[where[-1]] = value
    try:
        checked = read_review(json.dumps(r).encode())
    except ReviewError as exc:
        assert str(exc)
        return
    req = checked["request"]
    if req["operation"] == "CREATE" and req.get("subResource") is None:
        validate(req["object"], SIZES, shared_gpu_resource=shared)
        mutate(req["object"], snapshot=SNAP, mps_label="kelvin.dev/mps", framework_env=True, shared_gpu_resource=shared)
