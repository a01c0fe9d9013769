"""A pod's GPU claim and what it is charged on a GPU: the one reading and the one charge.

Bind (the ledger entry), the listing of bound pods (``telemetry/assignments.py``), the snapshot's capacity arrays,
the operator's strategies, the simulators and the demo all go through these two functions, so that a pod is charged
the same wherever kelvin looks at it:

* :func:`claim_of` reads a :class:`~.request.GpuRequest` (parsed from the pod object by
  :func:`~.request.parse_pod`) into the :class:`~.gpu.GpuAssignment` kelvin records: the GPU indices, the compute
  share per GPU (``milli``: 1000 for whole GPUs, ``None`` for a memory pool without a compute share) and the memory
  pool per GPU. The record holds what the pod *asked for*, never a charge: the charge depends on the GPU.
* :func:`charge_milli` (and :func:`charge_milli_array`, the same formula over arrays) says how many thousandths of a
  GPU with ``memory_total`` bytes that claim takes: a whole GPU 1000; a share the larger of its compute share and
  its memory pool's share of the GPU, ``ceil(pool * 1000 / memory_total)`` (a 20 GiB pool on an 80 GiB GPU is 250).
  A pool larger than the GPU (or a GPU of unknown size) is charged :data:`NEVER_FITS`.
* :class:`SlotCharges` is that charge over a fleet's arrays: claims resolved to the GPU slots they land on, with the
  thousandths and memory each takes there, added to (or given back from) the capacity columns. The snapshot builder
  (records on the nodes), the ledger overlay (``FleetArrays.with_assumed``) and the simulators' placements
  (``FleetArrays.charge``) all charge through it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .gpu import MILLI_PER_GPU, GpuAssignment

if TYPE_CHECKING:
    from .request import GpuRequest

NEVER_FITS = MILLI_PER_GPU + 1
"""The charge of a claim no GPU of that size can hold (a demand above 1000 never fits)."""

IntA = npt.NDArray[np.int64]


def charge_milli_array(share: npt.ArrayLike, pool: npt.ArrayLike, memory_total: npt.ArrayLike) -> IntA:
    """Thousandths of a GPU charged, elementwise (broadcasting): ``share`` is the compute share (0 when none, 1000
    for a whole GPU), ``pool`` the memory pool in bytes (-1 when none), ``memory_total`` the GPU's memory in bytes.
    The result is 1..:data:`NEVER_FITS`."""
    s = np.asarray(share, dtype=np.int64)
    p = np.asarray(pool, dtype=np.int64)
    total = np.asarray(memory_total, dtype=np.int64)
    safe_total = np.maximum(total, 1)
    # ceil(pool * 1000 / total) in integers; the pool is capped just above the total so the product cannot overflow
    by_pool = -(-np.minimum(np.maximum(p, 0), safe_total + 1) * MILLI_PER_GPU // safe_total)
    by_pool = np.where(p < 0, 0, np.where(total <= 0, NEVER_FITS, by_pool))
    # np.minimum/np.maximum rather than np.clip: the same values, without clip's per-call overhead (this runs per
    # placement in the simulators)
    return np.asarray(np.minimum(np.maximum(np.maximum(s, by_pool), 1), NEVER_FITS), dtype=np.int64)


def charge_milli(milli: int | None, memory_bytes: int | None, memory_total: int) -> int:
    """Thousandths of one GPU of ``memory_total`` bytes that a claim of ``milli`` (compute share; ``None`` for a pool
    only) and ``memory_bytes`` (pool; ``None`` for none) takes: 1..:data:`NEVER_FITS`."""
    return int(charge_milli_array(milli or 0, -1 if memory_bytes is None else memory_bytes, memory_total))


def charged_milli(a: GpuAssignment, memory_total: int) -> int:
    """What a recorded claim occupies on one of its GPUs: its charge, at most the whole GPU."""
    return min(charge_milli(a.milli, a.memory_bytes, memory_total), MILLI_PER_GPU)


@dataclass(frozen=True, slots=True)
class SlotCharges:
    """Claims resolved to the GPU slots of a fleet's ``(N, G)`` arrays, with what each takes on its slot."""

    rows: IntA
    cols: IntA
    milli: IntA
    """Thousandths charged (:func:`charged_milli`: the claim's charge on that GPU, at most the whole GPU)."""
    mem: IntA
    """Bytes of GPU memory held: the memory pool, else the compute share of the GPU's memory (a whole GPU: all)."""

    @classmethod
    def of(
        cls, gpu_index: npt.NDArray[Any], mem_total: IntA, claims: Iterable[tuple[int, GpuAssignment]]
    ) -> SlotCharges:
        """``claims`` are (row, record) pairs; each of a record's GPU indices is charged on the first slot of its row
        that reports that index (a GPU the row does not report is skipped)."""
        a_rows: list[int] = []
        a_gpu: list[int] = []
        a_share: list[int] = []  # the compute share (0 when none)
        a_pool: list[int] = []  # the memory pool in bytes (-1 when none)
        for row, a in claims:
            for gi in a.gpu_indices:
                a_rows.append(row)
                a_gpu.append(gi)
                a_share.append(a.milli or 0)
                a_pool.append(-1 if a.memory_bytes is None else a.memory_bytes)
        if not a_rows:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, empty, empty)
        rows = np.asarray(a_rows, dtype=np.int64)
        gpu = np.asarray(a_gpu, dtype=np.int64)
        hit = gpu_index[rows] == gpu[:, None]  # (m, G); padding is -1, never a GPU's index
        known = hit.any(axis=1) & (gpu >= 0)
        rows, cols = rows[known], hit[known].argmax(axis=1)  # the first slot with that index
        share = np.asarray(a_share, dtype=np.int64)[known]
        pool = np.asarray(a_pool, dtype=np.int64)[known]
        total = mem_total[rows, cols]
        milli = np.minimum(charge_milli_array(share, pool, total), MILLI_PER_GPU)
        mem = np.where(pool >= 0, pool, total * np.minimum(share, MILLI_PER_GPU) // MILLI_PER_GPU)
        return cls(rows, cols, milli, np.asarray(mem, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.rows.size)

    def record(
        self, assigned_milli: npt.NDArray[Any], assigned_mem: IntA, tenants: npt.NDArray[Any], sign: int = 1
    ) -> None:
        """Add the charges to the assigned columns in place (``sign=-1`` gives them back)."""
        at = (self.rows, self.cols)
        np.add.at(assigned_milli, at, (sign * self.milli).astype(assigned_milli.dtype))
        np.add.at(assigned_mem, at, sign * self.mem)
        np.add.at(tenants, at, np.full(len(self), sign, dtype=tenants.dtype))

    def take(self, free_milli: npt.NDArray[Any], free_mem: IntA, mem_total: IntA, sign: int = 1) -> None:
        """Subtract the charges from the free columns in place (``sign=-1`` gives them back), each touched slot kept
        within 0..its capacity (charges are >= 0: one clamp after the sum is the per-claim clamps)."""
        at = (self.rows, self.cols)
        np.subtract.at(free_milli, at, (sign * self.milli).astype(free_milli.dtype))
        np.subtract.at(free_mem, at, sign * self.mem)
        free_milli[at] = np.minimum(np.maximum(free_milli[at], 0), MILLI_PER_GPU)
        free_mem[at] = np.minimum(np.maximum(free_mem[at], 0), mem_total[at])


def claim_of(
    req: GpuRequest,
    gpus: Sequence[int] = (),
    *,
    pod_key: str | None = None,
    pod_uid: str | None = None,
) -> GpuAssignment:
    """The record of ``req`` placed on ``gpus`` (its own GPU indices): what bind puts in the ledger and what the
    listing rebuilds from the pod the binder annotated. A whole-GPU request claims 1000 of each GPU; a share claims
    its compute share (``None`` without one) and its memory pool."""
    shared = req.shared
    return GpuAssignment(
        pod_key=pod_key or req.pod_key,
        gpu_indices=tuple(int(g) for g in gpus),
        milli=req.milli if shared else MILLI_PER_GPU,
        memory_bytes=req.memory_bytes if shared else None,
        pod_uid=pod_uid or req.pod_uid or None,
        priority=req.priority,
    )


def parse_gpu_indices(raw: object) -> tuple[int, ...] | None:
    """``"0,1"`` -> ``(0, 1)``; None when the value is not a comma-separated list of GPU indices."""
    if not isinstance(raw, str) or not raw.strip():
        return None
    try:
        out = tuple(int(p) for p in raw.split(","))
    except ValueError:
        return None
    if any(i < 0 for i in out) or len(set(out)) != len(out):
        return None
    return out
