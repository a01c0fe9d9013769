"""Device health from NVML: a GPU NVML can no longer read (lost, off the bus, driver gone) or one that raised a
critical XID is Unhealthy.

XIDs come from the exporter's :class:`~scheduler_plugin.exporter.events.XidWatcher` (NVML critical-error events).
Every XID counts except those that report an application's own fault rather than the GPU's, the list NVIDIA's
device plugin skips too (:data:`APPLICATION_XIDS`). A GPU with a critical XID stays Unhealthy for ``xid_hold_s``
seconds after the last one, then is Healthy again if NVML reads it. A lost GPU is Healthy again as soon as NVML reads
it (with the same UUID at the same index).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import pynvml

from ..exporter.backend import NvmlApi
from ..exporter.events import XidWatcher
from .devices import Gpu

log = logging.getLogger(__name__)

#: 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup,
#: 68 video processor exception, 109 context-switch timeout: a program's bug or its own kill, not a sick GPU.
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
DEFAULT_XID_HOLD_S = 300.0


class Health:
    """:meth:`check` reads every served GPU once and returns the indices that are Unhealthy now (blocking: NVML)."""

    def __init__(
        self,
        nvml: NvmlApi,
        gpus: Sequence[Gpu],
        *,
        xids: XidWatcher | None = None,
        xid_hold_s: float = DEFAULT_XID_HOLD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._gpus = list(gpus)
        self._xids = xids
        self._hold_s = xid_hold_s
        self._clock = clock
        self._seen: dict[tuple[int, int], int] = {}
        self._xid_until: dict[int, float] = {}
        self._last: frozenset[int] = frozenset()

    def check(self) -> frozenset[int]:
        now = self._clock()
        bad = set(self._lost())
        if self._xids is not None:
            counts = self._xids.counts()
            for (index, xid), n in counts.items():
                if n > self._seen.get((index, xid), 0) and xid not in APPLICATION_XIDS:
                    self._xid_until[index] = now + self._hold_s
                    log.warning("GPU %d: critical XID %d: Unhealthy for %.0fs", index, xid, self._hold_s)
            self._seen = counts
        bad |= {i for i, until in self._xid_until.items() if until > now}
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
