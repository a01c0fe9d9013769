"""Which pod a kubelet Allocate call is for, which GPUs it gets and with which environment. Pure functions.

The kubelet does not say which pod it allocates devices for, only how many devices of a resource one container
needs. As in gpushare-device-plugin, the pod is found among the pods of this node: bound here (``spec.nodeName``),
``Pending`` with no container started (a running pod is never in admission), not deleted, carrying kelvin's
``kelvin.dev/gpu-assigned`` for this node, and whose next container asking for the resource asks for exactly that
many devices. Progress is recorded per container in ``kelvin.dev/gpu-allocated`` (``;`` between containers), because
the kubelet calls Allocate for every container, init containers first, and hands a regular init container's devices on
to the app containers (:func:`plan`). The candidate kelvin bound first (``kelvin.dev/gpu-assigned-at``, nanoseconds)
is the one: the kubelet admits pods in the order it receives them. A pod the plugin cannot serve exactly gets an
:class:`AllocationError` whose message the kubelet shows on the pod; never another GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..model import RequestError, request_from_annotations
from ..model import annotations as ann
from ..model.claim import parse_gpu_indices
from ..model.mps import mps_limits
from ..model.pod import ContainerKind, containers, key_of, pod_key
from ..model.request import parse_gpu_count
from ..model.times import parse_time_ns
from .devices import SHARED_RESOURCE, WHOLE_RESOURCE, Gpu, gpu_uuid_of

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"


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
    allocated: tuple[tuple[int, ...], ...]
    """The pod's ``kelvin.dev/gpu-allocated`` after this grant: the GPUs of each container served."""
    envs: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return pod_key(self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class ContainerNeed:
    """One container asking for devices of a resource, in the kubelet's order of Allocate calls."""

    name: str
    count: int
    reuses: bool
    """A regular init container: it runs before the app containers and the kubelet hands its devices on to them
    (it does not use them up). Sidecar init containers (``restartPolicy: Always``) run alongside the app containers
    and keep theirs."""


def container_needs(pod: Mapping[str, Any], resource: str) -> list[ContainerNeed]:
    """The containers asking for ``resource``, init containers first, as the kubelet calls Allocate for them. Raises
    ``RequestError`` when a container's count cannot be read (:mod:`~scheduler_plugin.model.pod`): skipping it would
    hand the next container's GPUs to the wrong one."""
    out: list[ContainerNeed] = []
    for c in containers(pod):
        n = c.request(resource, parse_gpu_count)
        if n > 0:
            out.append(ContainerNeed(c.name, n, reuses=c.kind is ContainerKind.INIT))
    return out


def container_counts(pod: Mapping[str, Any], resource: str) -> list[int]:
    """How many devices of ``resource`` each container (init containers too) asks for. Raises ``RequestError``."""
    return [n.count for n in container_needs(pod, resource)]


def plan(assigned: Sequence[int], needs: Sequence[ContainerNeed]) -> list[tuple[int, ...]] | None:
    """The GPUs each container gets, as the kubelet hands devices out: app and sidecar containers take the next of
    the assigned GPUs; a regular init container gets the first ones not held by a sidecar, without using them up (the
    app containers after it get them again). None when the assignment is too short for some container."""
    out: list[tuple[int, ...]] = []
    taken = 0
    for need in needs:
        mine = tuple(assigned[taken : taken + need.count])
        if len(mine) < need.count:
            return None
        out.append(mine)
        if not need.reuses:
            taken += need.count
    return out


def _started(statuses: object) -> bool:
    for st in statuses if isinstance(statuses, list) else ():
        if not isinstance(st, Mapping):
            continue
        state = st.get("state") or {}
        last = st.get("lastState") or {}
        if st.get("started") or "running" in state or "terminated" in state or "terminated" in last:
            return True
    return False


def _candidate_on(pod: Mapping[str, Any], node: str) -> bool:
    """Bound here, Pending, not deleted and no container started yet: only such a pod can be in admission. A running
    pod bound before this plugin served the node (its GPUs came from another plugin) is never one."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    return (
        (pod.get("spec") or {}).get("nodeName") == node
        and status.get("phase") == "Pending"
        and not meta.get("deletionTimestamp")
        and not _started(status.get("containerStatuses"))
        and not _started(status.get("initContainerStatuses"))
    )


_NEVER_NS = 2**63  # an unreadable time sorts last


def _time_ns(raw: object) -> int:
    ns = parse_time_ns(raw)
    return _NEVER_NS if ns is None else ns


def _scheduled(pod: Mapping[str, Any]) -> int:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return _time_ns(
        next(
            (
                c.get("lastTransitionTime")
                for c in conditions
                if isinstance(c, Mapping) and c.get("type") == "PodScheduled"
            ),
            None,
        )
    )


def bind_time_ns(pod: Mapping[str, Any]) -> int:
    """When kelvin bound the pod: ``kelvin.dev/gpu-assigned-at`` (nanoseconds), else the PodScheduled time."""
    at = parse_time_ns(_annotations(pod).get(ann.GPU_ASSIGNED_AT))
    return at if at is not None else _scheduled(pod)


def admission_order(pod: Mapping[str, Any]) -> tuple[int, int, int, str]:
    """Sort key: kelvin's bind time (ns), PodScheduled condition time, creation time, namespace/name."""
    return (
        bind_time_ns(pod),
        _scheduled(pod),
        _time_ns((pod.get("metadata") or {}).get("creationTimestamp")),
        key_of(pod),
    )


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    a = (pod.get("metadata") or {}).get("annotations") or {}
    return a if isinstance(a, Mapping) else {}


def _allocated(pod: Mapping[str, Any]) -> list[tuple[int, ...]]:
    """``kelvin.dev/gpu-allocated``: the GPUs of each container served so far, ``;`` between containers."""
    raw = _annotations(pod).get(ann.GPU_ALLOCATED)
    if raw is None or raw == "":
        return []
    groups = [parse_gpu_indices(part) for part in str(raw).split(";")]
    if any(g is None for g in groups):
        raise AllocationError(
            f"pod {key_of(pod)}: {ann.GPU_ALLOCATED}={raw!r} is not a ';'-separated list of comma-separated "
            "lists of GPU indices"
        )
    return [g for g in groups if g is not None]


def allocated_annotation(groups: Sequence[Sequence[int]]) -> str:
    return ";".join(",".join(map(str, g)) for g in groups)


def _next_need(pod: Mapping[str, Any], needs: Sequence[ContainerNeed]) -> ContainerNeed | None:
    """The container of the pod (its ``needs``) the kubelet allocates next (None: all served). A malformed
    ``gpu-allocated`` counts as the first container: the pod is picked and gets the error."""
    try:
        served = len(_allocated(pod))
    except AllocationError:
        served = 0
    return needs[served] if served < len(needs) else None


def pick_pod(pods: Sequence[Mapping[str, Any]], *, node: str, resource: str, count: int) -> Mapping[str, Any]:
    """The pod this Allocate (``count`` devices of ``resource`` for one container) is for, or AllocationError."""
    return candidates(pods, node=node, resource=resource, count=count)[0]


def candidates(pods: Sequence[Mapping[str, Any]], *, node: str, resource: str, count: int) -> list[Mapping[str, Any]]:
    """Every pod this Allocate could be for, oldest bind first (never empty), or AllocationError. A pod whose
    containers cannot be read is never a candidate: an Allocate that finds no other pod is refused with an error
    naming it and the field at fault."""
    live = [p for p in pods if _candidate_on(p, node)]
    kelvin = []
    asking = []
    unreadable: dict[str, str] = {}
    for p in live:
        try:
            needs = container_needs(p, resource)
        except RequestError as exc:
            unreadable[key_of(p)] = str(exc)
            continue
        if any(n.count == count for n in needs):
            asking.append(p)
        a = _annotations(p)
        if ann.GPU_ASSIGNED not in a or a.get(ann.GPU_ASSIGNED_NODE) != node:
            continue
        need = _next_need(p, needs)
        if need is not None and need.count == count:
            kelvin.append(p)
    if kelvin:
        return sorted(kelvin, key=admission_order)
    others = sorted(key_of(p) for p in asking if ann.GPU_ASSIGNED not in _annotations(p))
    stale = sorted(
        key_of(p)
        for p in asking
        if ann.GPU_ASSIGNED in _annotations(p) and _annotations(p).get(ann.GPU_ASSIGNED_NODE) != node
    )
    msg = (
        f"kelvin device plugin on node {node}: no pending pod bound here is waiting for {count} {resource} for its "
        f"next container with kelvin's GPU assignment ({ann.GPU_ASSIGNED} and {ann.GPU_ASSIGNED_NODE}={node})"
    )
    if others:
        msg += f"; pods asking for {resource} here without one: {', '.join(others[:5])}"
    if stale:
        msg += f"; pods whose {ann.GPU_ASSIGNED_NODE} names another node: {', '.join(stale[:5])}"
    if unreadable:
        shown = sorted(unreadable.items())[:5]
        msg += "; pods whose containers cannot be read: " + ", ".join(f"{k} ({why})" for k, why in shown)
    raise AllocationError(msg + ". GPUs on kelvin nodes go only to pods bound by kelvin's scheduler extender")


#: Two pods bound closer together than this may reach the kubelet in one batch, which it sorts by creation time.
CLOSE_BIND_NS = 2_000_000_000


def close_binds(chosen: Mapping[str, Any], others: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Other candidates bound within :data:`CLOSE_BIND_NS` of ``chosen`` but created before it: the kubelet may be
    admitting one of them now (it sorts a batch by creation time) and the GPUs may go to the wrong pod."""
    at = bind_time_ns(chosen)
    created = _time_ns((chosen.get("metadata") or {}).get("creationTimestamp"))
    out = []
    for p in others:
        if p is chosen:
            continue
        if (
            abs(bind_time_ns(p) - at) < CLOSE_BIND_NS
            and _time_ns((p.get("metadata") or {}).get("creationTimestamp")) < created
        ):
            out.append(p)
    return out


def grant(
    pod: Mapping[str, Any],
    *,
    node: str,
    resource: str,
    count: int,
    gpus: Sequence[Gpu],
    cdi_kind: str | None = None,
) -> Grant:
    """The GPUs of the pod's next container and the container's environment, or AllocationError.

    ``cdi_kind`` (e.g. ``nvidia.com/gpu``): name the GPUs as CDI devices ``<kind>=<uuid>`` and set
    ``NVIDIA_VISIBLE_DEVICES=void`` (CUDA images set it to ``all``, which would expose every GPU).
    """
    key = key_of(pod)
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
    if resource == SHARED_RESOURCE and count != 1:
        raise AllocationError(f"pod {key}: a container asks for {count} {resource}; a shared GPU is requested as 1")
    done = _allocated(pod)
    try:
        needs = container_needs(pod, resource)
    except RequestError as exc:
        raise AllocationError(f"pod {key}: {exc}") from exc
    if len(done) >= len(needs) or needs[len(done)].count != count:
        raise AllocationError(
            f"pod {key}: a container asks for {count} {resource} but the pod's next container waiting for "
            f"{resource} does not ({ann.GPU_ALLOCATED}={allocated_annotation(done)!r} records "
            f"{len(done)} of its {len(needs)} containers served)"
        )
    shares = plan(assigned, needs)
    if shares is None:
        raise AllocationError(
            f"pod {key}: its containers ask for {'+'.join(str(n.count) for n in needs)} {resource} "
            f"({'init containers reusing theirs' if any(n.reuses for n in needs) else 'in all'}) but "
            f"{ann.GPU_ASSIGNED}={raw!r} names only {len(assigned)}"
        )
    mine = shares[len(done)]
    uuids = [served[i].uuid for i in mine]
    envs: dict[str, str] = {}
    cdi: tuple[str, ...] = ()
    if cdi_kind:
        cdi = tuple(f"{cdi_kind}={u}" for u in uuids)
        envs[VISIBLE_DEVICES_ENV] = "void"
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
        allocated=(*done, mine),
        envs=envs,
        cdi_devices=cdi,
    )


def _mps_envs(pod: Mapping[str, Any], resource: str, count: int) -> dict[str, str]:
    """MPS limits of a memory-pool or compute-share pod, as the operator's webhook injects them (device 0 is the
    pod's only visible GPU)."""
    try:
        req = request_from_annotations(_annotations(pod), count=count if resource == WHOLE_RESOURCE else 1)
    except RequestError as exc:
        raise AllocationError(f"pod {key_of(pod)}: {exc}") from exc
    return mps_limits(req)


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


def next_indices(pod: Mapping[str, Any], resource: str, count: int) -> tuple[int, ...] | None:
    """The GPUs the pod's next container would get (GetPreferredAllocation); None when its annotations are bad."""
    assigned = parse_gpu_indices(_annotations(pod).get(ann.GPU_ASSIGNED))
    if assigned is None:
        return None
    try:
        done = _allocated(pod)
        needs = container_needs(pod, resource)
    except (AllocationError, RequestError):
        return None
    shares = plan(assigned, needs)
    if shares is None or len(done) >= len(shares) or needs[len(done)].count != count:
        return None
    return shares[len(done)]
