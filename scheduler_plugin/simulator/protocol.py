"""The paper's experiment protocol: a seeded shuffle of the trace, then seeded random copies until the arrived GPU
demand reaches the target share of cluster capacity. Pods never leave."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .trace import TracePod

IntA = npt.NDArray[np.int64]
DEFAULT_TARGET = 1.3
_BATCH = 1024


def arrival_order(pods: Sequence[TracePod], capacity_milli: int, seed: int, target: float = DEFAULT_TARGET) -> IntA:
    """Indices into ``pods`` in arrival order.

    All pods arrive in an order shuffled with ``seed``; then pods drawn uniformly at random (with replacement, from
    the same generator) keep arriving until the cumulative GPU demand reaches ``target * capacity_milli``. If the
    trace alone exceeds the target, arrivals stop at the pod that reaches it.
    """
    if not pods:
        return np.zeros(0, dtype=np.int64)
    if target <= 0:
        raise ValueError(f"target must be positive, got {target}")
    rng = np.random.default_rng(seed)
    demand = np.array([p.gpu_demand_milli for p in pods], dtype=np.int64)
    goal = target * capacity_milli
    order = rng.permutation(len(pods)).astype(np.int64)
    total = np.cumsum(demand[order])
    if total[-1] >= goal:
        return order[: int(np.searchsorted(total, goal)) + 1]
    if not demand.any():
        return order  # no pod asks for a GPU: the target can never be reached
    chunks = [order]
    reached = int(total[-1])
    while reached < goal:
        extra = rng.integers(0, len(pods), size=_BATCH).astype(np.int64)
        cum = reached + np.cumsum(demand[extra])
        if cum[-1] >= goal:
            chunks.append(extra[: int(np.searchsorted(cum, goal)) + 1])
            break
        chunks.append(extra)
        reached = int(cum[-1])
    return np.concatenate(chunks)
