"""Pure admission decisions: validation messages and the injected environment."""

from __future__ import annotations

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
    assert validate(pod("ok", gpus=0, annotations={ann.GPU_MEMORY: "40Gi"}), SIZES) is None
    msg = validate(pod("big", gpus=0, annotations={ann.GPU_MEMORY: "81Gi"}), SIZES)
    assert msg is not None and "largest GPU in the cluster (H100, 80.0 GiB)" in msg
    # no telemetry yet: the size cannot be judged, the quantity still is
    assert validate(pod("big", gpus=0, annotations={ann.GPU_MEMORY: "81Gi"}), GpuSizes.of(None)) is None
    assert "must be more than zero" in (validate(pod("z", gpus=0, annotations={ann.GPU_MEMORY: "0Gi"}), SIZES) or "")
    unknown = pod("m", gpus=0, annotations={ann.GPU_MEMORY: "8Gi", ann.GPU_MODELS: "B200"})
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
    assert validate(pod("p", gpus=0, annotations={ann.GPU_MEMORY: "60Gi", ann.GPU_MODELS: "A100"}), sizes) is None


def test_gpu_memory_without_a_unit_is_refused_at_admission() -> None:
    reason = validate(pod("p", gpus=0, annotations={ann.GPU_MEMORY: "20"}), SIZES)
    assert reason is not None and "kelvin.dev/gpu-memory='20'" in reason and "give one, e.g. 20Gi" in reason
