"""The CUDA MPS limits of a shared-GPU request: what the operator's mutating webhook injects and what the device plugin
returns at Allocate, so that both give a container the same limits."""

from __future__ import annotations

from .gpu import MIB, MILLI_PER_GPU
from .request import GpuRequest

MPS_MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


def mps_limits(req: GpuRequest) -> dict[str, str]:
    """``{variable: value}`` for a memory pool (pinned device memory of device 0, the container's only visible GPU, in
    MiB) and a compute share (active thread percentage, at least 1); empty for whole GPUs."""
    if not req.shared:
        return {}
    out: dict[str, str] = {}
    if req.memory_bytes is not None:
        out[MPS_MEMORY_ENV] = f"0={req.memory_bytes // MIB}M"
    if req.milli is not None and req.milli < MILLI_PER_GPU:
        out[MPS_THREADS_ENV] = str(max(1, round(req.milli / 10)))
    return out
