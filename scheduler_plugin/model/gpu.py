"""The GPU node model: plain, immutable data shared by the extender, exporter, operator and simulator.

Everything a policy may look at is here. Sources (simulated, Prometheus, scrape, exporter) build these objects;
policies never see where they came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntFlag

from pydantic import ConfigDict

from .eviction import EvictionFacts

GIB = 2**30
MIB = 2**20
MILLI_PER_GPU = 1000


class ThrottleReason(IntFlag):
    """NVML clocks-event (throttle) reason bits, as ``nvmlDeviceGetCurrentClocksEventReasons`` returns them."""

    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80
    DISPLAY_CLOCK_SETTING = 0x100


#: Reasons that mean "the GPU is slowed because it is too hot".
THERMAL_THROTTLE_MASK = int(ThrottleReason.SW_THERMAL_SLOWDOWN | ThrottleReason.HW_THERMAL_SLOWDOWN)
#: Reasons that slow the clocks for any reason other than idling or an operator's clock setting.
SLOWDOWN_MASK = int(
    ThrottleReason.SW_POWER_CAP
    | ThrottleReason.HW_SLOWDOWN
    | ThrottleReason.SW_THERMAL_SLOWDOWN
    | ThrottleReason.HW_THERMAL_SLOWDOWN
    | ThrottleReason.HW_POWER_BRAKE_SLOWDOWN
)


def throttle_reason_names(mask: int) -> list[str]:
    """Readable names of the bits set in ``mask`` (unknown bits are reported as hex)."""
    names = [r.name.lower() for r in ThrottleReason if mask & r.value and r.name]
    unknown = mask & ~sum(r.value for r in ThrottleReason)
    if unknown:
        names.append(hex(unknown))
    return names


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process holding GPU memory, attributed to a pod where the exporter could (``pod_uid``)."""

    pid: int
    used_bytes: int
    pod_uid: str | None = None
    pod_namespace: str | None = None
    pod_name: str | None = None
    sm_utilization: float | None = None
    """This process' share of the GPU's SM time, 0..1 (NVML process utilisation); ``None`` when unknown."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU as telemetry last saw it."""

    # JSON (model/serde.py, the exporter's /v1/node) writes NaN as NaN, not null: an unknown temperature stays
    # unknown on the way from the exporter to the extender instead of failing validation or becoming 0 °C.
    __pydantic_config__ = ConfigDict(ser_json_inf_nan="constants")

    index: int
    uuid: str
    model: str
    memory_total_bytes: int
    memory_used_bytes: int = 0
    temperature_celsius: float = 40.0
    """NaN when the source has no reading: policies treat it as no thermal headroom (never as a cool GPU)."""
    memory_temperature_celsius: float | None = None
    slowdown_celsius: float = 90.0
    shutdown_celsius: float = 95.0
    throttle_reasons: int = 0
    sm_clock_mhz: float = 0.0
    sm_clock_max_mhz: float = 0.0
    utilization: float = 0.0
    """GPU (SM) utilisation, 0..1."""
    memory_utilization: float = 0.0
    """Memory-controller utilisation, 0..1."""
    power_watts: float | None = None
    xid_errors: int = 0
    """XID errors seen recently (sources decide the window; the exporter counts since start)."""
    numa_node: int = 0
    pcie_switch: str = ""
    """An identifier of the PCIe switch (or root port) the GPU hangs off; GPUs that share it talk without the CPU."""
    nvlink_peers: frozenset[int] = frozenset()
    """Indices of the GPUs of the same node this GPU reaches over NVLink."""
    temperature_trend_c_per_min: float = 0.0
    """Rate of change of the temperature, derived by the telemetry cache from history."""
    processes: tuple[GpuProcess, ...] = ()
    thermal_resistance_c_per_w: float | None = None
    """Cooling quality: how many degrees Celsius this GPU settles above its idle temperature per watt of added power
    (higher is worse cooling). Reported by a source that knows it; otherwise the snapshot cache estimates it from
    history (:mod:`scheduler_plugin.telemetry.cooling`). ``None`` when unknown."""

    @property
    def memory_free_bytes(self) -> int:
        return max(0, self.memory_total_bytes - self.memory_used_bytes)

    @property
    def thermally_throttled(self) -> bool:
        return bool(self.throttle_reasons & THERMAL_THROTTLE_MASK)

    @property
    def clock_ratio(self) -> float:
        """SM clock as a share of its max (1.0 when unknown)."""
        if self.sm_clock_max_mhz <= 0:
            return 1.0
        return min(1.0, self.sm_clock_mhz / self.sm_clock_max_mhz)


@dataclass(frozen=True, slots=True)
class GpuAssignment:
    """kelvin's own record of a GPU share it assigned to a pod (from the pod's annotations or the ledger)."""

    pod_key: str
    """``namespace/name``."""
    gpu_indices: tuple[int, ...]
    milli: int | None = MILLI_PER_GPU
    """Compute share of each GPU the pod asked for, in thousandths (1000 for whole GPUs); ``None`` for a memory pool
    without a compute share. Not the charge: that depends on the GPU (:func:`.claim.charged_milli`)."""
    memory_bytes: int | None = None
    """Memory pool per GPU for a shared GPU; ``None`` for whole GPUs."""
    pod_uid: str | None = None
    priority: int = 0
    eviction: EvictionFacts | None = field(default=None, compare=False)
    """What preemption weighs when it considers evicting the pod (``kelvin.dev/evictable``, its gang, when it
    started and last checkpointed); read from the pod by the listing of assignments, ``None`` when unknown (a bind
    in the ledger that the listing has not shown yet)."""
    gang_plan: bool = field(default=False, compare=False)
    """A gang member's plan not bound yet (``kelvin.dev/gang-planned-*``, from the listing): capacity the operator's
    gang planner holds for it, not a pod on the GPUs (docs/jobs.md)."""


@dataclass(frozen=True, slots=True)
class GpuNode:
    """A Kubernetes node and its GPUs."""

    name: str
    gpus: tuple[GpuInfo, ...]
    cpu_allocatable_milli: int = 0
    memory_allocatable_bytes: int = 0
    cpu_requested_milli: int = 0
    memory_requested_bytes: int = 0
    assignments: tuple[GpuAssignment, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    mps_enabled: bool = False
    observed_at: float | None = None
    """Unix time of the telemetry this node was built from; ``None`` when never seen."""

    @property
    def cpu_free_milli(self) -> int:
        return max(0, self.cpu_allocatable_milli - self.cpu_requested_milli)

    @property
    def memory_free_bytes(self) -> int:
        return max(0, self.memory_allocatable_bytes - self.memory_requested_bytes)

    def gpu(self, index: int) -> GpuInfo:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(f"node {self.name} has no gpu {index}")

    def age_seconds(self, now: float) -> float | None:
        return None if self.observed_at is None else max(0.0, now - self.observed_at)
