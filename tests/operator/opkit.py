"""Builders of pod JSON and GPU nodes for the operator tests."""

from __future__ import annotations

from typing import Any

from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.gpu import GIB, GpuInfo, GpuNode, GpuProcess, ThrottleReason
from scheduler_plugin.model.times import format_time

T0 = 1_800_000_000.0  # a fixed "now" for pure tests


def pod(  # noqa: PLR0913
    name: str,
    *,
    node: str = "n1",
    ns: str = "ml",
    uid: str | None = None,
    priority: int = 0,
    priority_class: str = "",
    owner: str | None = "ReplicaSet",
    annotations: dict[str, str] | None = None,
    age_s: float = 3600.0,
    now: float = T0,
    gpus: int = 1,
    gpu_indices: str | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    anns = dict(annotations or {})
    if gpu_indices is not None:
        anns[ann.GPU_ASSIGNED] = gpu_indices
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "uid": uid or f"uid-{name}",
        "annotations": anns,
        "creationTimestamp": format_time(now - age_s),
    }
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": f"{name}-owner", "apiVersion": "apps/v1", "uid": "o"}]
    spec: dict[str, Any] = {
        "nodeName": node,
        "priority": priority,
        "containers": [{"name": "main", "resources": {"limits": {ann.GPU_RESOURCE: str(gpus)}} if gpus else {}}],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": phase, "startTime": format_time(now - age_s)},
    }


def gpu(
    index: int,
    temp: float = 50.0,
    *,
    trend: float = 0.0,
    throttled: bool = False,
    util: float = 0.5,
    procs: tuple[GpuProcess, ...] = (),
    total_gib: int = 80,
    model: str = "H100",
) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index}",
        model=model,
        memory_total_bytes=total_gib * GIB,
        memory_used_bytes=sum(p.used_bytes for p in procs),
        temperature_celsius=temp,
        throttle_reasons=int(ThrottleReason.HW_THERMAL_SLOWDOWN) if throttled else 0,
        temperature_trend_c_per_min=trend,
        utilization=util,
        processes=procs,
    )


def node(name: str, *gpus: GpuInfo, now: float = T0, mps: bool = False) -> GpuNode:
    return GpuNode(name=name, gpus=tuple(gpus) or (gpu(0),), observed_at=now, mps_enabled=mps)


def proc(pod_name: str, gib: float, sm: float | None = None, pid: int = 1) -> GpuProcess:
    return GpuProcess(pid=pid, used_bytes=int(gib * GIB), pod_uid=f"uid-{pod_name}", sm_utilization=sm)


def node_obj(
    name: str, *, tainted: bool = False, labels: dict[str, str] | None = None, gpus: int = 8
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if tainted:
        spec["taints"] = [{"key": ann.THERMAL_TAINT_KEY, "value": "hot", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"node-{name}", "labels": labels or {}, "resourceVersion": "1"},
        "spec": spec,
        "status": {"capacity": {ann.GPU_RESOURCE: str(gpus)}},
    }
