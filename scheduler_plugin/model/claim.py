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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

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
    return np.asarray(np.clip(np.maximum(s, by_pool), 1, NEVER_FITS), dtype=np.int64)


def charge_milli(milli: int | None, memory_bytes: int | None, memory_total: int) -> int:
    """Thousandths of one GPU of ``memory_total`` bytes that a claim of ``milli`` (compute share; ``None`` for a pool
    only) and ``memory_bytes`` (pool; ``None`` for none) takes: 1..:data:`NEVER_FITS`."""
    return int(charge_milli_array(milli or 0, -1 if memory_bytes is None else memory_bytes, memory_total))


def charged_milli(a: GpuAssignment, memory_total: int) -> int:
    """What a recorded claim occupies on one of its GPUs: its charge, at most the whole GPU."""
    return min(charge_milli(a.milli, a.memory_bytes, memory_total), MILLI_PER_GPU)


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
