"""Pure admission decisions: validation messages and the injected environment."""

from __future__ import annotations

from typing import Any

from kelvin_operator.webhooks import GpuSizes, mutate, runs_mps, validate
from opkit import gpu, node, pod

from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.snapshot import Snapshot

SNAP = Snapshot(
    nodes=(node("a", gpu(0, total_gib=80)), node("b", gpu(0, total_gib=40, model="A100-40GB"))), taken_at=0.0
)
SIZES = GpuSizes.of(SNAP)


def env_of(containers: list[dict] | None) -> dict[str, str]:
    assert containers is not None
    return {e["name"]: e["value"] for e in containers[0]["env"]}


def test_validate() -> None:
    assert validate(pod("ok", gpus=1, annotations={ann.GPU_MEMORY: "40Gi"}), SIZES) is None
    msg = validate(pod("big", gpus=1, annotations={ann.GPU_MEMORY: "81Gi"}), SIZES)
    assert msg is not None and "largest GPU in the cluster (H100, 80.0 GiB)" in msg
    # no telemetry yet: the size cannot be judged, the quantity still is
    assert validate(pod("big", gpus=1, annotations={ann.GPU_MEMORY: "81Gi"}), GpuSizes.of(None)) is None
    assert "must be more than zero" in (validate(pod("z", gpus=1, annotations={ann.GPU_MEMORY: "0Gi"}), SIZES) or "")
    unknown = pod("m", gpus=1, annotations={ann.GPU_MEMORY: "8Gi", ann.GPU_MODELS: "B200"})
    assert "no GPU of the models B200" in (validate(unknown, SIZES) or "")
    assert validate(pod("whole", gpus=4), SIZES) is None


def test_mutate_without_mps_and_two_gpu_sizes() -> None:
    p = pod("p", gpus=0, annotations={ann.GPU_MEMORY: "20Gi"})
    env = env_of(mutate(p, snapshot=SNAP, mps_label="kelvin.dev/mps", framework_env=True))
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env  # no MPS pool
    assert env["KELVIN_GPU_MEMORY_LIMIT_BYTES"] == str(20 * 2**30)
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env  # 40 and 80 GiB GPUs: no single exact fraction
    # frameworkEnv off: only kelvin's own limit variable, none of the TF/XLA/PyTorch ones
    off = env_of(mutate(p, snapshot=SNAP, mps_label="kelvin.dev/mps", framework_env=False))
    assert off == {"KELVIN_GPU_MEMORY_LIMIT_BYTES": str(20 * 2**30)}


def test_mutate_mps_by_node_selector_keeps_user_env() -> None:
    p = pod("p", gpus=0, annotations={ann.GPU_MEMORY: "10Gi", ann.GPU_SHARE: "300"})
    p["spec"]["nodeSelector"] = {"kelvin.dev/mps": "true"}
    p["spec"]["containers"][0]["env"] = [{"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "false"}]
    assert runs_mps(p, "kelvin.dev/mps", SNAP)
    env = env_of(mutate(p, snapshot=SNAP, mps_label="kelvin.dev/mps", framework_env=True))
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"  # the pod's own value wins


def test_mutate_leaves_whole_gpu_and_invalid_pods() -> None:
    assert mutate(pod("w", gpus=2), snapshot=SNAP, mps_label="kelvin.dev/mps", framework_env=True) is None
    bad = pod("b", gpus=0, annotations={ann.GPU_MEMORY: "lots"})
    assert mutate(bad, snapshot=SNAP, mps_label="kelvin.dev/mps", framework_env=True) is None


def test_absurd_memory_pool_is_refused_naming_the_annotation() -> None:
    # 1e400 bytes used to parse and then overflow the operator's float maths (and the webhook answered 500)
    reason = validate(pod("p", gpus=1, annotations={ann.GPU_MEMORY: "1e400"}), SIZES)
    assert reason is not None and "kelvin.dev/gpu-memory='1e400'" in reason and "exponent out of range" in reason


def with_resource(p: dict[str, Any], name: str, container: int = 0, kind: str = "containers") -> dict[str, Any]:
    c = p["spec"].setdefault(kind, [{"name": "init"}])[container]
    c.setdefault("resources", {}).setdefault("limits", {})[name] = "1"
    return p


def test_pool_only_pod_is_rejected_naming_both_fixes() -> None:
    """A pool or share without any GPU resource never reaches the extender (managedResources): refused at admission."""
    for anns in ({ann.GPU_MEMORY: "20Gi"}, {ann.GPU_SHARE: "300"}):
        msg = validate(pod("p", gpus=0, annotations=anns), SIZES)
        assert msg is not None, anns
        assert "no container requests a GPU resource (nvidia.com/gpu or kelvin.dev/shared-gpu)" in msg
        assert "request nvidia.com/gpu: 1" in msg and "devicePlugin.enabled=true" in msg
    # either GPU resource, in a container or an init container, takes the pod to the extender
    assert (
        validate(with_resource(pod("p", gpus=0, annotations={ann.GPU_MEMORY: "20Gi"}), ann.GPU_RESOURCE), SIZES) is None
    )
    shared = with_resource(pod("p", gpus=0, annotations={ann.GPU_MEMORY: "20Gi"}), ann.SHARED_GPU_RESOURCE)
    assert validate(shared, SIZES, shared_gpu_resource=True) is None
    init = with_resource(pod("p", gpus=0, annotations={ann.GPU_SHARE: "300"}), ann.GPU_RESOURCE, kind="initContainers")
    assert validate(init, SIZES) is None
    # pods without kelvin's share annotations are not concerned
    assert validate(pod("cpu", gpus=0), SIZES) is None


def test_mutate_requests_a_shared_gpu_slot_for_a_pool_only_pod() -> None:
    p = pod("p", gpus=0, annotations={ann.GPU_MEMORY: "20Gi"})
    p["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    args: dict[str, Any] = {"snapshot": SNAP, "mps_label": "kelvin.dev/mps", "framework_env": False}
    containers = mutate(p, shared_gpu_resource=True, **args)
    assert containers is not None
    res = containers[0]["resources"]
    assert res == {"requests": {"cpu": "1", "kelvin.dev/shared-gpu": "1"}, "limits": {"kelvin.dev/shared-gpu": "1"}}
    assert env_of(containers)["KELVIN_GPU_MEMORY_LIMIT_BYTES"] == str(20 * 2**30)
    assert "kelvin.dev/shared-gpu" not in p["spec"]["containers"][0]["resources"]["requests"]  # input untouched
    # the validating webhook sees the mutated pod: admitted; unmutated, it is refused with the right advice
    mutated = {**p, "spec": {**p["spec"], "containers": containers}}
    assert validate(mutated, SIZES, shared_gpu_resource=True) is None
    assert "did not run" in (validate(p, SIZES, shared_gpu_resource=True) or "")
    # off (no device plugin): no slot is requested, the validating webhook refuses instead
    off = mutate(p, shared_gpu_resource=False, **args)
    assert off is not None and "kelvin.dev/shared-gpu" not in off[0]["resources"]["requests"]
    # a pod that requests a GPU resource already is left as it is
    whole = with_resource(pod("w", gpus=0, annotations={ann.GPU_MEMORY: "20Gi"}), ann.GPU_RESOURCE)
    kept = mutate(whole, shared_gpu_resource=True, **args)
    assert kept is not None and "kelvin.dev/shared-gpu" not in kept[0]["resources"]["limits"]


def test_the_slot_goes_to_kubectls_default_container() -> None:
    p = pod("p", gpus=0, annotations={ann.GPU_SHARE: "250", "kubectl.kubernetes.io/default-container": "train"})
    p["spec"]["containers"] = [{"name": "sidecar"}, {"name": "train"}]
    containers = mutate(p, snapshot=SNAP, mps_label="kelvin.dev/mps", framework_env=True, shared_gpu_resource=True)
    assert containers is not None
    assert "resources" not in containers[0]
    assert containers[1]["resources"]["limits"] == {"kelvin.dev/shared-gpu": "1"}
    # an annotation naming no container: the first one
    p["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] = "gone"
    first = mutate(p, snapshot=SNAP, mps_label="kelvin.dev/mps", framework_env=True, shared_gpu_resource=True)
    assert first is not None and first[0]["resources"]["limits"] == {"kelvin.dev/shared-gpu": "1"}


def test_largest_gpu_matches_models_by_family_on_real_nvml_names() -> None:
    """Before: ``A100`` was compared with the whole NVML name and matched nothing, so a valid pool was refused."""
    snap = Snapshot(
        nodes=(
            node("a", gpu(0, total_gib=80, model="NVIDIA A100-SXM4-80GB")),
            node("b", gpu(0, total_gib=40, model="NVIDIA A100-SXM4-40GB")),
            node("c", gpu(0, total_gib=24, model="NVIDIA A10")),
        ),
        taken_at=0.0,
    )
    sizes = GpuSizes.of(snap)
    assert sizes.largest(frozenset({"A100"})) == ("NVIDIA A100-SXM4-80GB", 80 * 2**30)
    assert sizes.largest(frozenset({"a100-40gb"})) == ("NVIDIA A100-SXM4-40GB", 40 * 2**30)
    assert sizes.largest(frozenset({"A10"})) == ("NVIDIA A10", 24 * 2**30)
    assert validate(pod("p", gpus=1, annotations={ann.GPU_MEMORY: "60Gi", ann.GPU_MODELS: "A100"}), sizes) is None


def test_gpu_memory_without_a_unit_is_refused_at_admission() -> None:
    reason = validate(pod("p", gpus=1, annotations={ann.GPU_MEMORY: "20"}), SIZES)
    assert reason is not None and "kelvin.dev/gpu-memory='20'" in reason and "give one, e.g. 20Gi" in reason


def test_a_shared_gpu_request_is_refused_when_no_device_plugin_serves_it() -> None:
    """Without webhook.sharedGpuResource no node advertises kelvin.dev/shared-gpu: a pod requesting it (by hand, in a
    container or an init container, as a request or a limit) would stay Pending, so admission refuses it."""
    pools = {ann.GPU_MEMORY: "20Gi"}
    for p, admitted_with_plugin in (
        (with_resource(pod("p", gpus=0, annotations=pools), ann.SHARED_GPU_RESOURCE), True),
        (with_resource(pod("p", gpus=0, annotations=pools), ann.SHARED_GPU_RESOURCE, kind="initContainers"), True),
        # no pool annotation: the missing device plugin is named first (the missing size is said once it is on)
        (with_resource(pod("p", gpus=0), ann.SHARED_GPU_RESOURCE), False),
    ):
        msg = validate(p, SIZES)
        assert msg is not None
        assert msg.startswith("the pod requests kelvin.dev/shared-gpu, which no node advertises")
        assert "devicePlugin.enabled" in msg and "request nvidia.com/gpu: 1 instead" in msg.lower()
        assert (validate(p, SIZES, shared_gpu_resource=True) is None) is admitted_with_plugin
    request_only = pod("p", gpus=0, annotations=pools)
    request_only["spec"]["containers"][0]["resources"] = {"requests": {ann.SHARED_GPU_RESOURCE: "1"}}
    assert "no node advertises" in (validate(request_only, SIZES) or "")
    # whole GPUs are unaffected
    assert validate(with_resource(pod("w", gpus=0, annotations=pools), ann.GPU_RESOURCE), SIZES) is None
