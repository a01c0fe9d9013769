"""The paper's experiment protocol: a seeded shuffle of the trace, then seeded random copies until the arrived GPU
demand reaches the target share of cluster capacity. Pods never leave."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from .trace import TracePod

IntA = npt.NDArray[np.int64]
DEFAULT_TARGET = 1.3
_BATCH = 1024


def arrivals(pods: Sequence[TracePod], seed: int) -> Iterator[int]:
    """Indices into ``pods`` in arrival order, without end: every pod in an order shuffled with ``seed``, then pods
    drawn uniformly at random (with replacement, from the same generator). Ends after the shuffle when no pod asks
    for a GPU (no target could ever be reached). The caller stops when its arrived demand reaches the target."""
    if not pods:
        return
    rng = np.random.default_rng(seed)
    yield from rng.permutation(len(pods)).tolist()
    if not any(p.gpu_demand_milli for p in pods):
        return
    while True:
        yield from rng.integers(0, len(pods), size=_BATCH).tolist()


def arrival_order(pods: Sequence[TracePod], capacity_milli: int, seed: int, target: float = DEFAULT_TARGET) -> IntA:
    """Indices into ``pods`` in arrival order, by each pod's own GPU demand (:attr:`TracePod.gpu_demand_milli`).

    All pods arrive in an order shuffled with ``seed``; then pods drawn uniformly at random (with replacement, from
    the same generator) keep arriving until the cumulative GPU demand reaches ``target * capacity_milli``. If the
    trace alone exceeds the target, arrivals stop at the pod that reaches it. (The simulator stops on the demand it
    actually counts, which for memory pools depends on the GPU they land on: :func:`arrivals`.)
    """
    if target <= 0:
        raise ValueError(f"target must be positive, got {target}")
    goal = target * capacity_milli
    out: list[int] = []
    reached = 0
    for i in arrivals(pods, seed):
        out.append(i)
        reached += pods[i].gpu_demand_milli
        if reached >= goal:
            break
    return np.asarray(out, dtype=np.int64)
