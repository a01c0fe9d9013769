"""An immutable snapshot of the fleet, and its columnar (numpy) view that every policy scores over.

Policies are vectorised over nodes: the extender scores 5,000 nodes per request and the simulator replays ten
thousand arrivals, so per-node Python loops are kept off the hot path. ``FleetArrays`` holds one row per node and one
column per GPU slot (padded to the largest node; ``gpu_present`` masks the padding).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from .gpu import GIB, MILLI_PER_GPU, GpuAssignment, GpuNode

BoolA = npt.NDArray[np.bool_]
IntA = npt.NDArray[np.int64]
I32A = npt.NDArray[np.int32]
FloatA = npt.NDArray[np.float64]

#: Memory in use below this is treated as driver overhead, not a tenant.
DEFAULT_IDLE_USED_BYTES = 1 * GIB


def assigned_memory(a: GpuAssignment, memory_total: int) -> int:
    """GPU memory an assignment holds on one of its GPUs: its pool, else its share of the GPU's memory (a whole GPU
    holds all of it; a compute-only share of ``milli`` thousandths holds that share of the memory)."""
    if a.memory_bytes is not None:
        return a.memory_bytes
    return memory_total * min(a.milli, MILLI_PER_GPU) // MILLI_PER_GPU


@dataclass(slots=True)
class FleetArrays:
    """Columnar view of a fleet. Row ``i`` is node ``names[i]``; column ``j`` is ``nodes[i].gpus[j]``."""

    names: tuple[str, ...]
    index: dict[str, int]
    gpu_present: BoolA          # (N, G)
    gpu_index: I32A             # (N, G) the GPU's own index (-1 for padding)
    mem_total: IntA             # (N, G) bytes
    mem_used: IntA              # (N, G) bytes, from telemetry
    assigned_milli: I32A        # (N, G) thousandths assigned by kelvin (records + ledger)
    assigned_mem: IntA          # (N, G) bytes of memory pools assigned by kelvin
    free_milli: I32A            # (N, G) thousandths still free (0 for padding)
    free_mem: IntA              # (N, G) bytes still free (0 for padding)
    tenants: I32A               # (N, G) kelvin assignments sharing the GPU
    temp: FloatA                # (N, G) Celsius
    slowdown: FloatA            # (N, G) Celsius
    shutdown: FloatA            # (N, G) Celsius
    trend: FloatA               # (N, G) Celsius per minute
    throttle: IntA              # (N, G) reason bitmask
    util: FloatA                # (N, G) 0..1
    mem_util: FloatA            # (N, G) 0..1
    clock_ratio: FloatA         # (N, G) 0..1
    xid: I32A                   # (N, G)
    numa: I32A                  # (N, G)
    switch: I32A                # (N, G) interned PCIe switch id (-1 unknown)
    nvlink: BoolA               # (N, G, G) slot j reaches slot k over NVLink
    model_id: I32A              # (N, G) index into ``models`` (-1 padding)
    models: tuple[str, ...]
    gpu_count: I32A             # (N,)
    cpu_free: IntA              # (N,) millicores
    mem_free_host: IntA         # (N,) bytes
    observed_at: FloatA         # (N,) unix time, NaN when never seen
    mps: BoolA                  # (N,)

    @property
    def n_nodes(self) -> int:
        return len(self.names)

    @property
    def max_gpus(self) -> int:
        return int(self.gpu_present.shape[1])

    def model_ids(self, models: Iterable[str]) -> set[int]:
        """Ids of the given model names (unknown names are ignored: no node has them)."""
        wanted = {m.lower() for m in models}
        return {i for i, m in enumerate(self.models) if m.lower() in wanted}

    def copy(self) -> FleetArrays:
        """A deep copy whose arrays can be mutated (the simulator places pods into it)."""
        kwargs: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            kwargs[f.name] = v.copy() if isinstance(v, np.ndarray) else (dict(v) if isinstance(v, dict) else v)
        return FleetArrays(**kwargs)

    def with_assumed(self, assumed: Mapping[str, Sequence[GpuAssignment]]) -> FleetArrays:
        """A view with extra (assumed, not yet visible) assignments subtracted from free capacity.

        Only the capacity arrays are copied; everything else is shared with ``self``.
        """
        if not assumed:
            return self
        free_milli = self.free_milli.copy()
        free_mem = self.free_mem.copy()
        assigned_milli = self.assigned_milli.copy()
        assigned_mem = self.assigned_mem.copy()
        tenants = self.tenants.copy()
        for node, entries in assumed.items():
            i = self.index.get(node)
            if i is None:
                continue
            for a in entries:
                for gi in a.gpu_indices:
                    cols = np.nonzero(self.gpu_index[i] == gi)[0]
                    if cols.size == 0:
                        continue
                    j = int(cols[0])
                    assigned_milli[i, j] += a.milli
                    free_milli[i, j] = max(0, free_milli[i, j] - a.milli)
                    mem = assigned_memory(a, int(self.mem_total[i, j]))
                    assigned_mem[i, j] += mem
                    free_mem[i, j] = max(0, free_mem[i, j] - mem)
                    tenants[i, j] += 1
        out = replace(self)
        out.free_milli = free_milli
        out.free_mem = free_mem
        out.assigned_milli = assigned_milli
        out.assigned_mem = assigned_mem
        out.tenants = tenants
        return out


def build_arrays(nodes: Sequence[GpuNode], idle_used_bytes: int = DEFAULT_IDLE_USED_BYTES) -> FleetArrays:
    """Build the columnar view of ``nodes``. Cost is linear in GPUs; done once per snapshot, off the hot path."""
    n = len(nodes)
    g = max((len(nd.gpus) for nd in nodes), default=0)
    g = max(g, 1)
    shape = (n, g)
    present = np.zeros(shape, dtype=np.bool_)
    gpu_index = np.full(shape, -1, dtype=np.int32)
    mem_total = np.zeros(shape, dtype=np.int64)
    mem_used = np.zeros(shape, dtype=np.int64)
    assigned_milli = np.zeros(shape, dtype=np.int32)
    assigned_mem = np.zeros(shape, dtype=np.int64)
    tenants = np.zeros(shape, dtype=np.int32)
    temp = np.zeros(shape, dtype=np.float64)
    slowdown = np.full(shape, np.inf, dtype=np.float64)
    shutdown = np.full(shape, np.inf, dtype=np.float64)
    trend = np.zeros(shape, dtype=np.float64)
    throttle = np.zeros(shape, dtype=np.int64)
    util = np.zeros(shape, dtype=np.float64)
    mem_util = np.zeros(shape, dtype=np.float64)
    clock_ratio = np.ones(shape, dtype=np.float64)
    xid = np.zeros(shape, dtype=np.int32)
    numa = np.full(shape, -1, dtype=np.int32)
    switch = np.full(shape, -1, dtype=np.int32)
    nvlink = np.zeros((n, g, g), dtype=np.bool_)
    model_id = np.full(shape, -1, dtype=np.int32)
    gpu_count = np.zeros(n, dtype=np.int32)
    cpu_free = np.zeros(n, dtype=np.int64)
    mem_free_host = np.zeros(n, dtype=np.int64)
    observed_at = np.full(n, np.nan, dtype=np.float64)
    mps = np.zeros(n, dtype=np.bool_)

    models: dict[str, int] = {}
    switches: dict[str, int] = {}
    for i, nd in enumerate(nodes):
        gpu_count[i] = len(nd.gpus)
        cpu_free[i] = nd.cpu_free_milli
        mem_free_host[i] = nd.memory_free_bytes
        if nd.observed_at is not None:
            observed_at[i] = nd.observed_at
        mps[i] = nd.mps_enabled
        col_of = {gp.index: j for j, gp in enumerate(nd.gpus)}
        for a in nd.assignments:
            for gi in a.gpu_indices:
                j = col_of.get(gi)
                if j is None:
                    continue
                assigned_milli[i, j] += a.milli
                assigned_mem[i, j] += assigned_memory(a, nd.gpus[j].memory_total_bytes)
                tenants[i, j] += 1
        for j, gp in enumerate(nd.gpus):
            present[i, j] = True
            gpu_index[i, j] = gp.index
            mem_total[i, j] = gp.memory_total_bytes
            mem_used[i, j] = gp.memory_used_bytes
            temp[i, j] = gp.temperature_celsius
            slowdown[i, j] = gp.slowdown_celsius
            shutdown[i, j] = gp.shutdown_celsius
            trend[i, j] = gp.temperature_trend_c_per_min
            throttle[i, j] = gp.throttle_reasons
            util[i, j] = gp.utilization
            mem_util[i, j] = gp.memory_utilization
            clock_ratio[i, j] = gp.clock_ratio
            xid[i, j] = gp.xid_errors
            numa[i, j] = gp.numa_node
            if gp.pcie_switch:
                switch[i, j] = switches.setdefault(gp.pcie_switch, len(switches))
            model_id[i, j] = models.setdefault(gp.model, len(models))
            for peer in gp.nvlink_peers:
                k = col_of.get(peer)
                if k is not None:
                    nvlink[i, j, k] = True
                    nvlink[i, k, j] = True

    # Telemetry occupancy: memory in use beyond driver overhead occupies that share of the GPU even when kelvin did
    # not place it (pods of another scheduler, leaks). Capacity is the tighter of kelvin's record and telemetry.
    used_counted = np.where(mem_used > idle_used_bytes, mem_used, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        used_milli = np.where(mem_total > 0, np.ceil(used_counted * MILLI_PER_GPU / np.maximum(mem_total, 1)), 0)
    occupied = np.maximum(assigned_milli, used_milli.astype(np.int32))
    free_milli = np.where(present, np.clip(MILLI_PER_GPU - occupied, 0, MILLI_PER_GPU), 0).astype(np.int32)
    free_mem = np.where(present, np.clip(mem_total - np.maximum(used_counted, assigned_mem), 0, None), 0)

    names = tuple(nd.name for nd in nodes)
    return FleetArrays(
        names=names, index={nm: i for i, nm in enumerate(names)}, gpu_present=present, gpu_index=gpu_index,
        mem_total=mem_total, mem_used=mem_used, assigned_milli=assigned_milli, assigned_mem=assigned_mem,
        free_milli=free_milli, free_mem=free_mem.astype(np.int64), tenants=tenants, temp=temp, slowdown=slowdown,
        shutdown=shutdown, trend=trend, throttle=throttle, util=util, mem_util=mem_util, clock_ratio=clock_ratio,
        xid=xid, numa=numa, switch=switch, nvlink=nvlink, model_id=model_id,
        models=tuple(sorted(models, key=lambda m: models[m])), gpu_count=gpu_count, cpu_free=cpu_free,
        mem_free_host=mem_free_host, observed_at=observed_at, mps=mps,
    )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What scoring reads: the fleet at one moment. Never mutated; a refresh publishes a new one."""

    nodes: tuple[GpuNode, ...]
    taken_at: float
    source: str = "unknown"
    source_healthy: bool = True
    arrays: FleetArrays = field(init=False, repr=False, compare=False)
    by_name: Mapping[str, GpuNode] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "arrays", build_arrays(self.nodes))
        object.__setattr__(self, "by_name", {nd.name: nd for nd in self.nodes})

    def node(self, name: str) -> GpuNode | None:
        return self.by_name.get(name)

    def stale_mask(self, now: float, max_age_s: float) -> BoolA:
        """Per node: telemetry older than ``max_age_s`` or never seen."""
        age = now - self.arrays.observed_at
        return np.asarray(~(age <= max_age_s), dtype=np.bool_)  # NaN compares False -> stale

    def stale_nodes(self, now: float, max_age_s: float) -> list[str]:
        mask = self.stale_mask(now, max_age_s)
        return [self.arrays.names[i] for i in np.nonzero(mask)[0]]

    def age_seconds(self, now: float) -> float:
        return max(0.0, now - self.taken_at) if math.isfinite(self.taken_at) else math.inf


def empty_snapshot(source: str = "none") -> Snapshot:
    return Snapshot(nodes=(), taken_at=float("-inf"), source=source, source_healthy=False)
