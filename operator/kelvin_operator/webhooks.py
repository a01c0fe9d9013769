"""Admission for kelvin's GPU memory pools: pure decisions over an AdmissionReview's pod (kopf wires them up).

Validation rejects ``kelvin.dev/gpu-memory`` requests that cannot be honoured, with the same messages the extender
gives (the parsing is :func:`scheduler_plugin.model.request.parse_pod`'s): a bad quantity, a pool combined with a
multi-GPU request, or a pool larger than any GPU in the cluster (per the current telemetry snapshot).

A **pool-only** pod (``kelvin.dev/gpu-memory`` or ``kelvin.dev/gpu-share`` but no ``nvidia.com/gpu`` nor
``kelvin.dev/shared-gpu`` in any container) would never reach the extender: kube-scheduler only calls it for pods that
request one of its ``managedResources``, and would place the pod GPU-blind. With ``webhook.sharedGpuResource`` (the
chart sets it when kelvin's device plugin advertises ``kelvin.dev/shared-gpu``) the mutating webhook requests
``kelvin.dev/shared-gpu: 1`` for it; the validating webhook (which sees the pod after every mutation) rejects any
pool-only pod left, saying what is missing and the two ways to fix it. Without ``webhook.sharedGpuResource`` no node
advertises ``kelvin.dev/shared-gpu``, so a pod requesting it by hand (it would stay Pending) is rejected too.

Mutation also injects into every container of a pod with a pool or a compute share the environment variables that
CUDA MPS and the ML frameworks honour. A variable the pod already sets is never overwritten. See docs/operator.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.gpu_models import matches_any
from scheduler_plugin.model.mps import mps_limits
from scheduler_plugin.model.pod import PodResources, RequestError
from scheduler_plugin.model.quantity import format_gib
from scheduler_plugin.model.request import GpuRequest, parse_pod
from scheduler_plugin.model.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class GpuSizes:
    """What admission needs to know of the fleet: the memory of each GPU model seen in the snapshot."""

    by_model: Mapping[str, int]

    @classmethod
    def of(cls, snapshot: Snapshot | None) -> GpuSizes:
        sizes: dict[str, int] = {}
        for nd in snapshot.nodes if snapshot is not None else ():
            for g in nd.gpus:
                sizes[g.model] = max(sizes.get(g.model, 0), g.memory_total_bytes)
        return cls(sizes)

    def largest(self, models: frozenset[str] | None = None) -> tuple[str, int] | None:
        items = [(m, b) for m, b in self.by_model.items() if not models or matches_any(models, m)]
        return max(items, key=lambda mb: mb[1]) if items else None


# kubectl's annotation naming a pod's main container; the shared-GPU slot goes there (else to the first container)
DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
GPU_RESOURCES = (ann.GPU_RESOURCE, ann.SHARED_GPU_RESOURCE)


def requests_gpu_resource(pod: Mapping[str, Any]) -> bool:
    """Some container (init containers included) requests or limits nvidia.com/gpu or kelvin.dev/shared-gpu (any
    value: kube-scheduler asks the extender about such a pod). Raises ``RequestError`` for unreadable containers."""
    return PodResources.of(pod).mentions(GPU_RESOURCES)


def pool_only(pod: Mapping[str, Any]) -> bool:
    """The pod asks for a share of a GPU (memory pool or compute share) but requests no GPU resource at all."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    wants_share = ann.GPU_MEMORY in annotations or ann.GPU_SHARE in annotations
    return wants_share and not requests_gpu_resource(pod)


def pool_only_message(*, shared_gpu_resource: bool) -> str:
    head = (
        f"the pod sets {ann.GPU_MEMORY} or {ann.GPU_SHARE} but no container requests a GPU resource "
        f"({ann.GPU_RESOURCE} or {ann.SHARED_GPU_RESOURCE}): kube-scheduler would never ask kelvin about it and "
        "would place it without looking at GPUs. "
    )
    if shared_gpu_resource:
        return head + (
            f"kelvin's mutating webhook adds {ann.SHARED_GPU_RESOURCE}: 1 to such pods but did not run for this one "
            f"(is it reachable?); request {ann.SHARED_GPU_RESOURCE}: 1 (or {ann.GPU_RESOURCE}: 1) in the container "
            "that uses the GPU, or retry"
        )
    return head + (
        f"Fix it either way: request {ann.GPU_RESOURCE}: 1 in the container that uses the GPU (resources.limits), or "
        f"enable kelvin's device plugin (Helm value devicePlugin.enabled=true), which advertises "
        f"{ann.SHARED_GPU_RESOURCE} on GPU nodes and makes this webhook request one slot for such pods"
    )


def requests_shared_gpu(pod: Mapping[str, Any]) -> bool:
    """Some container (init containers included) requests or limits kelvin.dev/shared-gpu. Raises ``RequestError``
    for unreadable containers."""
    return PodResources.of(pod).mentions((ann.SHARED_GPU_RESOURCE,))


def shared_gpu_unavailable_message() -> str:
    return (
        f"the pod requests {ann.SHARED_GPU_RESOURCE}, which no node advertises: kelvin's device plugin does not serve "
        f"it (Helm values devicePlugin.enabled=false, or devicePlugin.resourceNames without {ann.SHARED_GPU_RESOURCE}; "
        f"operator setting webhook.sharedGpuResource=false), so the pod would stay Pending. Request "
        f"{ann.GPU_RESOURCE}: 1 instead, or enable kelvin's device plugin (devicePlugin.enabled=true)"
    )


def validate(pod: Mapping[str, Any], sizes: GpuSizes, *, shared_gpu_resource: bool = False) -> str | None:
    """``None`` when the pod is admissible, else the message to reject it with. ``shared_gpu_resource``: kelvin's
    device plugin advertises kelvin.dev/shared-gpu; off, a pod requesting it is rejected (it would stay Pending).
    It also picks the advice given to a pool-only pod (always rejected: the mutating webhook has run by now)."""
    try:
        if not shared_gpu_resource and requests_shared_gpu(pod):
            return shared_gpu_unavailable_message()
        req = parse_pod(pod)
    except RequestError as exc:
        return f"invalid GPU request: {exc}"
    if pool_only(pod):
        return pool_only_message(shared_gpu_resource=shared_gpu_resource)
    if req.memory_bytes is None:
        return None
    big = sizes.largest(req.models)
    if big is None:
        if req.models and sizes.by_model:
            return (
                f"{ann.GPU_MEMORY}: no GPU of the models {','.join(sorted(req.models))} ({ann.GPU_MODELS}) "
                f"exists in the cluster; known: {','.join(sorted(sizes.by_model))}"
            )
        return None  # no telemetry yet: nothing to compare with (the extender still checks at scheduling)
    model, total = big
    if req.memory_bytes > total:
        return (
            f"{ann.GPU_MEMORY}={format_gib(req.memory_bytes)} is larger than the largest GPU in the cluster "
            f"({model}, {format_gib(total)}); no node could ever run this pod"
        )
    return None


def runs_mps(pod: Mapping[str, Any], mps_label: str, snapshot: Snapshot | None) -> bool:
    """The pod will land on an MPS node pool: it selects the pool's label, or every GPU node runs MPS."""
    spec = pod.get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    if str(selector.get(mps_label, "")).lower() == "true":
        return True
    nodes = [nd for nd in (snapshot.nodes if snapshot is not None else ()) if nd.gpus]
    return bool(nodes) and all(nd.mps_enabled for nd in nodes)


def injected_env(req: GpuRequest, *, mps: bool, sizes: GpuSizes, framework_env: bool) -> list[dict[str, str]]:
    """The variables for one shared-GPU request (empty for whole-GPU or CPU pods)."""
    if not req.shared:
        return []
    env = [{"name": k, "value": v} for k, v in mps_limits(req).items()] if mps else []
    if req.memory_bytes is not None:
        env.append({"name": "KELVIN_GPU_MEMORY_LIMIT_BYTES", "value": str(req.memory_bytes)})
        if framework_env:
            env += [
                {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "true"},
                {"name": "XLA_PYTHON_CLIENT_PREALLOCATE", "value": "false"},
                {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"},
            ]
            sized = {b for m, b in sizes.by_model.items() if not req.models or matches_any(req.models, m)}
            if len(sized) == 1:  # one GPU size: a fraction is exact
                fraction = min(1.0, req.memory_bytes / sized.pop())
                env.append({"name": "XLA_PYTHON_CLIENT_MEM_FRACTION", "value": f"{fraction:.3f}"})
    return env


def slot_container(pod: Mapping[str, Any]) -> int:
    """Index of the container that gets the shared-GPU slot: the one kubectl's default-container annotation names,
    else the first."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    wanted = annotations.get(DEFAULT_CONTAINER)
    containers = (pod.get("spec") or {}).get("containers") or []
    for i, c in enumerate(containers):
        if wanted and isinstance(c, Mapping) and c.get("name") == wanted:
            return i
    return 0


def _with_slot(c: Mapping[str, Any]) -> dict[str, Any]:
    res = dict(c.get("resources") or {})
    for part in ("requests", "limits"):  # extended resources: requests must equal limits
        res[part] = {**(res.get(part) or {}), ann.SHARED_GPU_RESOURCE: "1"}
    return {**c, "resources": res}


def mutate(
    pod: Mapping[str, Any],
    *,
    snapshot: Snapshot | None,
    mps_label: str,
    framework_env: bool,
    shared_gpu_resource: bool = False,
) -> list[dict[str, Any]] | None:
    """The pod's containers with the shared-GPU slot and the variables added (``None``: nothing to change). Invalid
    pods are left to the validating webhook (``None``).

    ``shared_gpu_resource``: a pool-only pod gets ``kelvin.dev/shared-gpu: "1"`` (requests and limits) in its
    :func:`slot_container`, so that kube-scheduler sends it to the extender."""
    try:
        req = parse_pod(pod)
    except RequestError:
        return None
    containers: Sequence[Mapping[str, Any]] = (pod.get("spec") or {}).get("containers") or []
    out: list[dict[str, Any]] = [dict(c) for c in containers]
    changed = False
    if shared_gpu_resource and out and pool_only(pod):
        i = slot_container(pod)
        out[i] = _with_slot(out[i])
        changed = True
    env = injected_env(
        req, mps=runs_mps(pod, mps_label, snapshot), sizes=GpuSizes.of(snapshot), framework_env=framework_env
    )
    for i, c in enumerate(out):
        have = {e.get("name") for e in c.get("env") or []}
        add = [e for e in env if e["name"] not in have]
        if add:
            changed = True
            out[i] = {**c, "env": [*(c.get("env") or []), *add]}
    return out if changed else None
