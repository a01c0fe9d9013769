"""The plugin contracts every policy implements. Scoring is vectorised over candidate nodes.

A cycle scores one pod against many nodes. ``idx`` is an int array of row numbers into :class:`FleetArrays`
(the candidates); every method returns one value per candidate, in the same order.

* :class:`FilterPlugin` says which candidates can run the pod at all, and explains the ones it rejects.
* :class:`ScorePlugin` returns raw scores (higher is better) and normalises them to 0..10 in a separate step.
* :class:`GpuPicker` chooses the GPUs inside one node.

Plugins are pure: they read the request, the arrays and the :class:`CycleContext`, and touch no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast, runtime_checkable

import numpy as np
import numpy.typing as npt

from ..model import FleetArrays, GpuRequest

BoolA = npt.NDArray[np.bool_]
IntA = npt.NDArray[np.int64]
FloatA = npt.NDArray[np.float64]
T = TypeVar("T")

MAX_EXTENDER_PRIORITY = 10
"""Extender scores run from 0 to this (kube-scheduler's ``MaxExtenderPriority``)."""


class RejectionKind(StrEnum):
    """What a rejection is about: its value is the ``reason`` label of ``kelvin_extender_rejections_total``
    (docs/metrics.md). Each :class:`Rejection` kind carries one; the extender counts by it, never by the text."""

    GPU_MEMORY = "gpu_memory"
    """The GPUs are too small for the pod's memory or share, or have too little of it free."""
    GPU_COUNT = "gpu_count"
    """Too few GPUs on the node (in all, or free now)."""
    GPU_MODEL = "gpu_model"
    """Too few GPUs of the models the pod allows."""
    TOPOLOGY = "topology"
    """No NVLink-connected group of the size the pod requires."""
    THERMAL = "thermal"
    """GPUs too hot or throttling, or the node hot (the operator drains it)."""
    STALE_TELEMETRY = "stale_telemetry"
    """The node's telemetry is stale or missing (``onStale: deny``)."""
    RESERVED = "reserved"
    """The pod is below the ``priority`` policy's ``protectFrom`` and would break a free NVLink group the policy
    keeps for higher priorities (``reserveGpus``)."""
    PREEMPTION_PENDING = "preemption_pending"
    """The extender's own: a preemption for the pod is still evicting its victims."""
    UNKNOWN_NODE = "unknown_node"
    """The extender's own: kelvin has no record of the node (``denyUnknownNodes``)."""
    BAD_REQUEST = "bad_request"
    """The extender's own: the pod's kelvin annotations are malformed."""
    NODE_RESOURCES = "node_resources"
    """The node's CPU or memory (kube-scheduler's NodeResourcesFit): only the simulator checks it, the extender never
    counts it."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a node cannot run the pod: one small frozen dataclass per kind (:mod:`scheduler_plugin.policies.reasons`,
    like kube-scheduler's ``InsufficientResource``), with its figures as typed fields. Its :attr:`kind` (the metrics
    label) and :attr:`unresolvable` are fixed by the class; :attr:`reason`, the words an operator reads (the
    ``FailedNodes`` text), is worded once from the fields when the object is made. Equal figures give equal (and
    hashable) objects, so rows worded alike can share one."""

    kind: ClassVar[RejectionKind]
    unresolvable: ClassVar[bool] = False
    """True when preempting pods on the node would not help (wrong GPU model, too few GPUs at all, too hot)."""
    reason: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", self.words())

    def words(self) -> str:
        """The reason text, from the fields (each kind words its own)."""
        raise NotImplementedError

    def need(self) -> str:
        """What the pod needed that the node lacks, without the node's own figures (nodes rejected for the same need
        read alike: the demo groups refusals by it). The whole reason unless the kind says more."""
        return self.reason

    def nearness(self) -> float:
        """How near the node came to fitting, among nodes of the same :meth:`need` (higher is nearer: free GPUs,
        free memory, cool GPUs); 0 when the kind has no such figure."""
        return 0.0


class StateKey(Generic[T]):
    """A typed key of :class:`CycleState`: ``ctx.state.read(WORKLOAD)`` is a ``Workload`` to the type checker.

    Keys compare by identity (two keys of the same name are different entries); the name is for messages only."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StateKey({self.name!r})"


class MissingState(LookupError):
    """A plugin read a cycle-state entry nobody wrote (a wiring error, never a request's fault)."""


class CycleState:
    """What one scheduling cycle computes once and shares between its plugins (kube-scheduler's ``CycleState``).

    Typed by :class:`StateKey`; made fresh per cycle by ``Framework.context`` and dropped with it, so nothing a
    request computes can reach another request."""

    __slots__ = ("_data",)

    def __init__(self, entries: Mapping[StateKey[Any], object] | None = None) -> None:
        self._data: dict[StateKey[Any], object] = dict(entries or {})

    def read(self, key: StateKey[T]) -> T:
        """The entry of ``key``; :class:`MissingState` naming it when nobody wrote it this cycle."""
        try:
            return cast(T, self._data[key])
        except KeyError:
            written = ", ".join(sorted(k.name for k in self._data)) or "nothing"
            raise MissingState(f"cycle state has no {key.name!r} (written this cycle: {written})") from None

    def find(self, key: StateKey[T]) -> T | None:
        """The entry of ``key``, or ``None`` when nobody wrote it."""
        return cast("T | None", self._data.get(key))

    def write(self, key: StateKey[T], value: T) -> None:
        self._data[key] = value

    def setdefault(self, key: StateKey[T], value: T) -> T:
        """Write ``value`` unless ``key`` has an entry already; the entry."""
        return cast(T, self._data.setdefault(key, value))

    def compute(self, key: StateKey[T], make: Callable[[], T]) -> T:
        """The entry of ``key``, made by ``make()`` (once per cycle) when missing."""
        if key in self._data:
            return cast(T, self._data[key])
        value = make()
        self._data[key] = value
        return value

    def __contains__(self, key: StateKey[Any]) -> bool:
        return key in self._data


@dataclass(slots=True)
class CycleContext:
    """What a scheduling cycle knows besides the request and the arrays."""

    now: float
    """Unix time of the cycle."""
    stale: BoolA | None = None
    """(N,) telemetry too old or missing, per node row; ``None`` means all fresh."""
    state: CycleState = field(default_factory=CycleState)
    """Per-cycle data plugins compute once and share (typed by :class:`StateKey`)."""


RECENT_PLACEMENTS: StateKey[Mapping[str, Sequence[float]]] = StateKey("kelvin.placements")
"""Node name -> unix times of the placements the framework's assumed ledger holds (written by the framework before
scoring when it has a ledger)."""


@dataclass(frozen=True, slots=True)
class PlacementLog:
    """The same placements as :data:`RECENT_PLACEMENTS`, as one list in the order made: ``nodes[i]`` took a pod at
    ``times[i]``, for ``i < size`` (the lists may grow past ``size`` later; what is below it never changes). Each
    node's times appear in the order of its :data:`RECENT_PLACEMENTS` list. A reader that only needs the last seconds
    slices it (``ordered``: the times never decrease, so the window's start is a bisection) instead of walking every
    node that took a pod within the ledger's TTL.

    ``epoch`` and ``first`` number the placements: ``nodes[i]`` is placement ``first + i`` of the epoch, and two logs
    of one epoch (the ledger's log trimmed of what reached the TTL, grown by new binds) hold the same placement under
    the same number, so a reader can keep what it derived from a placement (its node's row) from one cycle to the
    next. Epochs are unique across ledgers; a ledger starts a new one when it rebuilds its history otherwise than by
    such a trim. ``epoch`` 0: not numbered."""

    nodes: Sequence[str]
    times: Sequence[float]
    size: int
    ordered: bool
    epoch: int = 0
    first: int = 0


PLACEMENT_LOG: StateKey[PlacementLog] = StateKey("kelvin.placement_log")
"""The assumed ledger's :class:`PlacementLog`, written with :data:`RECENT_PLACEMENTS`."""


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


# Optional hooks: a plugin implements the ones it needs; the framework calls every plugin that has one, in order,
# and knows nothing else about them.


@runtime_checkable
class RestrictsPlacement(Protocol):
    """A score plugin that also refuses nodes (the ``priority`` policy's reserve): the framework runs it after its
    own filters, in filter, pick and explain alike."""

    name: str

    def restricts(self) -> bool:
        """Whether the plugin refuses any node at all with its arguments (else it is not run as a filter)."""
        ...

    def filter(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> BoolA: ...

    def reasons(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> list[Rejection]: ...


@runtime_checkable
class PreparesSnapshot(Protocol):
    def prepare(self, fleet: FleetArrays) -> None:
        """Fill ``fleet``'s snapshot index with what the plugin derives from telemetry alone; called once when a
        snapshot is published (``Framework.warm``), so that no request pays for it."""
        ...


@runtime_checkable
class PreScorePlugin(Protocol):
    def pre_score(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> None:
        """Write what the plugin's scores of this cycle share into ``ctx.state``; called before the scores."""
        ...


@runtime_checkable
class ObservesPods(Protocol):
    def observe(self, req: GpuRequest) -> None:
        """Learn one arriving pod (``Framework.observe``: once per pod the extender's filter verb sees)."""
        ...


@runtime_checkable
class BindsPeers(Protocol):
    def bind(self, peers: Sequence[object]) -> None:
        """A picker's hook: share state with the score plugins of the same framework (``peers``; called once, when
        the framework is built). The picker decides alone which of them it can share with."""
        ...
