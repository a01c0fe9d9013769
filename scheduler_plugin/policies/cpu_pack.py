"""Best fit for pods without GPUs: the node the pod leaves with the least free CPU and GPU.

A CPU-only pod on a GPU node takes CPU that the node's free GPUs may need for GPU pods. The ``fragmentation``
policy prices exactly that (the GPU capacity the pod's CPU strands for the workload's GPU shapes), but where many
nodes strand nothing either way it cannot tell them apart, and spreading CPU-only pods over those nodes leaves each
one a little short of CPU later. This score packs them instead::

    left = 0.5 * cpu_free_after / cpu_scale + 0.5 * gpu_free / gpu_scale
    raw  = -left

``cpu_free_after`` is the node's free CPU minus the pod's (millicores), ``gpu_free`` its free GPU capacity (in
thousandths of a GPU); the scales weigh a core against a GPU, by default as the FGD paper's best-fit baseline does
(a node of 128 cores and 8 GPUs). Normalised by min-max over the candidates. The framework ranks CPU-only pods by a
blend of this and ``fragmentation`` (the policy file's ``cpuOnly`` section, docs/policies.md).
"""

from __future__ import annotations

import numpy as np

from ..model import MILLI_PER_GPU, FleetArrays, GpuRequest
from .base import CycleContext, FloatA, IntA
from .normalize import minmax
from .policy_file import DEFAULT_PACK_CPU_SCALE_CORES, DEFAULT_PACK_GPU_SCALE


class PackScore:
    """Higher for the node a CPU-only pod leaves with less free CPU and GPU (best fit)."""

    name = "pack"

    def __init__(
        self, cpu_scale_cores: float = DEFAULT_PACK_CPU_SCALE_CORES, gpu_scale: float = DEFAULT_PACK_GPU_SCALE
    ) -> None:
        if cpu_scale_cores <= 0 or gpu_scale <= 0:
            raise ValueError(f"pack scales must be positive (got {cpu_scale_cores:g} cores, {gpu_scale:g} GPUs)")
        self.cpu_scale_cores = cpu_scale_cores
        self.gpu_scale = gpu_scale
        self._cpu = cpu_scale_cores * 1000.0
        self._gpu = gpu_scale * MILLI_PER_GPU

    def left(self, req: GpuRequest, fleet: FleetArrays, idx: IntA) -> FloatA:
        """(len(idx),) what each node keeps free after the pod, as a share of the scales (0: nothing)."""
        cpu_after = fleet.cpu_free[idx] - req.cpu_milli
        gpu_free = np.where(fleet.gpu_present[idx], fleet.free_milli[idx], 0).sum(axis=1)
        return np.asarray(0.5 * cpu_after / self._cpu + 0.5 * gpu_free / self._gpu, dtype=np.float64)

    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        return -self.left(req, fleet, np.asarray(idx, dtype=np.int64))

    def normalize(self, raw: FloatA) -> FloatA:
        return minmax(raw)

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> list[str]:
        cpu_after = int(fleet.cpu_free[row]) - req.cpu_milli
        gpu_free = float(np.where(fleet.gpu_present[row], fleet.free_milli[row], 0).sum()) / MILLI_PER_GPU
        share = float(self.left(req, fleet, np.array([row], dtype=np.int64))[0])
        return [
            f"leaves {cpu_after / 1000:g} cores and {gpu_free:g} GPUs free ({share:.3f} of a "
            f"{self.cpu_scale_cores:g}-core, {self.gpu_scale:g}-GPU node): best fit packs the fullest"
        ]
