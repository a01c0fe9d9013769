"""What kube-scheduler itself checks before any extender: the node has the pod's CPU and memory requests free
(the NodeResourcesFit filter). kelvin's extender judges GPUs only, so the simulator adds this in front of it."""

from __future__ import annotations

import numpy as np

from ..model import GIB, FleetArrays, GpuRequest
from ..policies.base import BoolA, CycleContext, IntA, Rejection


class NodeResourcesFit:
    name = "NodeResourcesFit"

    def filter(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> BoolA:
        ok = (fleet.cpu_free[idx] >= req.cpu_milli) & (fleet.mem_free_host[idx] >= req.host_memory_bytes)
        return np.asarray(ok, dtype=np.bool_)

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> Rejection:
        if fleet.cpu_free[row] < req.cpu_milli:
            return Rejection(f"Insufficient cpu: {fleet.cpu_free[row]}m free, the pod requests {req.cpu_milli}m")
        free_gib = fleet.mem_free_host[row] / GIB
        return Rejection(
            f"Insufficient memory: {free_gib:.1f} GiB free, the pod requests {req.host_memory_bytes / GIB:.1f} GiB"
        )
