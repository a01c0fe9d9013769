"""The GPU node model, the pod reader and the pod's GPU request: pure data shared by every part of kelvin."""

from .claim import charge_milli, charged_milli, claim_of
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
from .gpu_models import item_matches, matches_any
from .pod import RequestError, key_of, pod_key
from .request import GpuRequest, Topology, parse_bound_pod, parse_pod, request_from_annotations
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
    "charge_milli",
    "charged_milli",
    "claim_of",
    "empty_snapshot",
    "item_matches",
    "key_of",
    "matches_any",
    "parse_bound_pod",
    "parse_pod",
    "pod_key",
    "request_from_annotations",
    "throttle_reason_names",
]
