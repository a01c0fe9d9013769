"""A node's row of the fleet with victims' GPUs released: the counterpart of ``FleetArrays.with_assumed``.

:func:`unit_release` says what releasing some assignments gives back on each GPU column of the node;
:func:`released_rows` builds a small :class:`FleetArrays` of ``K`` rows, each a copy of the node with one sum of such
releases given back, so that the framework's own filters judge all ``K`` variants in one vectorised call (no second
fit check). Releasing a claim gives back, on each of its GPUs, the thousandths and the memory it is charged
(:func:`~scheduler_plugin.model.claim.charged_milli`, :func:`~scheduler_plugin.model.snapshot.assigned_memory`),
capped at the GPU's size: the victim's use is taken off both kelvin's record and the telemetry occupancy it shows up
in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from ..model import MILLI_PER_GPU, FleetArrays, GpuAssignment
from ..model.claim import charged_milli
from ..model.snapshot import assigned_memory

IntA = npt.NDArray[np.int64]

#: Appended to the node's name with the variant's number: never a real node name (the ledger overlay, which goes by
#: name, leaves the variants alone).
VARIANT_SEP = "\x00"


@dataclass(frozen=True, slots=True)
class Release:
    """What some assignments give back on each GPU column of one node (shape ``(G,)`` each)."""

    milli: IntA
    mem: IntA
    tenants: IntA


def unit_release(fleet: FleetArrays, row: int, assignments: Iterable[GpuAssignment]) -> Release:
    g = fleet.max_gpus
    milli = np.zeros(g, dtype=np.int64)
    mem = np.zeros(g, dtype=np.int64)
    tenants = np.zeros(g, dtype=np.int64)
    col_of = {int(x): j for j, x in enumerate(fleet.gpu_index[row].tolist()) if fleet.gpu_present[row, j]}
    for a in assignments:
        for gi in a.gpu_indices:
            j = col_of.get(gi)
            if j is None:
                continue
            total = int(fleet.mem_total[row, j])
            milli[j] += charged_milli(a, total)
            mem[j] += assigned_memory(a, total)
            tenants[j] += 1
    return Release(milli, mem, tenants)


def released_rows(fleet: FleetArrays, row: int, milli: IntA, mem: IntA, tenants: IntA) -> FleetArrays:
    """``K`` copies of node ``row`` (``K = len(milli)``); copy ``k`` with ``milli[k]``, ``mem[k]`` and
    ``tenants[k]`` (each ``(K, G)``) given back on its GPU columns."""
    k = milli.shape[0]
    take = np.full(k, row, dtype=np.int64)
    kwargs: dict[str, object] = {}
    for f in fields(fleet):
        v = getattr(fleet, f.name)
        kwargs[f.name] = v[take] if isinstance(v, np.ndarray) else v
    names = tuple(f"{fleet.names[row]}{VARIANT_SEP}{i}" for i in range(k))
    kwargs["names"] = names
    kwargs["index"] = {n: i for i, n in enumerate(names)}
    out = FleetArrays(**kwargs)  # type: ignore[arg-type]
    present = fleet.gpu_present[row]
    total = fleet.mem_total[row]
    out.free_milli = np.where(present, np.minimum(MILLI_PER_GPU, out.free_milli + milli), 0).astype(np.int32)
    out.free_mem = np.where(present, np.minimum(total, out.free_mem + mem), 0).astype(np.int64)
    out.assigned_milli = np.maximum(0, out.assigned_milli - milli).astype(np.int32)
    out.assigned_mem = np.maximum(0, out.assigned_mem - mem).astype(np.int64)
    out.tenants = np.maximum(0, out.tenants - tenants).astype(np.int32)
    return out
