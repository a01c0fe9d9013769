"""A typed view of the few pod fields the operator reasons about, parsed once from API JSON (camelCase)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.claim import claim_of, parse_gpu_indices
from scheduler_plugin.model.gpu import GpuAssignment
from scheduler_plugin.model.pod import RequestError, pod_key, readable_request
from scheduler_plugin.model.request import parse_bound_pod, parse_gpu_count
from scheduler_plugin.model.times import parse_time


@dataclass(frozen=True, slots=True)
class PodView:
    namespace: str
    name: str
    uid: str
    node: str
    priority: int = 0
    priority_class: str = ""
    owner_kinds: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    created_at: float | None = None
    started_at: float | None = None
    deleting: bool = False
    phase: str = ""
    mirror: bool = False
    gpu_count: int = 0
    gpu_indices: tuple[int, ...] = ()
    """kelvin.dev/gpu-assigned, when kelvin bound it."""
    memory_pool_bytes: int | None = None
    compute_share_milli: int | None = None
    claim: GpuAssignment | None = None
    """The pod's GPU claim (:func:`~scheduler_plugin.model.claim.claim_of`, as bind records it); ``None`` for a pod
    without GPUs or whose request cannot be parsed."""
    request_error: str | None = None

    @property
    def key(self) -> str:
        return pod_key(self.namespace, self.name)

    @property
    def wants_checkpoint(self) -> bool:
        return self.annotations.get(ann.CHECKPOINT, "").strip().lower() == "true"

    @property
    def bare(self) -> bool:
        return not self.owner_kinds


def restart_cost_s(pod: PodView, now: float) -> float:
    """Seconds of work an eviction would throw away: since the last reported checkpoint, else since start."""
    born = pod.started_at if pod.started_at is not None else (pod.created_at if pod.created_at is not None else now)
    done = parse_time(pod.annotations.get(ann.CHECKPOINT_DONE))
    since = max(born, done) if done is not None else born
    return max(0.0, now - since)


def age_s(pod: PodView, now: float) -> float:
    """Seconds since the pod started (else since it was created; 0 when neither is known)."""
    born = pod.started_at if pod.started_at is not None else pod.created_at
    return 0.0 if born is None else max(0.0, now - born)


def _gpu_count(pod: Mapping[str, Any]) -> int:
    """GPUs of a pod whose request cannot be parsed (what it may hold): the effective whole-GPU count over the values
    that can be read, or one GPU for a shared-GPU slot."""
    whole = readable_request(pod, ann.GPU_RESOURCE, parse_gpu_count)
    return whole or min(readable_request(pod, ann.SHARED_GPU_RESOURCE, parse_gpu_count), 1)


def pod_view(pod: Mapping[str, Any]) -> PodView:
    """Never raises on odd pods: what cannot be parsed is left empty (``request_error`` says why)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    indices = parse_gpu_indices(annotations.get(ann.GPU_ASSIGNED)) or ()  # the listing's reading, not a lenient one
    count = 0
    pool: int | None = None
    share: int | None = None
    claim: GpuAssignment | None = None
    err: str | None = None
    try:
        req, _ = parse_bound_pod(pod)  # as the listing reads it: a pool bound before units were required stays a pool
        count = req.count
        if req.wants_gpu:
            claim = claim_of(req, indices)
            pool = claim.memory_bytes
            share = claim.milli if req.shared else None
    except RequestError as exc:
        count = _gpu_count(pod)
        err = str(exc)
    return PodView(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        node=str(spec.get("nodeName") or ""),
        priority=int(spec.get("priority") or 0),
        priority_class=str(spec.get("priorityClassName") or ""),
        owner_kinds=tuple(str(o.get("kind", "")) for o in meta.get("ownerReferences") or []),
        annotations=annotations,
        created_at=parse_time(meta.get("creationTimestamp")),
        started_at=parse_time(status.get("startTime")),
        deleting=bool(meta.get("deletionTimestamp")),
        phase=str(status.get("phase") or ""),
        mirror="kubernetes.io/config.mirror" in annotations,
        gpu_count=count,
        gpu_indices=indices,
        memory_pool_bytes=pool,
        compute_share_milli=share,
        claim=claim,
        request_error=err,
    )
