"""Trace nodes -> the same GPU node model and FleetArrays the extender scores; and applying a placement to them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..model import GIB, FleetArrays, GpuInfo, GpuNode, GpuRequest, build_arrays
from ..model.catalogue import UnknownModelError, resolve
from ..model.claim import claim_of
from ..model.gpu_models import memory_gb

if TYPE_CHECKING:
    from .trace import TraceNode

#: GPU memory of openb's models, whose names say nothing of their memory and are no catalogue names. Other names
#: are the catalogue's (:func:`~scheduler_plugin.model.catalogue.resolve`: ``H100-SXM-80GB``, ``NVIDIA A100-SXM4-80GB``)
#: or read by :func:`~scheduler_plugin.model.gpu_models.memory_gb` (``NVIDIA L4``, ``A100-SXM4-40GB``); a model none
#: of them knows must come with its memory (``gpu_memory``).
TRACE_GPU_MEMORY_GIB: dict[str, float] = {
    "p100": 16,
    "v100m16": 16,
    "v100m32": 32,
    "v100": 32,
    "g2": 32,
    "g3": 32,
    "a100": 80,
}


def known_gpu_memory_bytes(model: str) -> int | None:
    """The memory of one GPU of ``model`` as kelvin knows it (GB read as GiB, as NVIDIA sizes them); ``None`` when
    kelvin does not know the model."""
    gib = TRACE_GPU_MEMORY_GIB.get(model.strip().lower())
    if gib is None:
        try:
            gib = resolve(model).memory_gb
        except UnknownModelError:
            gib = memory_gb(model)
    return None if gib is None else int(gib * GIB)


def gpu_memory_bytes(node: TraceNode) -> int:
    """The memory of one of ``node``'s GPUs: the node's own figure, else the known one for its model. Raises
    :class:`ValueError` for a model kelvin does not know (the trace reader refuses those with the file and row)."""
    if node.gpu_memory_bytes is not None:
        return node.gpu_memory_bytes
    known = known_gpu_memory_bytes(node.model)
    if known is None:
        raise ValueError(f"node {node.name}: GPU model {node.model!r} is not one kelvin knows the memory of")
    return known


def to_gpu_nodes(nodes: Sequence[TraceNode]) -> list[GpuNode]:
    """Empty nodes with healthy, cool GPUs, observed at time 0 (the trace has no telemetry)."""
    out = []
    for n in nodes:
        mem = gpu_memory_bytes(n) if n.gpus else 0
        gpus = tuple(
            GpuInfo(index=j, uuid=f"{n.name}-gpu{j}", model=n.model, memory_total_bytes=mem) for j in range(n.gpus)
        )
        out.append(
            GpuNode(
                name=n.name,
                gpus=gpus,
                cpu_allocatable_milli=n.cpu_milli,
                memory_allocatable_bytes=n.memory_bytes,
                observed_at=0.0,
            )
        )
    return out


def build_fleet(nodes: Sequence[TraceNode]) -> FleetArrays:
    return build_arrays(to_gpu_nodes(nodes))


def apply_placement(fleet: FleetArrays, req: GpuRequest, row: int, gpu_indices: Sequence[int], sign: int = 1) -> int:
    """Charge the pod to node ``row`` in place: its CPU and memory requests, and on its GPUs the claim bind would
    record (:func:`~scheduler_plugin.model.claim.claim_of`, charged by :meth:`FleetArrays.charge` as the snapshot
    charges it). ``sign=-1`` gives it all back (a pod that finished). Returns the GPU thousandths it took."""
    fleet.cpu_free[row] -= sign * req.cpu_milli
    fleet.mem_free_host[row] -= sign * req.host_memory_bytes
    if not gpu_indices:
        return 0
    return fleet.charge([(row, claim_of(req, gpu_indices))], sign)
