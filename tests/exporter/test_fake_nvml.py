"""The fake NVML behaves like pynvml: same return types, pynvml's own error classes, and working fault injection."""

from __future__ import annotations

import pynvml
import pytest

from scheduler_plugin.model import MIB
from scheduler_plugin.nvml.fake import FakeNvml


@pytest.fixture
def nvml() -> FakeNvml:
    fake = FakeNvml(8, "H100-SXM-80GB")
    fake.nvmlInit()
    return fake


def test_returns_pynvml_structures(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(h, pynvml.c_nvmlDevice_t)
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    assert isinstance(mem, pynvml.c_nvmlMemory_t)
    assert mem.total == 81559 * MIB and mem.used + mem.free == mem.total
    util = nvml.nvmlDeviceGetUtilizationRates(h)
    assert isinstance(util, pynvml.c_nvmlUtilization_t) and 0 <= util.gpu <= 100
    assert isinstance(nvml.nvmlDeviceGetPciInfo(h), pynvml.nvmlPciInfo_t)
    fields = nvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    assert isinstance(fields[0], pynvml.c_nvmlFieldValue_t) and fields[0].nvmlReturn == pynvml.NVML_SUCCESS
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert isinstance(procs[0], pynvml.nvmlFriendlyObject) and procs[0].usedGpuMemory > 0
    assert nvml.nvmlDeviceGetPowerUsage(h) > 1000  # milliwatts, as NVML reports
    assert nvml.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == 90
    assert nvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980
    assert nvml.nvmlDeviceGetMigMode(h) == [pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_DISABLE]
    peer = nvml.nvmlDeviceGetHandleByIndex(4)
    assert nvml.nvmlDeviceGetTopologyCommonAncestor(h, peer) == pynvml.NVML_TOPOLOGY_SYSTEM


def test_errors_are_pynvml_subclasses(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.set_error("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerUsage(h)
    nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(0))  # only GPU 1 is affected
    nvml.lose_gpu(1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetMemoryInfo(h)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(8)
    nvml.driver_down()
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        nvml.nvmlInit()
    nvml.driver_up()
    with pytest.raises(pynvml.NVMLError_Uninitialized):  # driver_down dropped the init, as a reload does
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 8


def test_nvlink_links_end_with_invalid_argument(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetNvLinkState(h, 17) == pynvml.NVML_FEATURE_ENABLED
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkState(h, 18)
    pcie = FakeNvml(2, "L40S")
    pcie.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pcie.nvmlDeviceGetNvLinkState(pcie.nvmlDeviceGetHandleByIndex(0), 0)


def test_xid_events_reach_registered_sets_only(nvml: FakeNvml) -> None:
    event_set = nvml.nvmlEventSetCreate()
    h = nvml.nvmlDeviceGetHandleByIndex(2)
    nvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, event_set)
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(event_set, 10)
    nvml.inject_xid(5, 31)  # GPU 5 is not registered
    nvml.inject_xid(2, 79)
    data = nvml.nvmlEventSetWait_v2(event_set, 1000)
    assert isinstance(data, pynvml.c_nvmlEventData_t)
    assert data.eventType == pynvml.nvmlEventTypeXidCriticalError and data.eventData == 79
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(event_set, 10)
    nvml.nvmlEventSetFree(event_set)


def test_unknown_model_is_rejected_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown GPU model .Voodoo5.; known models: .*H100-SXM-80GB"):
        FakeNvml(8, "Voodoo5")
