"""The kinds of :class:`~scheduler_plugin.policies.base.Rejection`: one small frozen dataclass each, its figures as
typed fields, its metrics label (:class:`RejectionKind`) and resolvability fixed by the class.

The filters gather the figures (vectorised, :mod:`scheduler_plugin.policies.fit`) and build one object per distinct
set of figures; the object words itself once (:attr:`Rejection.reason`, the ``FailedNodes`` text kube-scheduler shows
on the pod). Whoever needs more than the words reads the fields: the extender counts rejections by ``kind``, the demo
groups refusals by :meth:`Rejection.need` and picks the node that came nearest by :meth:`Rejection.nearness`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..model import GIB, Topology
from ..model import annotations as ann
from ..model.quantity import format_gib
from .base import Rejection, RejectionKind

__all__ = [
    "Fits",
    "GpuAboveMaxTemperature",
    "GpuAtSlowdown",
    "GpuComputeFull",
    "GpuMemoryFull",
    "GpuThrottling",
    "GpusInUse",
    "GpusTooSmall",
    "InsufficientResource",
    "NoGpus",
    "NoNvlinkGroup",
    "NoTelemetry",
    "NodeHot",
    "NodeThrottling",
    "NodeWarming",
    "NvlinkGroupInUse",
    "Rejection",
    "RejectionKind",
    "StaleTelemetry",
    "TooFewGpus",
    "WrongModel",
    "celsius",
]

_NVLINK_REQUIRED = f"the pod sets {ann.TOPOLOGY}={Topology.NVLINK_REQUIRED.value}"
_DRAINED = f"the operator drains hot nodes ({ann.THERMAL_TAINT_KEY}={ann.THERMAL_TAINT_VALUE})"


def celsius(t: float) -> str:
    """``87 °C``, ``72.5 °C``: one decimal, dropped when it is zero."""
    r = round(t, 1)
    return f"{r:.0f} °C" if r == int(r) else f"{r:.1f} °C"


def _gib(n_bytes: int) -> str:
    """A request's memory as the pod wrote it (``20 GiB``, ``20.05 GiB``)."""
    return f"{n_bytes / GIB:g} GiB"


def _gpus(n: int) -> str:
    return "GPU" if n == 1 else "GPUs"


# -- fit: the node can never run the pod (unresolvable) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NoGpus(Rejection):
    """The node has no GPUs at all."""

    kind: ClassVar[RejectionKind] = RejectionKind.GPU_COUNT
    unresolvable: ClassVar[bool] = True
    request: str
    """What the pod asks for (:meth:`GpuRequest.describe`)."""

    def words(self) -> str:
        return f"node has no GPUs; {self.need()}"

    def need(self) -> str:
        return f"the pod needs {self.request}"


@dataclass(frozen=True, slots=True)
class TooFewGpus(Rejection):
    """The node has fewer GPUs in all than the pod needs."""

    kind: ClassVar[RejectionKind] = RejectionKind.GPU_COUNT
    unresolvable: ClassVar[bool] = True
    count: int
    total: int

    def words(self) -> str:
        return f"{self.need()}; node has {self.total} in total"

    def need(self) -> str:
        return f"needs {self.count} {_gpus(self.count)}"

    def nearness(self) -> float:
        return self.total


@dataclass(frozen=True, slots=True)
class WrongModel(Rejection):
    """Too few of the node's GPUs are of a model the pod allows (``kelvin.dev/gpu-models``)."""

    kind: ClassVar[RejectionKind] = RejectionKind.GPU_MODEL
    unresolvable: ClassVar[bool] = True
    count: int
    wanted: tuple[str, ...]
    """The pod's allowed models, sorted."""
    node_models: tuple[tuple[str, int], ...]
    """(model, GPUs of it) on the node, sorted by model."""
    unknown: tuple[str, ...] = ()
    """Allowed models whose family kelvin does not know (a likely typo, named in the words)."""

    def words(self) -> str:
        has = ", ".join(f"{n} {m}" for m, n in self.node_models) or "no GPUs"
        hint = (
            f" ({', '.join(self.unknown)}: not a GPU family kelvin knows; {ann.GPU_MODELS} items match by family, "
            "e.g. A100, H100-80GB, L40S)"
            if self.unknown
            else ""
        )
        return f"{self.need()}; node has {has}{hint}"

    def need(self) -> str:
        return f"needs {self.count} {_gpus(self.count)} of model {' or '.join(self.wanted)}"


@dataclass(frozen=True, slots=True)
class GpusTooSmall(Rejection):
    """No allowed GPU of the node has as much memory in all as the pod's memory pool."""

    kind: ClassVar[RejectionKind] = RejectionKind.GPU_MEMORY
    unresolvable: ClassVar[bool] = True
    memory_bytes: int
    largest_bytes: int
    """The largest allowed GPU's memory."""

    def words(self) -> str:
        return f"{self.need()}; the largest allowed GPU here has {format_gib(self.largest_bytes)}"

    def need(self) -> str:
        return f"the pod needs {_gib(self.memory_bytes)} on one GPU"

    def nearness(self) -> float:
        return self.largest_bytes / GIB  # GiB on one GPU, as GpuMemoryFull's


@dataclass(frozen=True, slots=True)
class _TooHot(Rejection):
    """Too few GPUs are cool enough (the figures every thermal cause shares; the cause words its hottest GPU)."""

    kind: ClassVar[RejectionKind] = RejectionKind.THERMAL
    unresolvable: ClassVar[bool] = True
    gpu: int
    """The hottest offending GPU (its own index) among the ones that would otherwise fit."""
    cool: int
    """GPUs cool enough among ``suitable``."""
    suitable: int
    """GPUs of an allowed model and size."""
    count: int
    """GPUs the pod needs."""

    def words(self) -> str:
        return f"{self.cause()}; {self.cool} of {self.suitable} GPUs are cool enough, the pod needs {self.count}"

    def cause(self) -> str:
        raise NotImplementedError

    def need(self) -> str:
        return f"the pod needs {self.count} cool enough {_gpus(self.count)}"

    def nearness(self) -> float:
        return self.cool


@dataclass(frozen=True, slots=True)
class GpuAtSlowdown(_TooHot):
    """The hottest GPU is at (or within the policy's margin of) its slowdown threshold (``thermalHardLimits``)."""

    temperature_celsius: float
    slowdown_celsius: float
    margin_celsius: float = 0.0
    """``filters.slowdownMarginCelsius``."""

    def cause(self) -> str:
        t, s = celsius(self.temperature_celsius), celsius(self.slowdown_celsius)
        if self.margin_celsius > 0:
            return f"gpu {self.gpu} is at {t}, within {self.margin_celsius:g} °C of its slowdown threshold {s}"
        return f"gpu {self.gpu} is at {t}, at or above its slowdown threshold {s}"


@dataclass(frozen=True, slots=True)
class GpuThrottling(_TooHot):
    """The GPU is thermally throttling (``throttleHardLimit``)."""

    throttle_reasons: tuple[str, ...]
    """The thermal throttle reasons set (NVML names, lower case)."""

    def cause(self) -> str:
        return f"gpu {self.gpu} is thermally throttling ({', '.join(self.throttle_reasons)})"


@dataclass(frozen=True, slots=True)
class GpuAboveMaxTemperature(_TooHot):
    """The GPU is warmer than the pod's ``kelvin.dev/max-temperature``."""

    temperature_celsius: float
    max_temperature_celsius: float

    def cause(self) -> str:
        return (
            f"gpu {self.gpu} is at {celsius(self.temperature_celsius)}, above the pod's {ann.MAX_TEMPERATURE} of "
            f"{celsius(self.max_temperature_celsius)}"
        )

    def need(self) -> str:
        return f"the pod needs {self.count} {_gpus(self.count)} at most {celsius(self.max_temperature_celsius)}"


@dataclass(frozen=True, slots=True)
class NoNvlinkGroup(Rejection):
    """No ``count`` of the node's usable GPUs are all linked by NVLink (``kelvin.dev/topology: nvlink-required``)."""

    kind: ClassVar[RejectionKind] = RejectionKind.TOPOLOGY
    unresolvable: ClassVar[bool] = True
    count: int
    usable: int

    def words(self) -> str:
        return f"no {self.count} of the node's {self.usable} usable GPUs are all linked by NVLink; {self.need()}"

    def need(self) -> str:
        return _NVLINK_REQUIRED


# -- fit: the GPUs' current use stands in the way (resolvable: preemption may help) ---------------------------------


@dataclass(frozen=True, slots=True)
class GpuMemoryFull(Rejection):
    """No usable GPU has the pod's memory pool free (the roomiest one is named)."""

    kind: ClassVar[RejectionKind] = RejectionKind.GPU_MEMORY
    gpu: int
    free_gib: float
    """The roomiest GPU's free memory, rounded down to 0.1 GiB (as worded)."""
    memory_bytes: int

    def words(self) -> str:
        return f"gpu {self.gpu} has {self.free_gib:.1f} GiB free; {self.need()}"

    def need(self) -> str:
        return f"the pod needs {_gib(self.memory_bytes)} on one GPU"

    def nearness(self) -> float:
        return self.free_gib


@dataclass(frozen=True, slots=True)
class GpuComputeFull(Rejection):
    """No usable GPU has the pod's share of compute free (the roomiest one is named). Counted as ``gpu_memory``:
    both are a share of one GPU that does not fit."""

    kind: ClassVar[RejectionKind] = RejectionKind.GPU_MEMORY
    gpu: int
    free_milli: int
    need_milli: int

    def words(self) -> str:
        return f"gpu {self.gpu} has {self.free_milli / 10:g}% of its capacity free; {self.need()}"

    def need(self) -> str:
        return f"the pod needs {self.need_milli / 10:g}% of one GPU"

    def nearness(self) -> float:
        return self.free_milli


@dataclass(frozen=True, slots=True)
class GpusInUse(Rejection):
    """Fewer usable GPUs are free than the pod needs whole."""

    kind: ClassVar[RejectionKind] = RejectionKind.GPU_COUNT
    free: int
    usable: int
    count: int

    def words(self) -> str:
        return f"{self.free} of {self.usable} usable GPUs are free; {self.need()}"

    def need(self) -> str:
        return f"the pod needs {self.count} whole {_gpus(self.count)}"

    def nearness(self) -> float:
        return self.free


@dataclass(frozen=True, slots=True)
class NvlinkGroupInUse(Rejection):
    """Enough GPUs are free, but no ``count`` of them are all linked by NVLink."""

    kind: ClassVar[RejectionKind] = RejectionKind.TOPOLOGY
    free: int
    count: int

    def words(self) -> str:
        return f"{self.free} GPUs are free but no {self.count} of them are all linked by NVLink; {self.need()}"

    def need(self) -> str:
        return _NVLINK_REQUIRED

    def nearness(self) -> float:
        return self.free


@dataclass(frozen=True, slots=True)
class Fits(Rejection):
    """Not a rejection: the fit filter's verdict for a row that passes (its ``explain`` of any row). Never counted
    (only rejected rows are); were it, as ``gpu_count``."""

    kind: ClassVar[RejectionKind] = RejectionKind.GPU_COUNT

    def words(self) -> str:
        return "the pod fits this node"


# -- telemetry ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NoTelemetry(Rejection):
    """No telemetry from the node yet (``onStale: deny``)."""

    kind: ClassVar[RejectionKind] = RejectionKind.STALE_TELEMETRY
    unresolvable: ClassVar[bool] = True
    max_age_s: float

    def words(self) -> str:
        return f"no telemetry from this node yet (limit {self.max_age_s:g} s)"


@dataclass(frozen=True, slots=True)
class StaleTelemetry(Rejection):
    """The node's telemetry is older than ``telemetry.maxAgeSeconds`` (``onStale: deny``). Filter reasons leave the
    age out (``None``): kube-scheduler groups nodes by reason text, and one outage must read as one reason, not one
    per second of age; explain names it."""

    kind: ClassVar[RejectionKind] = RejectionKind.STALE_TELEMETRY
    unresolvable: ClassVar[bool] = True
    max_age_s: float
    age_s: int | None = None

    def words(self) -> str:
        age = "" if self.age_s is None else f"{self.age_s} s old, "
        return f"stale telemetry ({age}older than {self.max_age_s:g} s: telemetry.maxAgeSeconds)"


# -- hotness: the operator is about to drain the node -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _NodeHot(Rejection):
    kind: ClassVar[RejectionKind] = RejectionKind.THERMAL
    unresolvable: ClassVar[bool] = True
    gpu: int
    """The node's first hot GPU."""
    others: int
    """How many more of its GPUs meet the rule."""

    def words(self) -> str:
        more = f" (and {self.others} more)" if self.others else ""
        return f"{self.cause()}{more}; {_DRAINED}"

    def cause(self) -> str:
        raise NotImplementedError

    def need(self) -> str:
        return _DRAINED


@dataclass(frozen=True, slots=True)
class NodeHot(_NodeHot):
    """A GPU is at or above ``hotness.hot_celsius``."""

    temperature_celsius: float
    hot_celsius: float

    def cause(self) -> str:
        return (
            f"gpu {self.gpu} is at {self.temperature_celsius:.0f} °C, at or above the hot threshold "
            f"{self.hot_celsius:g} °C"
        )


@dataclass(frozen=True, slots=True)
class NodeThrottling(_NodeHot):
    """A GPU is thermally throttling (``hotness.throttling_is_hot``)."""

    def cause(self) -> str:
        return f"gpu {self.gpu} is thermally throttling"


@dataclass(frozen=True, slots=True)
class NodeWarming(_NodeHot):
    """A GPU rises fast enough to reach its slowdown threshold within ``hotness.horizon_s``."""

    temperature_celsius: float
    trend_c_per_min: float
    horizon_s: float

    def cause(self) -> str:
        return (
            f"gpu {self.gpu} is at {self.temperature_celsius:.0f} °C and rising {self.trend_c_per_min:.1f} °C/min: "
            f"it reaches its slowdown threshold within {self.horizon_s:g} s"
        )


# -- kube-scheduler's own NodeResourcesFit (the simulator) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InsufficientResource(Rejection):
    """The node has less of ``resource`` free than the pod requests (kube-scheduler's ``InsufficientResource``)."""

    kind: ClassVar[RejectionKind] = RejectionKind.NODE_RESOURCES
    resource: str
    """``cpu`` (millicores) or ``memory`` (bytes)."""
    free: int
    requested: int

    def words(self) -> str:
        if self.resource == "cpu":
            return f"Insufficient cpu: {self.free}m free, the pod requests {self.requested}m"
        return (
            f"Insufficient {self.resource}: {self.free / GIB:.1f} GiB free, the pod requests "
            f"{self.requested / GIB:.1f} GiB"
        )

    def nearness(self) -> float:
        return self.free


# -- the priority policy's reserve ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReservedForPriority(Rejection):
    """The pod is below ``protectFrom`` and every choice of its GPUs here breaks a free NVLink group, with the fleet's
    free groups at or below the reserve kept for higher priorities (``scoring.priority.args``)."""

    kind: ClassVar[RejectionKind] = RejectionKind.RESERVED
    priority: int
    protect_from: int
    breaks: float
    """GPUs' worth of free groups the pod would break here."""
    free: float
    """GPUs' worth of free groups in the fleet."""
    reserve: int

    def words(self) -> str:
        return (
            f"priority {self.priority} is below {self.protect_from} and the pod would break {self.breaks:.1f} GPUs' "
            f"worth of free NVLink groups here; the fleet keeps {self.reserve} for higher priorities "
            f"({self.free:.1f} free)"
        )

    def need(self) -> str:
        return f"a node where it breaks no free NVLink group kept for priority {self.protect_from} and above"

    def nearness(self) -> float:
        return -self.breaks
