"""Reads one node's GPUs through NVML into plain readings. The only exporter module that calls NVML on scrape.

``None`` in a reading means NVML said "not supported" (or the driver lacks the function): the series is left out.
Any other NVML error fails that GPU's reading (its series are absent and ``nvml_up`` is 0 for that scrape); NVML is
initialised again on the next read, so the exporter recovers when the driver comes back.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from ..nvml.backend import NvmlApi
from .cgroups import PodDirectory, pod_uid_for_pid

log = logging.getLogger(__name__)
T = TypeVar("T")

_ABSENT = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)


@dataclass(frozen=True, slots=True)
class LinkReading:
    link: int
    up: bool
    peer: str
    """The local GPU index the link reaches, ``nvswitch``, or ``unknown``."""


@dataclass(frozen=True, slots=True)
class ProcessReading:
    pid: int
    used_bytes: int | None
    pod_uid: str | None = None
    namespace: str | None = None
    pod: str | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    uuid: str
    model: str
    pci_bus_id: str
    numa_node: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    slowdown_celsius: float | None = None
    shutdown_celsius: float | None = None
    clocks_event_reasons: int | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    utilization_percent: float | None = None
    memory_utilization_percent: float | None = None
    power_watts: float | None = None
    energy_joules: float | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    pcie_replays: int | None = None
    links: tuple[LinkReading, ...] = ()
    topology: dict[int, int] = field(default_factory=dict)
    """Peer GPU index -> NVML topology level (``NVML_TOPOLOGY_*``)."""
    mig_enabled: bool | None = None
    mig_devices: int | None = None
    processes: tuple[ProcessReading, ...] | None = None


@dataclass(frozen=True, slots=True)
class NodeReading:
    node: str
    nvml_up: bool
    taken_at: float
    duration_s: float
    driver_version: str | None = None
    gpus: tuple[GpuReading, ...] = ()
    errors: tuple[str, ...] = ()
    xid_counts: dict[tuple[int, int], int] = field(default_factory=dict)
    """(GPU index, XID code) -> events since the exporter started."""


@dataclass(slots=True)
class _Static:
    """What does not change while NVML stays initialised: identity, thresholds, links, topology."""

    index: int
    handle: Any
    uuid: str
    model: str
    pci_bus_id: str
    numa_node: int | None
    slowdown: float | None
    shutdown: float | None
    sm_clock_max: float | None
    link_peers: dict[int, str]
    topology: dict[int, int]


def _optional(fn: Callable[..., T], *args: Any) -> T | None:
    try:
        return fn(*args)
    except _ABSENT:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlReader:
    """Initialises NVML lazily, reads every GPU on :meth:`read`, and starts over after a failure."""

    def __init__(
        self,
        nvml: NvmlApi,
        node: str,
        *,
        proc_root: Path = Path("/proc"),
        pods: PodDirectory | None = None,
        xid_counts: Callable[[], dict[tuple[int, int], int]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nvml = nvml
        self.node = node
        self._proc_root = proc_root
        self._pods = pods or PodDirectory(None)
        self._xid_counts = xid_counts or dict
        self._clock = clock
        self._lock = threading.Lock()
        self._static: list[_Static] | None = None
        self._init_errors: list[str] = []
        self._driver_version: str | None = None

    def close(self) -> None:
        with self._lock:
            self._release()

    def read(self) -> NodeReading:
        started = time.perf_counter()
        with self._lock:
            taken_at = self._clock()
            try:
                statics = self._ensure_init()
            except pynvml.NVMLError as exc:
                log.error("NVML initialisation failed: %s", exc)
                self._release()
                return NodeReading(self.node, False, taken_at, time.perf_counter() - started, errors=(str(exc),))
            gpus: list[GpuReading] = []
            errors: list[str] = list(self._init_errors)
            for static in statics:
                try:
                    gpus.append(self._read_gpu(static))
                except pynvml.NVMLError as exc:
                    errors.append(f"gpu {static.index}: {exc}")
            if errors:
                log.error("NVML collection failed: %s", "; ".join(errors))
                self._release()  # initialise again next time: handles may be stale after a driver reload
            return NodeReading(
                node=self.node,
                nvml_up=not errors,
                taken_at=taken_at,
                duration_s=time.perf_counter() - started,
                driver_version=self._driver_version,
                gpus=tuple(gpus),
                errors=tuple(errors),
                xid_counts=self._xid_counts(),
            )

    # ------------------------------------------------------------------------------------------------ lifecycle
    def _release(self) -> None:
        if self._static is not None:
            self._static = None
            with contextlib.suppress(pynvml.NVMLError):
                self._nvml.nvmlShutdown()

    def _ensure_init(self) -> list[_Static]:
        if self._static is not None:
            return self._static
        nvml = self._nvml
        nvml.nvmlInit()
        try:
            self._driver_version = _text(nvml.nvmlSystemGetDriverVersion())
            statics: list[_Static] = []
            self._init_errors = []
            for index in range(nvml.nvmlDeviceGetCount()):
                try:
                    statics.append(self._discover(index, nvml.nvmlDeviceGetHandleByIndex(index)))
                except pynvml.NVMLError as exc:  # one GPU off the bus must not hide the others
                    self._init_errors.append(f"gpu {index}: {exc}")
            bus_to_index = {s.pci_bus_id.upper(): s.index for s in statics}
            for static in statics:
                static.link_peers = self._discover_links(static.handle, bus_to_index)
                for other in statics:
                    if other.index != static.index:
                        level = _optional(nvml.nvmlDeviceGetTopologyCommonAncestor, static.handle, other.handle)
                        if level is not None:
                            static.topology[other.index] = int(level)
        except pynvml.NVMLError:
            with contextlib.suppress(pynvml.NVMLError):
                nvml.nvmlShutdown()
            raise
        self._static = statics
        log.info("NVML initialised: driver %s, %d GPUs", self._driver_version, len(statics))
        return statics

    def _discover(self, index: int, handle: Any) -> _Static:
        nvml = self._nvml
        pci = nvml.nvmlDeviceGetPciInfo(handle)
        slowdown = _optional(nvml.nvmlDeviceGetTemperatureThreshold, handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        shutdown = _optional(nvml.nvmlDeviceGetTemperatureThreshold, handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
        max_clock = _optional(nvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM)
        return _Static(
            index=index,
            handle=handle,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            model=_text(nvml.nvmlDeviceGetName(handle)),
            pci_bus_id=_text(pci.busId),
            numa_node=_optional(nvml.nvmlDeviceGetNumaNodeId, handle),
            slowdown=None if slowdown is None else float(slowdown),
            shutdown=None if shutdown is None else float(shutdown),
            sm_clock_max=None if max_clock is None else float(max_clock),
            link_peers={},
            topology={},
        )

    def _discover_links(self, handle: Any, bus_to_index: dict[str, int]) -> dict[int, str]:
        nvml = self._nvml
        peers: dict[int, str] = {}
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                nvml.nvmlDeviceGetNvLinkState(handle, link)
            except (*_ABSENT, pynvml.NVMLError_InvalidArgument):
                break  # no NVLink on this board, or past its last link
            remote = _optional(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            kind = _optional(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
            bus = _text(remote.busId).upper() if remote is not None else ""
            if bus in bus_to_index:
                peers[link] = str(bus_to_index[bus])
            elif kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                peers[link] = "nvswitch"
            else:
                peers[link] = "unknown"
        return peers

    # ------------------------------------------------------------------------------------------------- per scrape
    def _read_gpu(self, s: _Static) -> GpuReading:
        nvml = self._nvml
        h = s.handle
        memory = nvml.nvmlDeviceGetMemoryInfo(h)
        temperature = _optional(nvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
        util = _optional(nvml.nvmlDeviceGetUtilizationRates, h)
        power_mw = _optional(nvml.nvmlDeviceGetPowerUsage, h)
        energy_mj = _optional(nvml.nvmlDeviceGetTotalEnergyConsumption, h)
        clock = _optional(nvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
        mig = _optional(nvml.nvmlDeviceGetMigMode, h)
        mig_enabled = None if mig is None else mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        links = tuple(
            LinkReading(link, nvml.nvmlDeviceGetNvLinkState(h, link) == pynvml.NVML_FEATURE_ENABLED, peer)
            for link, peer in s.link_peers.items()
        )
        return GpuReading(
            index=s.index,
            uuid=s.uuid,
            model=s.model,
            pci_bus_id=s.pci_bus_id,
            numa_node=s.numa_node,
            memory_total_bytes=int(memory.total),
            memory_used_bytes=int(memory.used),
            memory_free_bytes=int(memory.free),
            temperature_celsius=None if temperature is None else float(temperature),
            memory_temperature_celsius=self._memory_temperature(h),
            slowdown_celsius=s.slowdown,
            shutdown_celsius=s.shutdown,
            clocks_event_reasons=_optional(nvml.nvmlDeviceGetCurrentClocksEventReasons, h),
            sm_clock_mhz=None if clock is None else float(clock),
            sm_clock_max_mhz=s.sm_clock_max,
            utilization_percent=None if util is None else float(util.gpu),
            memory_utilization_percent=None if util is None else float(util.memory),
            power_watts=None if power_mw is None else power_mw / 1000.0,
            energy_joules=None if energy_mj is None else energy_mj / 1000.0,
            ecc_corrected=_optional(
                nvml.nvmlDeviceGetTotalEccErrors, h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC
            ),
            ecc_uncorrected=_optional(
                nvml.nvmlDeviceGetTotalEccErrors, h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            ),
            pcie_replays=_optional(nvml.nvmlDeviceGetPcieReplayCounter, h),
            links=links,
            topology=s.topology,
            mig_enabled=mig_enabled,
            mig_devices=self._mig_devices(h) if mig_enabled else (0 if mig_enabled is False else None),
            processes=self._processes(h),
        )

    def _memory_temperature(self, handle: Any) -> float | None:
        values = _optional(self._nvml.nvmlDeviceGetFieldValues, handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
        if values is None or values[0].nvmlReturn != pynvml.NVML_SUCCESS:
            return None
        value = values[0]
        if value.valueType == pynvml.NVML_VALUE_TYPE_DOUBLE:
            return float(value.value.dVal)
        if value.valueType in (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG):
            return float(value.value.ullVal)
        return float(value.value.uiVal)

    def _mig_devices(self, handle: Any) -> int | None:
        nvml = self._nvml
        count = _optional(nvml.nvmlDeviceGetMaxMigDeviceCount, handle)
        if count is None:
            return None
        found = 0
        for i in range(count):
            try:
                nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
                continue
            found += 1
        return found

    def _processes(self, handle: Any) -> tuple[ProcessReading, ...] | None:
        procs = _optional(self._nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        if procs is None:
            return None
        out: list[ProcessReading] = []
        for p in procs:
            pid = int(p.pid)
            used = p.usedGpuMemory
            uid = pod_uid_for_pid(self._proc_root, pid)
            names = self._pods.lookup(uid) if uid else None
            out.append(
                ProcessReading(
                    pid=pid,
                    used_bytes=None if used is None else int(used),
                    pod_uid=uid,
                    namespace=names[0] if names else None,
                    pod=names[1] if names else None,
                )
            )
        return tuple(out)
