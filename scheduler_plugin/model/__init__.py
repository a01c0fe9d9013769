"""The GPU node model and the pod's GPU request: pure data shared by every part of kelvin."""

from .gpu import (
    GIB,
    MIB,
    MILLI_PER_GPU,
    SLOWDOWN_MASK,
    THERMAL_THROTTLE_MASK,
    GpuAssignment,
    GpuInfo,
    GpuNode,
    GpuProcess,
    ThrottleReason,
    throttle_reason_names,
)
from .request import GpuRequest, RequestError, Topology, parse_pod, request_from_annotations
from .snapshot import FleetArrays, Snapshot, build_arrays, empty_snapshot

__all__ = [
    "GIB",
    "MIB",
    "MILLI_PER_GPU",
    "SLOWDOWN_MASK",
    "THERMAL_THROTTLE_MASK",
    "FleetArrays",
    "GpuAssignment",
    "GpuInfo",
    "GpuNode",
    "GpuProcess",
    "GpuRequest",
    "RequestError",
    "Snapshot",
    "ThrottleReason",
    "Topology",
    "build_arrays",
    "empty_snapshot",
    "parse_pod",
    "request_from_annotations",
    "throttle_reason_names",
]
