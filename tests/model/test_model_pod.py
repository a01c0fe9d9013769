"""The one pod reader (model/pod.py): Kubernetes' effective request, requests defaulted from limits, the pod key."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.model import RequestError, key_of, parse_pod, pod_key
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.pod import ContainerKind, effective, is_extended, readable_request
from scheduler_plugin.model.request import parse_gpu_count

GPU = ann.GPU_RESOURCE


def c(name: str, *, gpus: int = 0, cpu: str | None = None, sidecar: bool = False) -> dict[str, Any]:
    limits: dict[str, Any] = {GPU: str(gpus)} if gpus else {}
    requests: dict[str, Any] = {"cpu": cpu} if cpu else {}
    out: dict[str, Any] = {"name": name, "resources": {"limits": limits, "requests": requests}}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def pod_of(inits: list[dict[str, Any]], apps: list[dict[str, Any]], **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ml", **meta},
        "spec": {"initContainers": inits, "containers": apps},
    }


def test_sidecars_count_with_the_app_containers() -> None:
    """Before: a sidecar (init container with restartPolicy Always) counted as a regular init container, so
    max(sum(app), max(init)) = max(1, 1) = 1; it runs beside the app container: 1 + 1."""
    p = pod_of([c("proxy", gpus=1, cpu="500m", sidecar=True)], [c("main", gpus=1, cpu="1")])
    r = parse_pod(p)
    assert (r.count, r.cpu_milli) == (2, 1500)


def test_a_regular_init_container_runs_beside_the_sidecars_listed_before_it() -> None:
    """Kubernetes' effective init request: each init container plus the sidecars started before it (3 GPUs here);
    before, the largest init container alone (2)."""
    before = pod_of([c("proxy", gpus=1, sidecar=True), c("fetch", gpus=2)], [c("main", gpus=1)])
    assert parse_pod(before).count == 3
    after = pod_of([c("fetch", gpus=2), c("proxy", gpus=1, sidecar=True)], [c("main", gpus=1)])
    assert parse_pod(after).count == 2  # fetch ran alone; then main + proxy


def test_without_sidecars_the_rule_is_max_of_init_and_the_app_sum() -> None:
    assert parse_pod(pod_of([c("i", gpus=3)], [c("a", gpus=1), c("b", gpus=1)])).count == 3
    assert parse_pod(pod_of([c("i", gpus=1)], [c("a", gpus=1), c("b", gpus=1)])).count == 2


@pytest.mark.parametrize(
    ("kinds", "values", "want"),
    [
        ([], [], 0),
        ([ContainerKind.APP, ContainerKind.APP], [2, 3], 5),
        ([ContainerKind.INIT, ContainerKind.APP], [4, 1], 4),
        ([ContainerKind.SIDECAR, ContainerKind.INIT, ContainerKind.APP], [1, 4, 1], 5),
        ([ContainerKind.INIT, ContainerKind.SIDECAR, ContainerKind.APP], [4, 1, 1], 4),
        ([ContainerKind.SIDECAR, ContainerKind.SIDECAR, ContainerKind.APP], [1, 2, 0], 3),
    ],
)
def test_effective(kinds: list[ContainerKind], values: list[int], want: int) -> None:
    assert effective(kinds, values) == want


def test_a_missing_request_is_the_limit_and_a_given_request_wins() -> None:
    """The API server's defaulting: requests default to limits per resource; cpu may request less than its limit."""
    p = pod_of([], [{"name": "a", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2", "memory": "1Gi"}}}])
    r = parse_pod(p)
    assert (r.cpu_milli, r.host_memory_bytes) == (1000, 2**30)


def test_an_extended_resource_whose_request_and_limit_differ_is_refused() -> None:
    """Before: the extender read the request (2 GPUs) while the device plugin and the operator read the limit (1).
    The API server refuses such a pod; kelvin's one reader refuses it too, naming the container."""
    p = pod_of([], [{"name": "main", "resources": {"requests": {GPU: "2"}, "limits": {GPU: "1"}}}])
    with pytest.raises(RequestError) as e:
        parse_pod(p)
    assert e.value.field == f"container 'main' resource {GPU}" and "must be equal" in e.value.problem
    same = pod_of([], [{"name": "main", "resources": {"requests": {GPU: 1}, "limits": {GPU: "1"}}}])
    assert parse_pod(same).count == 1  # equal quantities, written differently


@pytest.mark.parametrize(
    ("resource", "extended"),
    [(GPU, True), (ann.SHARED_GPU_RESOURCE, True), ("cpu", False), ("memory", False), ("kubernetes.io/x", False)],
)
def test_is_extended(resource: str, extended: bool) -> None:
    assert is_extended(resource) is extended


def test_init_container_errors_name_the_init_containers() -> None:
    """Before: a bad ``resources`` of an init container was reported as ``spec.containers[i].resources``."""
    p = pod_of([{"name": "i", "resources": ["x"]}], [])
    with pytest.raises(RequestError) as e:
        parse_pod(p)
    assert e.value.field == "spec.initContainers[i].resources"


@pytest.mark.parametrize(
    ("namespace", "want"),
    [("ml", "ml/p"), (None, "default/p"), ("", "default/p")],
)
def test_one_pod_key(namespace: str | None, want: str) -> None:
    """Before: a null namespace made ``None/p`` in parse_pod and ``default/p`` in the operator; now one rule."""
    p = pod_of([], [c("main", gpus=1)], namespace=namespace)
    assert parse_pod(p).pod_key == key_of(p) == pod_key(namespace, "p") == want


@pytest.mark.parametrize("odd", [None, [], {"metadata": "x"}, {"metadata": None}])
def test_key_of_never_raises(odd: object) -> None:
    assert key_of(odd) == "default/"


def test_readable_request_counts_what_can_be_read() -> None:
    """The operator's reading of a pod kelvin cannot parse: unreadable values count 0, the rest by the same rule."""
    p = pod_of([c("i", gpus=2)], [c("a", gpus=1), {"name": "b", "resources": {"limits": {GPU: "lots"}}}])
    assert readable_request(p, GPU, parse_gpu_count) == 2
    assert readable_request({"spec": {"containers": "x"}}, GPU, parse_gpu_count) == 0


def test_a_pod_waits_from_its_creation() -> None:
    """The thermal policy prices a pod's wait (``pending_since``) from its ``creationTimestamp``."""
    assert parse_pod(pod_of([], [c("a", gpus=1)])).pending_since is None
    r = parse_pod(pod_of([], [c("a", gpus=1)], creationTimestamp="2026-01-02T03:04:05Z"))
    assert r.pending_since == 1767323045.0
    with pytest.raises(RequestError) as e:
        parse_pod(pod_of([], [c("a", gpus=1)], creationTimestamp="yesterday"))
    assert e.value.field == "metadata.creationTimestamp" and "RFC 3339" in e.value.problem
