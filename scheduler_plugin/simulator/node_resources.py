"""What kube-scheduler itself checks before any extender: the node has the pod's CPU and memory requests free
(the NodeResourcesFit filter). kelvin's extender judges GPUs only, so the simulator adds this in front of it."""

from __future__ import annotations

import numpy as np

from ..model import MILLI_PER_GPU, FleetArrays, GpuRequest
from ..policies.base import BoolA, CycleContext, FloatA, IntA, Rejection
from ..policies.normalize import minmax
from ..policies.reasons import InsufficientResource


class NodeResourcesFit:
    name = "NodeResourcesFit"

    def filter(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> BoolA:
        ok = (fleet.cpu_free[idx] >= req.cpu_milli) & (fleet.mem_free_host[idx] >= req.host_memory_bytes)
        return np.asarray(ok, dtype=np.bool_)

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> Rejection:
        if fleet.cpu_free[row] < req.cpu_milli:
            return InsufficientResource("cpu", int(fleet.cpu_free[row]), req.cpu_milli)
        return InsufficientResource("memory", int(fleet.mem_free_host[row]), req.host_memory_bytes)


class LeastAllocated:
    """kube-scheduler's default NodeResourcesFit scoring (LeastAllocated): the mean share of CPU, memory and GPUs
    left free after placing the pod; spreads pods. GPUs: the first free ones, as the device plugin hands them out."""

    name = "LeastAllocated"

    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        whole_free = ((fleet.free_milli[idx] >= MILLI_PER_GPU) & fleet.gpu_present[idx]).sum(axis=1)
        gpus = np.maximum(fleet.gpu_count[idx], 1)
        cpu_cap = np.maximum(fleet.cpu_free.max(initial=1), 1)
        mem_cap = np.maximum(fleet.mem_free_host.max(initial=1), 1)
        parts = (
            np.clip((fleet.cpu_free[idx] - req.cpu_milli) / cpu_cap, 0, 1),
            np.clip((fleet.mem_free_host[idx] - req.host_memory_bytes) / mem_cap, 0, 1),
            np.clip((whole_free - req.count) / gpus, 0, 1),
        )
        return np.asarray(sum(parts) / 3.0, dtype=np.float64)

    def normalize(self, raw: FloatA) -> FloatA:
        return minmax(raw)

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> list[str]:
        return [f"free share after placement {float(self.score(req, fleet, np.array([row]), ctx)[0]):.2f}"]

    def pick(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> tuple[int, ...] | None:
        free = np.flatnonzero(fleet.gpu_present[row] & (fleet.free_milli[row] >= MILLI_PER_GPU))
        if len(free) < req.count:
            return None
        return tuple(int(fleet.gpu_index[row, c]) for c in free[: req.count])
