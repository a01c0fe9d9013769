"""Small fleets for tests: GPUs, nodes and requests with readable defaults (shared by every unit test)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from scheduler_plugin.model import (
    GIB,
    FleetArrays,
    GpuAssignment,
    GpuInfo,
    GpuNode,
    GpuProcess,
    GpuRequest,
    build_arrays,
    request_from_annotations,
)
from scheduler_plugin.model import annotations as ann

NOW = 1_700_000_000.0


def gpu(  # noqa: PLR0913
    index: int,
    *,
    model: str = "A100",
    mem_gib: float = 80,
    used_gib: float = 0,
    temp: float = 50,
    slowdown: float = 87,
    shutdown: float = 92,
    throttle: int = 0,
    util: float = 0.0,
    mem_util: float = 0.0,
    xid: int = 0,
    numa: int = 0,
    switch: str = "",
    nvlink: Iterable[int] = (),
    trend: float = 0.0,
    clock: tuple[float, float] = (1410.0, 1410.0),
    processes: Sequence[GpuProcess] = (),
) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index:04d}",
        model=model,
        memory_total_bytes=int(mem_gib * GIB),
        memory_used_bytes=int(used_gib * GIB),
        temperature_celsius=temp,
        slowdown_celsius=slowdown,
        shutdown_celsius=shutdown,
        throttle_reasons=throttle,
        sm_clock_mhz=clock[0],
        sm_clock_max_mhz=clock[1],
        utilization=util,
        memory_utilization=mem_util,
        xid_errors=xid,
        numa_node=numa,
        pcie_switch=switch,
        nvlink_peers=frozenset(nvlink),
        temperature_trend_c_per_min=trend,
        processes=tuple(processes),
    )


def node(
    name: str,
    gpus: Sequence[GpuInfo],
    *,
    assignments: Sequence[GpuAssignment] = (),
    observed_at: float | None = NOW,
) -> GpuNode:
    return GpuNode(
        name=name,
        gpus=tuple(gpus),
        cpu_allocatable_milli=64000,
        memory_allocatable_bytes=512 * GIB,
        assignments=tuple(assignments),
        observed_at=observed_at,
    )


def dgx(name: str, n: int = 8, *, assignments: Sequence[GpuAssignment] = (), **kw: object) -> GpuNode:
    """``n`` GPUs all linked by NVLink (NVSwitch); two per PCIe switch; the first half on NUMA 0."""
    gpus = [
        gpu(i, numa=0 if i < n // 2 else 1, switch=f"sw{i // 2}", nvlink=[j for j in range(n) if j != i], **kw)  # type: ignore[arg-type]
        for i in range(n)
    ]
    return node(name, gpus, assignments=assignments)


def pcie_box(name: str, n: int = 8, *, assignments: Sequence[GpuAssignment] = (), **kw: object) -> GpuNode:
    """``n`` GPUs without NVLink; two per PCIe switch; the first half on NUMA 0."""
    gpus = [gpu(i, numa=0 if i < n // 2 else 1, switch=f"sw{i // 2}", **kw) for i in range(n)]  # type: ignore[arg-type]
    return node(name, gpus, assignments=assignments)


def nvlink_pairs(name: str, n: int = 8, *, assignments: Sequence[GpuAssignment] = (), **kw: object) -> GpuNode:
    """NVLink only within pairs (0-1, 2-3, ...), each pair on its own PCIe switch."""
    gpus = [
        gpu(i, numa=0 if i < n // 2 else 1, switch=f"sw{i // 2}", nvlink=[i ^ 1], **kw)  # type: ignore[arg-type]
        for i in range(n)
    ]
    return node(name, gpus, assignments=assignments)


def whole(pod: str, *gpus: int) -> GpuAssignment:
    return GpuAssignment(pod_key=f"default/{pod}", gpu_indices=tuple(gpus))


def shared(pod: str, gpu_index: int, *, milli: int = 500, mem_gib: float | None = None) -> GpuAssignment:
    return GpuAssignment(
        pod_key=f"default/{pod}",
        gpu_indices=(gpu_index,),
        milli=milli,
        memory_bytes=None if mem_gib is None else int(mem_gib * GIB),
    )


def fleet(*nodes: GpuNode) -> FleetArrays:
    return build_arrays(nodes)


def request(
    count: int = 1,
    *,
    memory: str | None = None,
    share: int | None = None,
    models: str | None = None,
    topology: str | None = None,
    max_temp: float | None = None,
    pod: str = "p",
    uid: str = "",
) -> GpuRequest:
    annotations: dict[str, str] = {}
    if memory is not None:
        annotations[ann.GPU_MEMORY] = memory
    if share is not None:
        annotations[ann.GPU_SHARE] = str(share)
    if models is not None:
        annotations[ann.GPU_MODELS] = models
    if topology is not None:
        annotations[ann.TOPOLOGY] = topology
    if max_temp is not None:
        annotations[ann.MAX_TEMPERATURE] = str(max_temp)
    return request_from_annotations(annotations, count=count, pod_key=f"default/{pod}", pod_uid=uid)


def pod(
    annotations: Mapping[str, str] | None = None, gpus: int | str | None = None, name: str = "p"
) -> dict[str, object]:
    """A Pod as API JSON (camelCase) with one container."""
    limits: dict[str, object] = {} if gpus is None else {"nvidia.com/gpu": gpus}
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "annotations": dict(annotations or {}),
        },
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits, "requests": {"cpu": "1"}}}]},
    }
