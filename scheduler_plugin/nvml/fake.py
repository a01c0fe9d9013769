"""A fake NVML: simulated GPUs behind the same function names, return types and errors as ``pynvml``.

The collector talks to NVML through :class:`~scheduler_plugin.nvml.backend.NvmlApi`; the real implementation is
the ``pynvml`` module itself, this is the other one. It returns pynvml's own ctypes structures (``c_nvmlMemory_t``,
``c_nvmlUtilization_t``, ``nvmlPciInfo_t``, ``c_nvmlFieldValue_t`` arrays, ``c_nvmlEventData_t``), device handles of
pynvml's handle type, and raises ``pynvml.NVMLError(code)``, which pynvml maps to its subclasses
(``NVMLError_NotSupported``, ``NVMLError_GpuIsLost``...). So code tested against this fake handles the real API.

Faults can be injected: an error on chosen calls (:meth:`FakeNvml.set_error`), a GPU lost (:meth:`lose_gpu`), the
driver gone (:meth:`driver_down`, which also makes ``nvmlInit`` fail), XID events (:meth:`inject_xid`).

NVLink: a board with NVSwitch (H100/H200/A100 SXM) has every link to the switches (one NVLink fabric of all GPUs);
``nvlink_islands=N`` instead splits the GPUs into ``N`` equal islands whose GPUs are linked directly to each other
and to no GPU of another island (two 4-GPU islands: the boards of nodes with two NVLink groups), for tests of
NVLink-group placement.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from ..model import GIB, ThrottleReason
from ..model.catalogue import GpuModelSpec, UnknownModelError, resolve

_HANDLE_BASE = 0x6B000
_EVENTSET_BASE = 0x6E000


@dataclass
class FakeProcess:
    """A process holding GPU memory; ``pod_uid``/``namespace``/``pod`` say which pod :func:`write_proc` puts it in."""

    pid: int
    used_bytes: int
    pod_uid: str | None = None
    namespace: str = "default"
    pod: str = ""


@dataclass
class FakeGpu:
    """The mutable state of one simulated GPU. Tests change the fields; the fake reports them."""

    index: int
    spec: GpuModelSpec
    uuid: str
    bus_id: str
    numa_node: int
    memory_used_bytes: int = 512 * 2**20
    """Memory in use besides the processes' (driver, contexts)."""
    temperature_celsius: int = 38
    memory_temperature_celsius: int | None = 52
    throttle_reasons: int = int(ThrottleReason.GPU_IDLE)
    sm_clock_mhz: int = 345
    utilization_percent: int = 0
    memory_utilization_percent: int = 0
    power_milliwatts: int = 72_000
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    pcie_replays: int = 0
    mig_enabled: bool = False
    mig_devices: int = 0
    nvlink_links: int = 0
    nvlink_down: set[int] = field(default_factory=set)
    nvlink_peers: tuple[int, ...] = ()
    """GPUs this one links to directly (``nvlink_islands``), link ``l`` to ``nvlink_peers[l % len]``; empty: every
    link goes to an NVSwitch."""
    processes: list[FakeProcess] = field(default_factory=list)
    energy_base_mj: int = 0


@dataclass
class _Fault:
    code: int
    gpu: int | None


class FakeNvml:
    """Simulated GPUs with the ``pynvml`` module's API (the functions the exporter uses).

    ``vary=True`` makes load, temperature and power follow a slow wave (for demos); tests keep it off and set the
    :class:`FakeGpu` fields themselves.
    """

    def __init__(
        self,
        gpus: int = 8,
        model: str = "H100-SXM-80GB",
        *,
        seed: int = 0,
        vary: bool = False,
        driver_version: str = "550.90.07",
        clock: Callable[[], float] = time.time,
        nvlink_islands: int = 1,
    ) -> None:
        try:
            self.spec = resolve(model)
        except UnknownModelError as exc:
            raise ValueError(f"fake model: {exc}") from None
        if not 1 <= gpus <= 16:
            raise ValueError(f"fake gpus must be 1..16, got {gpus}")
        islands = island_members(gpus, nvlink_islands, self.spec.nvswitch, model)
        self.driver_version = driver_version
        self.vary = vary
        self._clock = clock
        self._started = clock()
        self._lock = threading.Condition()
        self._initialised = 0
        self._driver_up = True
        self._lost: set[int] = set()
        self._faults: dict[str, list[_Fault]] = {}
        self._events: deque[tuple[int, int]] = deque()
        self._event_sets: dict[int, set[int]] = {}
        self._next_event_set = 0
        links = self.spec.nvlink_links if self.spec.nvswitch else 0
        self.gpus: list[FakeGpu] = []
        for i in range(gpus):
            bus = 0x18 + 0x11 * i
            self.gpus.append(
                FakeGpu(
                    index=i,
                    spec=self.spec,
                    uuid=f"GPU-{seed:08x}-{i:04x}-4{i:03x}-8000-{(seed * 16 + i):012x}",
                    bus_id=f"00000000:{bus:02X}:00.0",
                    numa_node=0 if i < max(1, gpus // 2) else 1,
                    nvlink_links=links,
                    nvlink_peers=() if islands is None else tuple(p for p in islands[i] if p != i),
                    energy_base_mj=(seed + 1) * 10_000_000 + i * 1_000_000,
                )
            )
        self.seed = seed
        busy = range(max(1, gpus - 2))  # the last two GPUs of a node idle, the others run a training pod each
        for i in busy:
            self.set_busy(i, self.training_process(i))

    def training_process(self, index: int) -> FakeProcess:
        """The training pod's process the constructor puts on GPU ``index`` (pid, memory and pod from the seed)."""
        seed = self.seed
        return FakeProcess(
            pid=210_000 + 1000 * seed + 7 * index,
            used_bytes=(16 + 8 * (index % 4)) * GIB,
            pod_uid=f"{seed:08x}-7e1f-4a{index:02x}-9b3c-{index:012x}",
            namespace="ml-team",
            pod=f"train-{seed}-{index}",
        )

    def set_busy(self, index: int, process: FakeProcess) -> None:
        """GPU ``index`` runs ``process`` at a typical training load (85 % SM, 62 °C, 520 W, full clocks)."""
        set_busy(self.gpus[index], process)

    # ----------------------------------------------------------------------------------------------- fault injection
    def set_error(self, function: str, code: int, gpu: int | None = None) -> None:
        """Make ``function`` (a pynvml name such as ``nvmlDeviceGetPowerUsage``) raise ``NVMLError(code)``."""
        if not hasattr(self, function):
            raise ValueError(f"FakeNvml has no function {function!r}")
        self._faults.setdefault(function, []).append(_Fault(code, gpu))

    def clear_errors(self) -> None:
        self._faults.clear()

    def lose_gpu(self, index: int) -> None:
        """Every call on GPU ``index`` raises ``NVMLError_GpuIsLost`` (it fell off the bus)."""
        self._lost.add(index)

    def restore_gpu(self, index: int) -> None:
        self._lost.discard(index)

    def driver_down(self) -> None:
        """The driver went away: every call raises, and ``nvmlInit`` fails with ``NVMLError_DriverNotLoaded``."""
        self._driver_up = False
        self._initialised = 0

    def driver_up(self) -> None:
        self._driver_up = True

    def inject_xid(self, index: int, xid: int) -> None:
        """An XID critical error on GPU ``index``, delivered to registered event sets."""
        with self._lock:
            self._events.append((index, xid))
            self._lock.notify_all()

    # ------------------------------------------------------------------------------------------------------ helpers
    def _check(self, function: str, gpu: int | None = None) -> None:
        if not self._driver_up:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        if self._initialised <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if gpu is not None and gpu in self._lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        for fault in self._faults.get(function, ()):
            if fault.gpu is None or fault.gpu == gpu:
                raise pynvml.NVMLError(fault.code)

    def _gpu(self, handle: Any, function: str) -> FakeGpu:
        address = ctypes.cast(handle, ctypes.c_void_p).value or 0
        index = address - _HANDLE_BASE
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._check(function, index)
        return self.gpus[index]

    def _wave(self, gpu: FakeGpu, period_s: float) -> float:
        """0..1, a slow per-GPU wave; 0 when ``vary`` is off."""
        if not self.vary:
            return 0.0
        t = self._clock() - self._started
        return 0.5 + 0.5 * math.sin(2 * math.pi * t / period_s + gpu.index * 0.9)

    @staticmethod
    def _handle(index: int) -> Any:
        return ctypes.cast(ctypes.c_void_p(_HANDLE_BASE + index), pynvml.c_nvmlDevice_t)

    # ------------------------------------------------------------------------------------------------ system calls
    def nvmlInit(self) -> None:
        if not self._driver_up:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        for fault in self._faults.get("nvmlInit", ()):
            raise pynvml.NVMLError(fault.code)
        self._initialised += 1

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self._initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._handle(index)

    # ------------------------------------------------------------------------------------------------ device calls
    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").spec.name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        return _pci(gpu.bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        total = gpu.spec.memory_total_bytes
        used = min(total, gpu.memory_used_bytes + sum(p.used_bytes for p in gpu.processes))
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature_celsius + round(30 * self._wave(gpu, 600))

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperatureThreshold")
        values = {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: gpu.spec.slowdown_celsius,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: gpu.spec.shutdown_celsius,
            pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: gpu.spec.memory_max_celsius,
            pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: gpu.spec.slowdown_celsius - 2,
        }
        value = values.get(threshold)
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(value)

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Sequence[int]) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        now_us = int(self._clock() * 1e6)
        for i, fid in enumerate(field_ids):
            values[i].fieldId = fid
            values[i].timestamp = now_us
            if fid == pynvml.NVML_FI_DEV_MEMORY_TEMP and gpu.memory_temperature_celsius is not None:
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = gpu.memory_temperature_celsius + round(20 * self._wave(gpu, 600))
                values[i].nvmlReturn = pynvml.NVML_SUCCESS
            else:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        if self.vary:
            return int(ThrottleReason.GPU_IDLE) if self._wave(gpu, 300) < 0.2 else 0
        return gpu.throttle_reasons

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetClockInfo")
        if clock_type != pynvml.NVML_CLOCK_SM:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if self.vary:
            return round(gpu.spec.sm_clock_max_mhz * (0.6 + 0.4 * self._wave(gpu, 300)))
        return gpu.sm_clock_mhz

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetMaxClockInfo")
        if clock_type != pynvml.NVML_CLOCK_SM:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(gpu.spec.sm_clock_max_mhz)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        wave = self._wave(gpu, 300)
        return pynvml.c_nvmlUtilization_t(
            gpu=min(100, gpu.utilization_percent + round(100 * wave)),
            memory=min(100, gpu.memory_utilization_percent + round(60 * wave)),
        )

    def _power_mw(self, gpu: FakeGpu) -> int:
        return min(int(gpu.spec.power_limit_watts * 1000), gpu.power_milliwatts + round(600_000 * self._wave(gpu, 300)))

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._power_mw(self._gpu(handle, "nvmlDeviceGetPowerUsage"))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption")
        elapsed = max(0.0, self._clock() - self._started)
        return gpu.energy_base_mj + round(self._power_mw(gpu) * elapsed)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return gpu.ecc_corrected
        return gpu.ecc_uncorrected

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replays

    def _link(self, handle: Any, link: int, function: str) -> FakeGpu:
        gpu = self._gpu(handle, function)
        if gpu.nvlink_links == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < gpu.nvlink_links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        gpu = self._link(handle, link, "nvmlDeviceGetNvLinkState")
        return int(pynvml.NVML_FEATURE_DISABLED if link in gpu.nvlink_down else pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        gpu = self._link(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType")
        return int(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU if gpu.nvlink_peers else pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any:
        gpu = self._link(handle, link, "nvmlDeviceGetNvLinkRemotePciInfo")
        if gpu.nvlink_peers:  # an island: the links spread evenly over the island's other GPUs
            return _pci(self.gpus[gpu.nvlink_peers[link % len(gpu.nvlink_peers)]].bus_id)
        # HGX baseboards: the links go to four NVSwitches, spread evenly
        return _pci(f"00000000:{0xA0 + link % 4:02X}:00.0")

    def nvmlDeviceGetTopologyCommonAncestor(self, handle1: Any, handle2: Any) -> int:
        a = self._gpu(handle1, "nvmlDeviceGetTopologyCommonAncestor")
        b = self._gpu(handle2, "nvmlDeviceGetTopologyCommonAncestor")
        if a.index == b.index:
            return int(pynvml.NVML_TOPOLOGY_INTERNAL)
        if a.index // 2 == b.index // 2:
            return int(pynvml.NVML_TOPOLOGY_MULTIPLE)  # the two GPUs of a PCIe switch pair (PXB)
        if a.numa_node == b.numa_node:
            return int(pynvml.NVML_TOPOLOGY_NODE)
        return int(pynvml.NVML_TOPOLOGY_SYSTEM)

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetNumaNodeId").numa_node

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetMigMode")
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not gpu.mig_enabled:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= index < gpu.mig_devices:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ctypes.cast(ctypes.c_void_p(_HANDLE_BASE + 0x100 * (gpu.index + 1) + index), pynvml.c_nvmlDevice_t)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [
            pynvml.nvmlStructToFriendlyObject(
                pynvml.c_nvmlProcessInfo_v3_t(
                    pid=p.pid,
                    usedGpuMemory=p.used_bytes,
                    gpuInstanceId=0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF,
                )
            )
            for p in gpu.processes
        ]

    # ------------------------------------------------------------------------------------------------------- events
    def nvmlEventSetCreate(self) -> Any:
        self._check("nvmlEventSetCreate")
        with self._lock:
            self._next_event_set += 1
            key = _EVENTSET_BASE + self._next_event_set
            self._event_sets[key] = set()
        return ctypes.cast(ctypes.c_void_p(key), pynvml.c_nvmlEventSet_t)

    def _event_set(self, event_set: Any) -> set[int]:
        key = ctypes.cast(event_set, ctypes.c_void_p).value or 0
        registered = self._event_sets.get(key)
        if registered is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return registered

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        if not event_types & pynvml.nvmlEventTypeXidCriticalError:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            self._event_set(event_set).add(gpu.index)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self._check("nvmlEventSetWait_v2")
        deadline = time.monotonic() + timeout_ms / 1000
        with self._lock:
            registered = self._event_set(event_set)
            while True:
                for item in list(self._events):
                    if item[0] in registered:
                        self._events.remove(item)
                        data = pynvml.c_nvmlEventData_t()
                        data.device = self._handle(item[0])
                        data.eventType = pynvml.nvmlEventTypeXidCriticalError
                        data.eventData = item[1]
                        data.gpuInstanceId = 0xFFFFFFFF
                        data.computeInstanceId = 0xFFFFFFFF
                        return data
                left = deadline - time.monotonic()
                if left <= 0 or not self._driver_up:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
                self._lock.wait(left)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        with self._lock:
            key = ctypes.cast(event_set, ctypes.c_void_p).value or 0
            self._event_sets.pop(key, None)


def island_members(gpus: int, islands: int, nvswitch: bool, model: str) -> list[tuple[int, ...]] | None:
    """GPU index -> the GPUs of its NVLink island (itself included), for ``islands`` equal islands of consecutive
    GPUs; None for one island (the NVSwitch fabric). ValueError naming the problem otherwise."""
    if islands < 1:
        raise ValueError(f"fake NVLink islands must be at least 1, got {islands}")
    if islands == 1:
        return None
    if not nvswitch:
        raise ValueError(f"fake model {model!r} has no NVLink: it cannot have {islands} NVLink islands")
    size, rest = divmod(gpus, islands)
    if rest or size < 2:
        raise ValueError(
            f"fake NVLink islands must split the {gpus} GPUs into equal islands of 2 or more, got {islands}"
        )
    return [tuple(range(i // size * size, (i // size + 1) * size)) for i in range(gpus)]


def set_busy(gpu: FakeGpu, process: FakeProcess) -> None:
    """``gpu`` runs ``process`` at a typical training load (85 % SM, 62 °C, 520 W, full clocks)."""
    gpu.processes.append(process)
    gpu.utilization_percent, gpu.memory_utilization_percent = 85, 40
    gpu.temperature_celsius, gpu.memory_temperature_celsius = 62, 70
    gpu.power_milliwatts = int(min(520.0, gpu.spec.power_limit_watts * 0.75) * 1000)
    gpu.sm_clock_mhz = int(gpu.spec.sm_clock_max_mhz * 0.89)
    gpu.throttle_reasons = 0


def write_proc(fake: FakeNvml, proc_root: Path, pods_dir: Path) -> None:
    """Write a ``/proc``-like tree and kubelet's ``/var/log/pods`` for the fake processes (cgroup v2, systemd driver).

    The exporter then attributes the fake processes to pods exactly as it does on a real node.
    """
    for gpu in fake.gpus:
        for p in gpu.processes:
            if p.pod_uid is None:
                continue
            pid_dir = proc_root / str(p.pid)
            pid_dir.mkdir(parents=True, exist_ok=True)
            slice_uid = p.pod_uid.replace("-", "_")
            (pid_dir / "cgroup").write_text(
                "0::/kubepods.slice/kubepods-burstable.slice/"
                f"kubepods-burstable-pod{slice_uid}.slice/cri-containerd-{p.pid:064x}.scope\n"
            )
            (pods_dir / f"{p.namespace}_{p.pod}_{p.pod_uid}").mkdir(parents=True, exist_ok=True)


def _pci(bus_id: str) -> Any:
    info = pynvml.nvmlPciInfo_t()
    info.busId = bus_id.encode()
    info.busIdLegacy = bus_id[4:].encode()
    domain, bus, device = bus_id.split(":")[0], bus_id.split(":")[1], bus_id.split(":")[2].split(".")[0]
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(device, 16)
    info.pciDeviceId = 0x233010DE
    return info
