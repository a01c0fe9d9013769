"""Which pod a kubelet Allocate call is for, which GPUs it gets and with which environment. Pure functions.

The kubelet does not say which pod it allocates devices for, only how many devices of a resource one container
needs. As in gpushare-device-plugin, the pod is found among the pods of this node: bound here (``spec.nodeName``),
not finished or deleted, carrying kelvin's ``kelvin.dev/gpu-assigned`` for this node, with a container that requests
exactly that many devices of the resource, and with assigned GPUs not yet handed out (``kelvin.dev/gpu-allocated``).
The oldest such pod (PodScheduled condition time, then creation time) is the one: the kubelet admits pods in order.
A pod the plugin cannot serve exactly gets an :class:`AllocationError` whose message the kubelet shows on the pod;
never another GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..model import MIB, MILLI_PER_GPU, RequestError, request_from_annotations
from ..model import annotations as ann
from ..model.quantity import QuantityError, parse_quantity
from ..telemetry.assignments import parse_gpu_indices
from .devices import SHARED_RESOURCE, WHOLE_RESOURCE, Gpu, gpu_uuid_of

_DONE_PHASES = frozenset({"Succeeded", "Failed"})
_NEVER = datetime.max.replace(tzinfo=UTC)
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
MPS_MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


class AllocationError(Exception):
    """The Allocate call cannot be served; the message is for the pod's events (the kubelet shows it)."""


@dataclass(frozen=True, slots=True)
class Grant:
    """What one container gets: the pod it belongs to, its GPUs and what the container runtime needs."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    indices: tuple[int, ...]
    """The GPUs (NVML indices) this container gets."""
    allocated: tuple[int, ...]
    """The pod's ``kelvin.dev/gpu-allocated`` after this grant."""
    envs: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def container_counts(pod: Mapping[str, Any], resource: str) -> list[int]:
    """How many devices of ``resource`` each container (init containers too) asks for; unreadable counts left out."""
    spec = pod.get("spec") or {}
    out: list[int] = []
    for group in ("initContainers", "containers"):
        for c in spec.get(group) or ():
            res = (c.get("resources") or {}) if isinstance(c, Mapping) else {}
            raw = (res.get("limits") or {}).get(resource, (res.get("requests") or {}).get(resource))
            if raw is None:
                continue
            try:
                q = parse_quantity(raw)
            except QuantityError:
                continue
            if q == q.to_integral_value() and q > 0:
                out.append(int(q))
    return out


def _live_on(pod: Mapping[str, Any], node: str) -> bool:
    meta = pod.get("metadata") or {}
    return (
        (pod.get("spec") or {}).get("nodeName") == node
        and (pod.get("status") or {}).get("phase") not in _DONE_PHASES
        and not meta.get("deletionTimestamp")
    )


def _time(raw: object) -> datetime:
    if not isinstance(raw, str) or not raw:
        return _NEVER
    try:
        t = datetime.fromisoformat(raw)
    except ValueError:
        return _NEVER
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def admission_order(pod: Mapping[str, Any]) -> tuple[datetime, datetime, str]:
    """Sort key: PodScheduled condition time, creation time, namespace/name."""
    conditions = (pod.get("status") or {}).get("conditions") or ()
    scheduled = next(
        (c.get("lastTransitionTime") for c in conditions if isinstance(c, Mapping) and c.get("type") == "PodScheduled"),
        None,
    )
    return _time(scheduled), _time((pod.get("metadata") or {}).get("creationTimestamp")), pod_key(pod)


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    a = (pod.get("metadata") or {}).get("annotations") or {}
    return a if isinstance(a, Mapping) else {}


def _allocated(pod: Mapping[str, Any]) -> tuple[int, ...]:
    raw = _annotations(pod).get(ann.GPU_ALLOCATED)
    if raw is None or raw == "":
        return ()
    got = parse_gpu_indices(raw)
    if got is None:
        raise AllocationError(
            f"pod {pod_key(pod)}: {ann.GPU_ALLOCATED}={raw!r} is not a comma-separated list of GPU indices"
        )
    return got


def _waiting(pod: Mapping[str, Any]) -> bool:
    """The pod still has assigned GPUs not handed out (a malformed assignment counts as waiting: it gets the error)."""
    assigned = parse_gpu_indices(_annotations(pod).get(ann.GPU_ASSIGNED))
    if assigned is None:
        return True
    try:
        return bool(set(assigned) - set(_allocated(pod)))
    except AllocationError:
        return True


def pick_pod(pods: Sequence[Mapping[str, Any]], *, node: str, resource: str, count: int) -> Mapping[str, Any]:
    """The pod this Allocate (``count`` devices of ``resource`` for one container) is for, or AllocationError."""
    asking = [p for p in pods if _live_on(p, node) and count in container_counts(p, resource)]
    kelvin = [
        p
        for p in asking
        if ann.GPU_ASSIGNED in _annotations(p) and _annotations(p).get(ann.GPU_ASSIGNED_NODE) == node and _waiting(p)
    ]
    if kelvin:
        return min(kelvin, key=admission_order)
    others = sorted(pod_key(p) for p in asking if ann.GPU_ASSIGNED not in _annotations(p))
    stale = sorted(
        pod_key(p)
        for p in asking
        if ann.GPU_ASSIGNED in _annotations(p) and _annotations(p).get(ann.GPU_ASSIGNED_NODE) != node
    )
    msg = (
        f"kelvin device plugin on node {node}: no pod bound here is waiting for {count} {resource} with kelvin's GPU "
        f"assignment ({ann.GPU_ASSIGNED} and {ann.GPU_ASSIGNED_NODE}={node})"
    )
    if others:
        msg += f"; pods asking for {resource} here without one: {', '.join(others[:5])}"
    if stale:
        msg += f"; pods whose {ann.GPU_ASSIGNED_NODE} names another node: {', '.join(stale[:5])}"
    raise AllocationError(msg + ". GPUs on kelvin nodes go only to pods bound by kelvin's scheduler extender")


def grant(
    pod: Mapping[str, Any],
    *,
    node: str,
    resource: str,
    count: int,
    gpus: Sequence[Gpu],
    cdi_kind: str | None = None,
) -> Grant:
    """The next ``count`` of the pod's assigned GPUs and the container's environment, or AllocationError.

    ``cdi_kind`` (e.g. ``nvidia.com/gpu``): name the GPUs as CDI devices ``<kind>=<uuid>`` instead of setting
    ``NVIDIA_VISIBLE_DEVICES``.
    """
    key = pod_key(pod)
    annotations = _annotations(pod)
    raw = annotations.get(ann.GPU_ASSIGNED)
    assigned = parse_gpu_indices(raw)
    if assigned is None:
        raise AllocationError(f"pod {key}: {ann.GPU_ASSIGNED}={raw!r} is not a comma-separated list of GPU indices")
    served = {g.index: g for g in gpus}
    missing = [i for i in assigned if i not in served]
    if missing:
        have = ",".join(str(i) for i in sorted(served)) or "none"
        raise AllocationError(
            f"pod {key}: {ann.GPU_ASSIGNED}={raw!r} names GPU {missing[0]}, which node {node}'s kelvin device plugin "
            f"does not serve (it serves GPUs {have})"
        )
    done = _allocated(pod)
    remaining = [i for i in assigned if i not in done]
    if len(remaining) < count:
        raise AllocationError(
            f"pod {key}: a container asks for {count} {resource} but only {len(remaining)} of its assigned GPUs "
            f"({ann.GPU_ASSIGNED}={raw!r}, {ann.GPU_ALLOCATED}={','.join(map(str, done))!r}) are left"
        )
    if resource == SHARED_RESOURCE and count != 1:
        raise AllocationError(f"pod {key}: a container asks for {count} {resource}; a shared GPU is requested as 1")
    mine = tuple(remaining[:count])
    uuids = [served[i].uuid for i in mine]
    envs: dict[str, str] = {}
    cdi: tuple[str, ...] = ()
    if cdi_kind:
        cdi = tuple(f"{cdi_kind}={u}" for u in uuids)
    else:
        envs[VISIBLE_DEVICES_ENV] = ",".join(uuids)
    envs.update(_mps_envs(pod, resource, count))
    meta = pod.get("metadata") or {}
    return Grant(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        indices=mine,
        allocated=tuple(i for i in assigned if i in done or i in mine),
        envs=envs,
        cdi_devices=cdi,
    )


def _mps_envs(pod: Mapping[str, Any], resource: str, count: int) -> dict[str, str]:
    """MPS limits of a memory-pool or compute-share pod, as the operator's webhook injects them (device 0 is the
    pod's only visible GPU)."""
    try:
        req = request_from_annotations(_annotations(pod), count=count if resource == WHOLE_RESOURCE else 1)
    except RequestError as exc:
        raise AllocationError(f"pod {pod_key(pod)}: {exc}") from exc
    if not req.shared:
        return {}
    out: dict[str, str] = {}
    if req.memory_bytes is not None:
        out[MPS_MEMORY_ENV] = f"0={req.memory_bytes // MIB}M"
    if req.milli is not None and req.milli < MILLI_PER_GPU:
        out[MPS_THREADS_ENV] = str(max(1, round(req.milli / 10)))
    return out


def preferred(
    indices: Sequence[int] | None,
    *,
    resource: str,
    gpus: Sequence[Gpu],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> list[str]:
    """GetPreferredAllocation: the devices of kelvin's GPUs ``indices`` (a free slot on each for the shared
    resource), after the kubelet's must-include devices, filled up to ``size`` from the available ones in order.
    ``indices`` None (no kelvin pod found): must-include, then the first available."""
    out = list(dict.fromkeys(must_include))[:size]
    free = [d for d in available if d not in out]
    if indices:
        uuid_of = {g.index: g.uuid for g in gpus}
        for i in indices:
            if len(out) >= size:
                break
            want = uuid_of.get(i)
            pick = next((d for d in free if gpu_uuid_of(d) == want), None)
            if pick is not None and (resource == SHARED_RESOURCE or pick == want):
                out.append(pick)
                free.remove(pick)
    for d in free:
        if len(out) >= size:
            break
        out.append(d)
    return out


def next_indices(pod: Mapping[str, Any], count: int) -> tuple[int, ...] | None:
    """The GPUs the pod's next container would get (GetPreferredAllocation); None when its annotations are bad."""
    assigned = parse_gpu_indices(_annotations(pod).get(ann.GPU_ASSIGNED))
    if assigned is None:
        return None
    try:
        done = _allocated(pod)
    except AllocationError:
        return None
    remaining = [i for i in assigned if i not in done]
    return tuple(remaining[:count]) if len(remaining) >= count else None
