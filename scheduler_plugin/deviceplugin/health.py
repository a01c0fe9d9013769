"""Device health from NVML: a GPU NVML can no longer read (lost, off the bus, driver gone) or one that raised a
critical XID is Unhealthy.

XIDs come from the exporter's :class:`~scheduler_plugin.nvml.events.XidWatcher` (NVML critical-error events).
As in NVIDIA's device plugin (``internal/rm/health.go``): every XID counts except those that report an application's
own fault rather than the GPU's (:data:`APPLICATION_XIDS`, NVIDIA's list); a GPU with a critical XID stays Unhealthy
until the plugin restarts; an XID NVML cannot attribute to a GPU (index -1) makes every GPU Unhealthy. A lost GPU (not
an XID) is Healthy again as soon as NVML reads it (with the same UUID at the same index).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pynvml

from ..nvml.backend import NvmlApi
from ..nvml.events import XidWatcher
from .devices import Gpu

log = logging.getLogger(__name__)

#: 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup,
#: 68 video processor exception, 109 context-switch timeout: a program's bug or its own kill, not a sick GPU.
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})


class Health:
    """:meth:`check` reads every served GPU once and returns the indices that are Unhealthy now (blocking: NVML)."""

    def __init__(
        self,
        nvml: NvmlApi,
        gpus: Sequence[Gpu],
        *,
        xids: XidWatcher | None = None,
    ) -> None:
        self._nvml = nvml
        self._gpus = list(gpus)
        self._xids = xids
        self._seen: dict[tuple[int, int], int] = {}
        self._xid_sick: set[int] = set()
        self._last: frozenset[int] = frozenset()

    def check(self) -> frozenset[int]:
        bad = set(self._lost())
        if self._xids is not None:
            counts = self._xids.counts()
            for (index, xid), n in counts.items():
                if n > self._seen.get((index, xid), 0) and xid not in APPLICATION_XIDS:
                    if index < 0:
                        self._xid_sick |= {g.index for g in self._gpus}
                        log.warning("critical XID %d on a GPU NVML cannot name: every GPU Unhealthy until restart", xid)
                    else:
                        self._xid_sick.add(index)
                        log.warning("GPU %d: critical XID %d: Unhealthy until the plugin restarts", index, xid)
            self._seen = counts
        bad |= self._xid_sick
        out = frozenset(bad)
        if out != self._last:
            log.warning("Unhealthy GPUs now: %s", sorted(out) or "none")
            self._last = out
        return out

    def _lost(self) -> list[int]:
        nvml = self._nvml
        try:
            nvml.nvmlDeviceGetCount()
        except (pynvml.NVMLError_Uninitialized, pynvml.NVMLError_DriverNotLoaded):
            try:
                nvml.nvmlInit()  # the driver came back: NVML needs initialising again
            except pynvml.NVMLError as exc:
                log.warning("NVML cannot initialise: %s: every GPU Unhealthy", exc)
                return [g.index for g in self._gpus]
        except pynvml.NVMLError as exc:
            log.warning("NVML cannot count GPUs: %s: every GPU Unhealthy", exc)
            return [g.index for g in self._gpus]
        lost: list[int] = []
        for gpu in self._gpus:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                nvml.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as exc:
                if gpu.index not in self._last:
                    log.warning("GPU %d (%s) cannot be read: %s", gpu.index, gpu.uuid, exc)
                lost.append(gpu.index)
                continue
            if uuid != gpu.uuid:
                if gpu.index not in self._last:
                    log.warning("GPU %d is now %s, was %s", gpu.index, uuid, gpu.uuid)
                lost.append(gpu.index)
        return lost
