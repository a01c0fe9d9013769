"""NVML health of the served GPUs on the fake NVML: lost GPUs, the driver gone, critical and application XIDs."""

from __future__ import annotations

from scheduler_plugin.deviceplugin.devices import discover
from scheduler_plugin.deviceplugin.health import Health
from scheduler_plugin.exporter.fake_nvml import FakeNvml


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


def test_critical_xids_hold_application_xids_do_not(fake: FakeNvml) -> None:
    now = [100.0]
    xids = Xids()
    health = Health(fake, discover(fake), xids=xids, xid_hold_s=60.0, clock=lambda: now[0])  # type: ignore[arg-type]
    xids.seen = {(0, 13): 1, (1, 31): 4, (2, 43): 1}  # application faults
    assert health.check() == frozenset()
    xids.seen = {**xids.seen, (2, 48): 1}  # double-bit ECC error
    assert health.check() == frozenset({2})
    now[0] += 59.0
    assert health.check() == frozenset({2})
    now[0] += 30.0
    xids.seen = {**xids.seen, (2, 48): 2}  # another one, seen at 189 s, holds the GPU until 249 s
    assert health.check() == frozenset({2})
    now[0] += 59.0
    assert health.check() == frozenset({2})
    now[0] += 2.0
    assert health.check() == frozenset()
