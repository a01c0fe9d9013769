"""Admission for kelvin's GPU memory pools: pure decisions over an AdmissionReview's pod (kopf wires them up).

Validation rejects ``kelvin.dev/gpu-memory`` requests that cannot be honoured, with the same messages the extender
gives (the parsing is :func:`scheduler_plugin.model.request.parse_pod`'s): a bad quantity, a pool combined with a
multi-GPU request, or a pool larger than any GPU in the cluster (per the current telemetry snapshot).

Mutation injects into every container of a pod with a pool or a compute share the environment variables that CUDA
MPS and the ML frameworks honour. A variable the pod already sets is never overwritten. See docs/operator.md for each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.gpu import MIB, MILLI_PER_GPU
from scheduler_plugin.model.gpu_models import matches_any
from scheduler_plugin.model.quantity import format_gib
from scheduler_plugin.model.request import GpuRequest, RequestError, parse_pod
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


def validate(pod: Mapping[str, Any], sizes: GpuSizes) -> str | None:
    """``None`` when the pod is admissible, else the message to reject it with."""
    try:
        req = parse_pod(pod)
    except RequestError as exc:
        return f"invalid GPU request: {exc}"
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
    env: list[dict[str, str]] = []
    if mps and req.memory_bytes is not None:
        env.append({"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": f"0={req.memory_bytes // MIB}M"})
    if mps and req.milli is not None and req.milli < MILLI_PER_GPU:
        env.append({"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": str(max(1, round(req.milli / 10)))})
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


def mutate(
    pod: Mapping[str, Any], *, snapshot: Snapshot | None, mps_label: str, framework_env: bool
) -> list[dict[str, Any]] | None:
    """The pod's containers with the variables added (``None``: nothing to change). Invalid pods are left to the
    validating webhook (``None``)."""
    try:
        req = parse_pod(pod)
    except RequestError:
        return None
    env = injected_env(
        req, mps=runs_mps(pod, mps_label, snapshot), sizes=GpuSizes.of(snapshot), framework_env=framework_env
    )
    if not env:
        return None
    containers: Sequence[Mapping[str, Any]] = (pod.get("spec") or {}).get("containers") or []
    out: list[dict[str, Any]] = []
    changed = False
    for c in containers:
        have = {e.get("name") for e in c.get("env") or []}
        add = [e for e in env if e["name"] not in have]
        changed |= bool(add)
        out.append({**c, "env": [*(c.get("env") or []), *add]})
    return out if changed else None
