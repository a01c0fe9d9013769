"""The pure allocation logic: which pod an Allocate is for, which GPUs and environment it gets, the preference."""

from __future__ import annotations

import re
from typing import Any

import pytest
from dpkit import NODE, pod

from scheduler_plugin.deviceplugin.allocation import (
    AllocationError,
    admission_order,
    allocated_annotation,
    close_binds,
    container_counts,
    container_needs,
    grant,
    next_indices,
    pick_pod,
    plan,
    preferred,
)
from scheduler_plugin.deviceplugin.devices import Gpu, device_ids, discover
from scheduler_plugin.deviceplugin.plugin import PluginConfig
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model import parse_pod
from scheduler_plugin.nvml.fake import FakeNvml

GPUS = [Gpu(i, f"GPU-{i:08d}-0000-0000-0000-000000000000", numa_node=i // 2) for i in range(4)]
WHOLE = ann.GPU_RESOURCE
SHARED = ann.SHARED_GPU_RESOURCE


def two_containers(assigned: str, allocated: str | None = None) -> dict[str, Any]:
    p = pod("multi", assigned=assigned)
    one = {"limits": {WHOLE: "1"}}
    p["spec"]["containers"] = [{"name": "a", "resources": one}, {"name": "b", "resources": one}]
    if allocated is not None:
        p["metadata"]["annotations"][ann.GPU_ALLOCATED] = allocated
    return p


def test_containers_of_one_pod_get_its_gpus_in_turn() -> None:
    p = two_containers("2,0")
    first = grant(pick_pod([p], node=NODE, resource=WHOLE, count=1), node=NODE, resource=WHOLE, count=1, gpus=GPUS)
    assert first.indices == (2,)
    assert first.allocated == ((2,),)
    p = two_containers("2,0", allocated="2")
    second = grant(pick_pod([p], node=NODE, resource=WHOLE, count=1), node=NODE, resource=WHOLE, count=1, gpus=GPUS)
    assert second.indices == (0,) and second.allocated == ((2,), (0,))
    assert second.envs == {"NVIDIA_VISIBLE_DEVICES": GPUS[0].uuid}
    assert allocated_annotation(second.allocated) == "2;0"
    with pytest.raises(AllocationError, match="no pending pod bound here is waiting"):
        pick_pod([two_containers("2,0", allocated="2;0")], node=NODE, resource=WHOLE, count=1)


def _with_init(p: dict[str, Any], count: int, *, sidecar: bool = False) -> dict[str, Any]:
    init: dict[str, Any] = {"name": "init", "resources": {"limits": {WHOLE: str(count)}}}
    if sidecar:
        init["restartPolicy"] = "Always"
    p["spec"]["initContainers"] = [init]
    return p


def _serve(p: dict[str, Any], count: int) -> tuple[int, ...]:
    """One Allocate: pick, grant, and record the grant on the pod as the plugin's patch does."""
    g = grant(pick_pod([p], node=NODE, resource=WHOLE, count=count), node=NODE, resource=WHOLE, count=count, gpus=GPUS)
    p["metadata"]["annotations"][ann.GPU_ALLOCATED] = allocated_annotation(g.allocated)
    return g.indices


def test_init_container_gpus_are_reused_by_the_app_container() -> None:
    # the extender charged max(app 2, init 1) = 2 GPUs; the kubelet calls Allocate for the init container, then for
    # the app container, which gets the init container's GPU again plus one
    p = _with_init(pod("p", gpus=2, assigned="3,1"), 1)
    assert _serve(p, 1) == (3,)
    assert _serve(p, 2) == (3, 1)
    assert p["metadata"]["annotations"][ann.GPU_ALLOCATED] == "3;3,1"
    with pytest.raises(AllocationError, match="no pending pod"):
        pick_pod([p], node=NODE, resource=WHOLE, count=2)


def test_init_container_does_not_take_another_pods_gpus() -> None:
    # before: after the init container gpu-allocated covered gpu-assigned and the app container took b's GPU
    a = _with_init(pod("a", gpus=1, assigned="0", scheduled="2026-12-01T04:00:00Z"), 1)
    b = pod("b", gpus=1, assigned="1", scheduled="2026-12-01T04:00:05Z")
    assert _serve(a, 1) == (0,)
    assert pick_pod([a, b], node=NODE, resource=WHOLE, count=1)["metadata"]["name"] == "a"
    assert _serve(a, 1) == (0,)


def test_sidecar_init_container_keeps_its_gpus() -> None:
    p = _with_init(pod("p", gpus=1, assigned="2,0"), 1, sidecar=True)
    assert _serve(p, 1) == (2,)
    assert _serve(p, 1) == (0,)
    too_short = _with_init(pod("q", gpus=1, assigned="2"), 1, sidecar=True)
    with pytest.raises(AllocationError, match=re.escape("ask for 1+1 nvidia.com/gpu (in all) but")):
        _serve(too_short, 1)


@pytest.mark.parametrize(
    ("inits", "apps"),
    [
        ([], [2]),
        ([(1, False)], [2]),
        ([(3, False)], [1]),
        ([(1, True)], [1]),  # before: the extender charged max(1, 1) = 1 GPU and the plugin refused the pod
        ([(1, True), (2, False)], [1]),
        ([(2, False), (1, True)], [1, 1]),
        ([(1, True), (1, True), (3, False)], [0, 1]),
    ],
)
def test_the_extender_assigns_exactly_the_gpus_the_plugin_hands_out(
    inits: list[tuple[int, bool]], apps: list[int]
) -> None:
    """One reading of the containers (model/pod.py): the effective request the extender assigns GPUs for is what
    the kubelet's per-container Allocate calls need, sidecars included (no fewer, no more)."""
    p = pod("p")
    p["spec"]["initContainers"] = [
        {"name": f"i{k}", "resources": {"limits": {WHOLE: str(n)}}, **({"restartPolicy": "Always"} if side else {})}
        for k, (n, side) in enumerate(inits)
    ]
    p["spec"]["containers"] = [{"name": f"a{k}", "resources": {"limits": {WHOLE: str(n)}}} for k, n in enumerate(apps)]
    count = parse_pod(p).count
    needs = container_needs(p, WHOLE)
    assert plan(range(count), needs) is not None
    assert plan(range(count - 1), needs) is None


def test_only_pending_pods_without_started_containers_are_candidates() -> None:
    # bound by kelvin before this plugin replaced NVIDIA's: gpu-assigned, no gpu-allocated, older than everything
    running = pod("running", gpus=1, assigned="0", scheduled="2026-12-01T01:00:00Z", phase="Running")
    started = pod("started", gpus=1, assigned="1", scheduled="2026-12-01T02:00:00Z")
    started["status"]["containerStatuses"] = [{"name": "main", "state": {"running": {}}, "started": True}]
    init_ran = pod("init-ran", gpus=1, assigned="2", scheduled="2026-12-01T03:00:00Z")
    init_ran["status"]["initContainerStatuses"] = [{"name": "i", "state": {"terminated": {"exitCode": 0}}}]
    new = pod("new", gpus=1, assigned="3", scheduled="2026-12-01T04:00:00Z")
    new["status"]["containerStatuses"] = [{"name": "main", "state": {"waiting": {"reason": "ContainerCreating"}}}]
    assert pick_pod([running, started, init_ran, new], node=NODE, resource=WHOLE, count=1)["metadata"]["name"] == "new"


def test_bind_time_in_nanoseconds_orders_pods_bound_in_the_same_second() -> None:
    same = "2026-12-01T04:00:00Z"
    first = pod(
        "z-first",
        gpus=1,
        assigned="0",
        scheduled=same,
        created="2026-12-01T03:59:30Z",
        annotations={ann.GPU_ASSIGNED_AT: "2026-12-01T04:00:00.000000100Z"},
    )
    second = pod(
        "a-second",
        gpus=1,
        assigned="1",
        scheduled=same,
        created="2026-12-01T03:59:00Z",
        annotations={ann.GPU_ASSIGNED_AT: "2026-12-01T04:00:00.000000200Z"},
    )
    assert pick_pod([second, first], node=NODE, resource=WHOLE, count=1)["metadata"]["name"] == "z-first"
    # bound 100 ns apart, created in the other order: the kubelet may admit them swapped
    assert close_binds(first, [first, second]) == [second]
    assert close_binds(second, [first]) == []  # created after: the kubelet's order agrees
    later = pod(
        "later",
        gpus=1,
        assigned="2",
        created="2026-12-01T03:00:00Z",
        annotations={ann.GPU_ASSIGNED_AT: "2026-12-01T04:00:03Z"},
    )
    assert close_binds(first, [later]) == []  # 3 s apart


def test_cdi_sets_visible_devices_to_void() -> None:
    g = grant(pod("p", gpus=1, assigned="1"), node=NODE, resource=WHOLE, count=1, gpus=GPUS, cdi_kind="nvidia.com/gpu")
    assert g.cdi_devices == (f"nvidia.com/gpu={GPUS[1].uuid}",)
    assert g.envs == {"NVIDIA_VISIBLE_DEVICES": "void"}  # CUDA images set it to "all"


def test_order_is_scheduled_time_then_creation_time() -> None:
    a = pod("a", gpus=1, assigned="0", scheduled="2026-12-01T04:00:02Z", created="2026-12-01T03:00:00Z")
    b = pod("b", gpus=1, assigned="1", scheduled="2026-12-01T04:00:01Z", created="2026-12-01T03:30:00Z")
    c = pod("c", gpus=1, assigned="2", scheduled="2026-12-01T04:00:01Z", created="2026-12-01T03:10:00Z")
    assert [p["metadata"]["name"] for p in sorted([a, b, c], key=admission_order)] == ["c", "b", "a"]
    assert pick_pod([a, b, c], node=NODE, resource=WHOLE, count=1)["metadata"]["name"] == "c"


def test_deleted_and_finished_pods_are_not_candidates() -> None:
    gone = pod("gone", gpus=1, assigned="0")
    gone["metadata"]["deletionTimestamp"] = "2026-12-01T04:01:00Z"
    failed = pod("failed", gpus=1, assigned="1", phase="Failed")
    with pytest.raises(AllocationError):
        pick_pod([gone, failed], node=NODE, resource=WHOLE, count=1)


def test_malformed_allocated_annotation_is_named() -> None:
    p = pod("p", gpus=1, assigned="1")
    p["metadata"]["annotations"][ann.GPU_ALLOCATED] = "one"
    with pytest.raises(AllocationError, match=re.escape("kelvin.dev/gpu-allocated='one' is not a ';'-separated")):
        grant(pick_pod([p], node=NODE, resource=WHOLE, count=1), node=NODE, resource=WHOLE, count=1, gpus=GPUS)


def test_bad_pool_annotation_is_named() -> None:
    p = pod("p", shared=1, assigned="1", annotations={ann.GPU_MEMORY: "lots"})
    with pytest.raises(
        AllocationError, match=re.escape("pod ml/p: kelvin.dev/gpu-memory='lots': not a memory quantity")
    ):
        grant(p, node=NODE, resource=SHARED, count=1, gpus=GPUS)


def test_whole_gpu_pod_without_pool_annotations_has_no_mps_env() -> None:
    g = grant(pod("p", gpus=2, assigned="1,3"), node=NODE, resource=WHOLE, count=2, gpus=GPUS)
    assert g.envs == {"NVIDIA_VISIBLE_DEVICES": f"{GPUS[1].uuid},{GPUS[3].uuid}"}


def test_compute_share_only_sets_the_thread_percentage() -> None:
    g = grant(
        pod("p", shared=1, assigned="0", annotations={ann.GPU_SHARE: "333"}),
        node=NODE,
        resource=SHARED,
        count=1,
        gpus=GPUS,
    )
    assert g.envs == {"NVIDIA_VISIBLE_DEVICES": GPUS[0].uuid, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "33"}


def test_container_counts_read_requests_defaulted_from_limits() -> None:
    """The request of each container, defaulted from its limit (model/pod.py), init containers first."""
    p = pod("p")
    p["spec"]["containers"] = [
        {"name": "a", "resources": {"requests": {WHOLE: "2"}}},
        {"name": "b", "resources": {"limits": {WHOLE: "1"}}},
        {"name": "c", "resources": {"requests": {WHOLE: "1"}, "limits": {WHOLE: "1"}}},
        {"name": "d", "resources": {"limits": {"cpu": "1"}}},
    ]
    p["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {WHOLE: "3"}}}]
    assert container_counts(p, WHOLE) == [3, 2, 1, 1]


@pytest.mark.parametrize(
    ("resources", "problem"),
    [
        ({"limits": {WHOLE: "1.5"}}, "not a whole number of GPUs"),
        ({"limits": {WHOLE: "x"}}, "not a quantity"),
        ({"requests": {WHOLE: "2"}, "limits": {WHOLE: "1"}}, "must be equal"),
    ],
)
def test_a_pod_whose_counts_cannot_be_read_is_refused_naming_the_container(
    resources: dict[str, Any], problem: str
) -> None:
    """Before: an unreadable count was logged and its container skipped (the next container's GPUs would have gone
    to the wrong one), and limits won over requests (the extender read requests). Now the pod's Allocate is refused
    with the field, and a differing request and limit are refused by every reader alike."""
    p = two_containers("0,1")
    p["spec"]["containers"][1]["resources"] = resources
    with pytest.raises(AllocationError, match=re.escape("pod ml/multi: container 'b' resource nvidia.com/gpu=")) as e:
        grant(p, node=NODE, resource=WHOLE, count=1, gpus=GPUS)
    assert problem in str(e.value)
    assert next_indices(p, WHOLE, 1) is None
    with pytest.raises(AllocationError, match=re.escape("pods whose containers cannot be read: ml/multi (container")):
        pick_pod([p], node=NODE, resource=WHOLE, count=1)


def test_an_unreadable_pod_does_not_stop_another_pods_allocate() -> None:
    bad = pod("bad", gpus=1, assigned="0", scheduled="2026-12-01T03:00:00Z")
    bad["spec"]["containers"][0]["resources"] = {"limits": {WHOLE: "one"}}
    good = pod("good", gpus=1, assigned="1")
    assert pick_pod([bad, good], node=NODE, resource=WHOLE, count=1) is good


def test_preferred_fills_from_available_when_kelvins_gpu_is_taken() -> None:
    ids = [g.uuid for g in GPUS]
    # kelvin's GPU 1 is not available (the kubelet gave it away): the first available fills the gap
    assert preferred((1,), resource=WHOLE, gpus=GPUS, available=[ids[0], ids[2]], must_include=[], size=1) == [ids[0]]
    slots = [d for d, _ in device_ids(SHARED, GPUS, 2)]
    assert preferred((3,), resource=SHARED, gpus=GPUS, available=slots, must_include=[], size=1) == [f"{ids[3]}::0"]
    assert next_indices(pod("p", gpus=1, assigned="bad"), WHOLE, 1) is None
    assert next_indices(_with_init(pod("p", gpus=2, assigned="3,1"), 1), WHOLE, 1) == (3,)


def test_mig_gpus_are_not_served() -> None:
    fake = FakeNvml(3, "A100-SXM-80GB")
    fake.gpus[1].mig_enabled = True
    fake.nvmlInit()
    assert [g.index for g in discover(fake)] == [0, 2]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"node": ""}, "node name is empty"),
        ({"resources": ("nvidia.com/mig-1g.10gb",)}, "'nvidia.com/mig-1g.10gb' is not one of"),
        ({"resources": ()}, "serve at least one resource"),
        ({"slots": 0}, "shared slots per GPU must be 1..128"),
    ],
)
def test_plugin_config_refuses_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PluginConfig(**{"node": NODE, **kwargs})


def test_a_gpu_lost_at_startup_is_left_out() -> None:
    fake = FakeNvml(3, "H100-SXM-80GB")
    fake.nvmlInit()
    fake.lose_gpu(1)
    assert [g.index for g in discover(fake)] == [0, 2]
