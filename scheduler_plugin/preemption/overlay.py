"""A node's row of the fleet with victims' GPUs released: the counterpart of ``FleetArrays.with_assumed``.

:func:`released_rows` builds a small :class:`FleetArrays` of ``K`` rows, each a copy of one node with one set of
assignments taken off it, so that the framework's own filters judge all ``K`` variants in one vectorised call
(no second fit check). Releasing a claim gives back, on each of its GPUs, the thousandths and the memory it is
charged (:func:`~scheduler_plugin.model.claim.charged_milli`, :func:`~scheduler_plugin.model.snapshot.assigned_memory`),
capped at the GPU's size: the victim's use is taken off both kelvin's record and the telemetry occupancy it shows up
in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

import numpy as np

from ..model import MILLI_PER_GPU, FleetArrays, GpuAssignment
from ..model.claim import charged_milli
from ..model.snapshot import assigned_memory

#: Appended to the node's name with the variant's number: never a real node name (the ledger overlay, which goes by
#: name, leaves the variants alone).
VARIANT_SEP = "\x00"


def released_rows(fleet: FleetArrays, row: int, releases: Sequence[Sequence[GpuAssignment]]) -> FleetArrays:
    """``len(releases)`` copies of node ``row``; copy ``k`` with the assignments ``releases[k]`` released."""
    k = len(releases)
    take = np.full(k, row, dtype=np.int64)
    kwargs: dict[str, object] = {}
    for f in fields(fleet):
        v = getattr(fleet, f.name)
        kwargs[f.name] = v[take] if isinstance(v, np.ndarray) else v
    base = fleet.names[row]
    names = tuple(f"{base}{VARIANT_SEP}{i}" for i in range(k))
    kwargs["names"] = names
    kwargs["index"] = {n: i for i, n in enumerate(names)}
    out = FleetArrays(**kwargs)  # type: ignore[arg-type]
    col_of = {int(g): j for j, g in enumerate(fleet.gpu_index[row].tolist()) if fleet.gpu_present[row, j]}
    for i, assignments in enumerate(releases):
        for a in assignments:
            for gi in a.gpu_indices:
                j = col_of.get(gi)
                if j is None:
                    continue
                total = int(fleet.mem_total[row, j])
                milli = charged_milli(a, total)
                mem = assigned_memory(a, total)
                out.free_milli[i, j] = min(MILLI_PER_GPU, int(out.free_milli[i, j]) + milli)
                out.free_mem[i, j] = min(total, int(out.free_mem[i, j]) + mem)
                out.assigned_milli[i, j] = max(0, int(out.assigned_milli[i, j]) - milli)
                out.assigned_mem[i, j] = max(0, int(out.assigned_mem[i, j]) - mem)
                out.tenants[i, j] = max(0, int(out.tenants[i, j]) - 1)
    return out
