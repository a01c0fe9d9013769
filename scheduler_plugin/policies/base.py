"""The plugin contracts every policy implements. Scoring is vectorised over candidate nodes.

A cycle scores one pod against many nodes. ``idx`` is an int array of row numbers into :class:`FleetArrays`
(the candidates); every method returns one value per candidate, in the same order.

* :class:`FilterPlugin` says which candidates can run the pod at all, and explains the ones it rejects.
* :class:`ScorePlugin` returns raw scores (higher is better) and normalises them to 0..10 in a separate step.
* :class:`GpuPicker` chooses the GPUs inside one node.

Plugins are pure: they read the request, the arrays and the :class:`CycleContext`, and touch no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ..model import FleetArrays, GpuRequest

BoolA = npt.NDArray[np.bool_]
IntA = npt.NDArray[np.int64]
FloatA = npt.NDArray[np.float64]

MAX_EXTENDER_PRIORITY = 10
"""Extender scores run from 0 to this (kube-scheduler's ``MaxExtenderPriority``)."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a node cannot run the pod, in words an operator understands."""

    reason: str
    unresolvable: bool = False
    """True when preempting pods on the node would not help (wrong GPU model, too few GPUs at all, too hot)."""
    code: str = ""
    """A stable label for metrics (``gpu_memory``, ``gpu_count``, ``gpu_model``, ``topology``, ``thermal``,
    ``stale_telemetry``: the ``reason`` values of ``kelvin_extender_rejections_total``); empty when unset."""


@dataclass(slots=True)
class CycleContext:
    """What a scheduling cycle knows besides the request and the arrays."""

    now: float
    """Unix time of the cycle."""
    stale: BoolA | None = None
    """(N,) telemetry too old or missing, per node row; ``None`` means all fresh."""
    extras: dict[str, object] = field(default_factory=dict)
    """Per-cycle data a policy wants computed once (e.g. the fragmentation workload)."""


@runtime_checkable
class FilterPlugin(Protocol):
    name: str

    def filter(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> BoolA:
        """(len(idx),) True where the node can run the pod."""
        ...

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> Rejection:
        """Why node row ``row`` was rejected (only called for rejected nodes)."""
        ...


@runtime_checkable
class ScorePlugin(Protocol):
    name: str

    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        """(len(idx),) raw scores, higher is better. Only called for nodes that passed every filter."""
        ...

    def normalize(self, raw: FloatA) -> FloatA:
        """Raw scores to 0..MAX_EXTENDER_PRIORITY (floats; the framework rounds after weighting)."""
        ...

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> list[str]:
        """Readable reasons for the score of node row ``row``."""
        ...


@runtime_checkable
class GpuPicker(Protocol):
    name: str

    def pick(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> tuple[int, ...] | None:
        """GPU indices (their own indices, not slots) for the pod on node row ``row``; None if it does not fit."""
        ...
