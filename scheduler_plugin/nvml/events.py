"""XID errors through NVML events: a background thread that waits for events and only counts them.

The collector reads the counts on each scrape. When NVML fails (driver reload, GPU lost) the thread frees its event
set, waits ``retry_s`` and registers again; it never raises.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from typing import Any

import pynvml

from .backend import NvmlApi

log = logging.getLogger(__name__)

#: XID codes pre-initialised to 0 on every GPU, so dashboards and alerts see the series before the first error.
#: 13 graphics engine exception, 31 MMU fault, 43 reset channel, 48 double-bit ECC, 63/64 row remapping,
#: 74 NVLink, 79 fallen off the bus, 94/95 contained/uncontained ECC, 119 GSP timeout. Other codes appear when seen.
COMMON_XIDS: tuple[int, ...] = (13, 31, 43, 48, 63, 64, 74, 79, 94, 95, 119)


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class XidWatcher:
    """Counts XID critical-error events per (GPU index, XID code)."""

    def __init__(self, nvml: NvmlApi, wait_ms: int = 500, retry_s: float = 2.0) -> None:
        self._nvml = nvml
        self._wait_ms = wait_ms
        self._retry_s = retry_s
        self._counts: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registered: frozenset[int] = frozenset()
        """GPU indices whose XID events are being watched."""

    def counts(self) -> dict[tuple[int, int], int]:
        with self._lock:
            return dict(self._counts)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kelvin-xid-events", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        delay = self._retry_s
        while not self._stop.is_set():
            try:
                self._watch()
            except pynvml.NVMLError as exc:
                # back off while NVML stays down (up to a minute); start again quickly after it worked
                delay = self._retry_s if self.registered else min(60.0, delay * 2)
                log.warning("XID event watch failed, retrying in %.1fs: %s", delay, exc)
                self.registered = frozenset()
                self._stop.wait(delay)

    def _watch(self) -> None:
        nvml = self._nvml
        nvml.nvmlInit()
        try:
            event_set = nvml.nvmlEventSetCreate()
            try:
                by_address: dict[int, int] = {}
                for index in range(nvml.nvmlDeviceGetCount()):
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    try:
                        nvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                    except pynvml.NVMLError_NotSupported:
                        log.info("GPU %d does not support XID events", index)
                        continue
                    by_address[_address(handle)] = index
                self.registered = frozenset(by_address.values())
                while not self._stop.is_set():
                    try:
                        data = nvml.nvmlEventSetWait_v2(event_set, self._wait_ms)
                    except pynvml.NVMLError_Timeout:
                        continue
                    if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                        gpu = by_address.get(_address(data.device), -1)
                        key = (gpu, int(data.eventData))
                        with self._lock:
                            self._counts[key] = self._counts.get(key, 0) + 1
                        log.warning("XID %d on GPU %d", data.eventData, gpu)
            finally:
                with contextlib.suppress(pynvml.NVMLError):
                    nvml.nvmlEventSetFree(event_set)
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                nvml.nvmlShutdown()
