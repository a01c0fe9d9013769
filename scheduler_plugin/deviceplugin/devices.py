"""The node's GPUs as the device plugin advertises them: one device per whole GPU, N slots per shared GPU.

Whole GPUs (``nvidia.com/gpu``) use the GPU's UUID as the device ID, as NVIDIA's plugin does; a shared GPU
(``kelvin.dev/shared-gpu``) is advertised as ``slots`` devices ``<uuid>::<slot>`` (the form NVIDIA's time-slicing
replicas use). GPUs in MIG mode are skipped with a log line: their memory is partitioned by the driver already.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pynvml

from ..model import annotations as ann
from ..nvml.backend import NvmlApi

log = logging.getLogger(__name__)

WHOLE_RESOURCE = ann.GPU_RESOURCE
SHARED_RESOURCE = ann.SHARED_GPU_RESOURCE
RESOURCES = (WHOLE_RESOURCE, SHARED_RESOURCE)
SLOT_SEPARATOR = "::"
MAX_DEVICE_ID = 63  # the kubelet's limit on a device ID


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU the plugin serves: its NVML index (what ``kelvin.dev/gpu-assigned`` names) and UUID."""

    index: int
    uuid: str
    numa_node: int | None = None


def discover(nvml: NvmlApi) -> list[Gpu]:
    """The GPUs NVML sees, less those in MIG mode and those it cannot read. NVML must be initialised; an NVML that
    cannot count its GPUs raises ``NVMLError``."""
    gpus: list[Gpu] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
        except pynvml.NVMLError as exc:
            log.warning("GPU %d cannot be read (%s): not served until the plugin restarts", index, exc)
            continue
        if _mig_enabled(nvml, handle):
            log.warning("GPU %d (%s) is in MIG mode: not served by kelvin's device plugin", index, uuid)
            continue
        numa: int | None
        try:
            numa = int(nvml.nvmlDeviceGetNumaNodeId(handle))
        except pynvml.NVMLError:
            numa = None
        gpus.append(Gpu(index=index, uuid=uuid, numa_node=numa if numa is not None and numa >= 0 else None))
    return gpus


def _mig_enabled(nvml: NvmlApi, handle: object) -> bool:
    try:
        current = nvml.nvmlDeviceGetMigMode(handle)[0]
    except pynvml.NVMLError:  # NotSupported: no MIG on this board
        return False
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)


def slot_id(uuid: str, slot: int) -> str:
    return f"{uuid}{SLOT_SEPARATOR}{slot}"


def gpu_uuid_of(device_id: str) -> str:
    """The GPU UUID of a whole-GPU or slot device ID."""
    return device_id.split(SLOT_SEPARATOR, 1)[0]


def device_ids(resource: str, gpus: Iterable[Gpu], slots: int) -> list[tuple[str, Gpu]]:
    """(device ID, GPU) for every device of ``resource``, in GPU order."""
    out: list[tuple[str, Gpu]] = []
    for gpu in gpus:
        if resource == WHOLE_RESOURCE:
            out.append((gpu.uuid, gpu))
        else:
            out.extend((slot_id(gpu.uuid, s), gpu) for s in range(slots))
    for device, _ in out:
        if len(device) > MAX_DEVICE_ID:
            raise ValueError(f"device ID {device!r} is longer than the kubelet's {MAX_DEVICE_ID} characters")
    return out


def by_uuid(gpus: Sequence[Gpu]) -> dict[str, Gpu]:
    return {g.uuid: g for g in gpus}
