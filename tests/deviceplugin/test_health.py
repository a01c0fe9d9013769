"""NVML health of the served GPUs on the fake NVML: lost GPUs, the driver gone, critical and application XIDs."""

from __future__ import annotations

from scheduler_plugin.deviceplugin.devices import discover
from scheduler_plugin.deviceplugin.health import Health
from scheduler_plugin.nvml.fake import FakeNvml


class Xids:
    """The XidWatcher's counts, set by the test."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], int] = {}

    def counts(self) -> dict[tuple[int, int], int]:
        return dict(self.seen)


def test_driver_gone_makes_every_gpu_unhealthy_until_it_is_back(fake: FakeNvml) -> None:
    health = Health(fake, discover(fake))
    assert health.check() == frozenset()
    fake.driver_down()
    assert health.check() == frozenset({0, 1, 2, 3})
    fake.driver_up()  # NVML is initialised again by the check itself
    assert health.check() == frozenset()


def test_another_gpu_at_the_same_index_is_unhealthy(fake: FakeNvml) -> None:
    health = Health(fake, discover(fake))
    fake.gpus[3].uuid = "GPU-ffffffff-ffff-4fff-8fff-ffffffffffff"  # replaced board, or indices reordered
    assert health.check() == frozenset({3})


def test_critical_xid_stays_unhealthy_until_restart_application_xids_do_not(fake: FakeNvml) -> None:
    xids = Xids()
    health = Health(fake, discover(fake), xids=xids)  # type: ignore[arg-type]
    xids.seen = {(0, 13): 1, (1, 31): 4, (2, 43): 1}  # application faults
    assert health.check() == frozenset()
    xids.seen = {**xids.seen, (2, 48): 1}  # double-bit ECC error
    assert health.check() == frozenset({2})
    for _ in range(3):  # NVML still reads the GPU: it stays Unhealthy (NVIDIA's device plugin does the same)
        assert health.check() == frozenset({2})


def test_xid_nvml_cannot_attribute_makes_every_gpu_unhealthy(fake: FakeNvml) -> None:
    xids = Xids()
    health = Health(fake, discover(fake), xids=xids)  # type: ignore[arg-type]
    xids.seen = {(-1, 13): 1}  # an application fault, even unattributed, is not the GPUs'
    assert health.check() == frozenset()
    xids.seen = {(-1, 79): 1}
    assert health.check() == frozenset({0, 1, 2, 3})
