"""Trace nodes -> the same GPU node model and FleetArrays the extender scores; and applying a placement to them."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from ..model import GIB, MILLI_PER_GPU, FleetArrays, GpuInfo, GpuNode, GpuRequest, build_arrays
from ..model.catalogue import UnknownModelError, resolve
from ..model.claim import charge_milli, claim_of
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


#: :func:`charge_milli` per (compute share, memory pool, GPU memory): a replay charges a few dozen distinct ones
#: some ten thousand times.
_charge = lru_cache(maxsize=4096)(charge_milli)


def apply_placement(fleet: FleetArrays, req: GpuRequest, row: int, gpu_indices: Sequence[int], sign: int = 1) -> int:
    """Charge the pod to node ``row`` in place: its CPU and memory requests, and on its GPUs the claim bind would
    record (:func:`~scheduler_plugin.model.claim.claim_of`), charged as :meth:`FleetArrays.charge` charges it (the
    snapshot's one charge, :class:`~scheduler_plugin.model.claim.SlotCharges`). ``sign=-1`` gives it all back (a
    pod that finished). Returns the GPU thousandths it took.

    One pod on one node, so the charge is worked out slot by slot with Python integers instead of
    :class:`SlotCharges`' arrays (built for many claims on many rows): the same figures in the same columns, at a
    fraction of the numpy calls (it runs once per arrival). Repeated GPU indices take the general path."""
    fleet.cpu_free[row] -= sign * req.cpu_milli
    fleet.mem_free_host[row] -= sign * req.host_memory_bytes
    if not gpu_indices:
        return 0
    claim = claim_of(req, gpu_indices)
    if len(set(claim.gpu_indices)) != len(claim.gpu_indices):
        return fleet.charge([(row, claim)], sign)
    slots = fleet.gpu_index[row].tolist()
    share = claim.milli or 0
    pool = -1 if claim.memory_bytes is None else claim.memory_bytes
    taken = 0
    for gi in claim.gpu_indices:
        if gi < 0 or gi not in slots:
            continue  # a GPU the node does not report (SlotCharges skips it too)
        at = (row, slots.index(gi))  # the first slot with that index
        total = int(fleet.mem_total[at])
        milli = min(_charge(claim.milli, claim.memory_bytes, total), MILLI_PER_GPU)
        mem = pool if pool >= 0 else total * min(share, MILLI_PER_GPU) // MILLI_PER_GPU
        fleet.assigned_milli[at] += sign * milli
        fleet.assigned_mem[at] += sign * mem
        fleet.tenants[at] += sign
        fleet.free_milli[at] = min(max(int(fleet.free_milli[at]) - sign * milli, 0), MILLI_PER_GPU)
        fleet.free_mem[at] = min(max(int(fleet.free_mem[at]) - sign * mem, 0), total)
        taken += milli
    return taken
