"""Every reader of a pod's containers reads them alike (issue 15 item 6: model/pod.py), each caller type with its one
answer to an unreadable pod: the extender 400 (tests/extender), the validating webhook a rejection, the operator's
view an error and a best-effort count, the device plugin a refused Allocate."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kelvin_operator.handlers import _gpu_pod
from kelvin_operator.pods import pod_view
from kelvin_operator.webhooks import GpuSizes, mutate, validate
from opkit import pod

from scheduler_plugin.deviceplugin.allocation import AllocationError, grant
from scheduler_plugin.deviceplugin.devices import Gpu
from scheduler_plugin.model import RequestError, parse_pod
from scheduler_plugin.model import annotations as ann

GPU = ann.GPU_RESOURCE
GPUS = [Gpu(i, f"GPU-{i:08d}-0000-0000-0000-000000000000") for i in range(4)]


def with_containers(p: dict[str, Any], *, inits: list[Any] | None = None, apps: list[Any] | None = None) -> Any:
    if inits is not None:
        p["spec"]["initContainers"] = inits
    if apps is not None:
        p["spec"]["containers"] = apps
    p["status"] = {"phase": "Pending"}
    p["metadata"]["annotations"][ann.GPU_ASSIGNED_NODE] = "n1"
    return p


def differing() -> dict[str, Any]:
    """requests 2 GPUs, limits 1: before, the extender read 2, the operator and the device plugin 1."""
    res = {"requests": {GPU: "2"}, "limits": {GPU: "1"}}
    return with_containers(pod("d", gpus=0, gpu_indices="0,1"), apps=[{"name": "main", "resources": res}])


NAMED = f"container 'main' resource {GPU}="


def test_a_request_that_differs_from_its_limit_is_refused_by_every_reader() -> None:
    p = differing()
    with pytest.raises(RequestError, match=re.escape(NAMED)):
        parse_pod(p)
    msg = validate(p, GpuSizes.of(None))
    assert msg is not None and msg.startswith(f"invalid GPU request: {NAMED}")
    assert mutate(p, snapshot=None, mps_label="x", framework_env=True) is None  # left to the validating webhook
    view = pod_view(p)
    assert view.claim is None and view.request_error is not None and NAMED in view.request_error
    with pytest.raises(AllocationError, match=re.escape(f"pod ml/d: {NAMED}")):
        grant(p, node="n1", resource=GPU, count=1, gpus=GPUS)


def test_the_operators_best_effort_count_follows_the_effective_request_rule() -> None:
    """A pod whose annotation cannot be parsed: the operator still counts the GPUs it may hold. Before: app
    containers only, limits first (1 here); now Kubernetes' effective request over what can be read (2: the init
    container)."""
    p = pod("i", gpus=0, annotations={ann.GPU_SHARE: "lots"})
    inits = [{"name": "fetch", "resources": {"limits": {GPU: "2"}}}]
    apps = [{"name": "main", "resources": {"limits": {GPU: "1"}}}, {"name": "b", "resources": {"limits": {GPU: "x"}}}]
    view = pod_view(with_containers(p, inits=inits, apps=apps))
    assert view.request_error is not None and view.gpu_count == 2


def test_a_shared_slot_the_operator_cannot_parse_still_holds_a_gpu() -> None:
    """Before: 0 (only nvidia.com/gpu was counted), so the pod was taken for a CPU pod."""
    p = pod("s", gpus=0)
    p["spec"]["containers"][0]["resources"] = {"limits": {ann.SHARED_GPU_RESOURCE: "1"}}  # no size annotation
    view = pod_view(p)
    assert view.request_error is not None and view.gpu_count == 1


def test_the_operator_indexes_a_pod_whose_containers_cannot_be_read() -> None:
    """Its view then names the error; before, the malformed container was skipped and the pod not indexed."""
    spec = {"nodeName": "n1", "containers": [{"name": "a", "resources": "x"}]}
    assert _gpu_pod(spec, {}) is True
    assert pod_view({"metadata": {"name": "m"}, "spec": spec}).request_error is not None
    assert _gpu_pod({"nodeName": "n1", "containers": [{"name": "a"}]}, {}) is False
    init_gpu = {"nodeName": "n1", "initContainers": [{"name": "i", "resources": {"limits": {GPU: "1"}}}]}
    assert _gpu_pod(init_gpu, {}) is True
