"""Typed rejection reasons: each kind is a small dataclass whose class fixes its metrics label and resolvability,
and which words itself (the ``FailedNodes`` text users and e2e tests read, byte for byte)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from scheduler_plugin.extender.metrics import REASONS
from scheduler_plugin.model import GIB
from scheduler_plugin.policies import reasons
from scheduler_plugin.policies.base import Rejection, RejectionKind
from scheduler_plugin.policies.reasons import (
    Fits,
    GpuAboveMaxTemperature,
    GpuAtSlowdown,
    GpuComputeFull,
    GpuMemoryFull,
    GpusInUse,
    GpusTooSmall,
    GpuThrottling,
    InsufficientResource,
    NodeHot,
    NodeThrottling,
    NodeWarming,
    NoGpus,
    NoNvlinkGroup,
    NoTelemetry,
    NvlinkGroupInUse,
    ReservedForPriority,
    StaleTelemetry,
    TooFewGpus,
    WrongModel,
)

K = RejectionKind

#: (a rejection of each kind, its label, unresolvable, its words)
KINDS: list[tuple[Rejection, RejectionKind, bool, str]] = [
    (NoGpus("1 whole GPU"), K.GPU_COUNT, True, "node has no GPUs; the pod needs 1 whole GPU"),
    (TooFewGpus(3, 2), K.GPU_COUNT, True, "needs 3 GPUs; node has 2 in total"),
    (
        WrongModel(4, ("A100",), (("H100", 8),)),
        K.GPU_MODEL,
        True,
        "needs 4 GPUs of model A100; node has 8 H100",
    ),
    (
        WrongModel(1, ("A100X",), (("A100-SXM-80GB", 8),), ("A100X",)),
        K.GPU_MODEL,
        True,
        "needs 1 GPU of model A100X; node has 8 A100-SXM-80GB (A100X: not a GPU family kelvin knows; "
        "kelvin.dev/gpu-models items match by family, e.g. A100, H100-80GB, L40S)",
    ),
    (
        GpusTooSmall(100 * GIB, 80 * GIB),
        K.GPU_MEMORY,
        True,
        "the pod needs 100 GiB on one GPU; the largest allowed GPU here has 80.0 GiB",
    ),
    (
        GpuAtSlowdown(2, 0, 1, 1, 88.0, 87.0),
        K.THERMAL,
        True,
        "gpu 2 is at 88 °C, at or above its slowdown threshold 87 °C; 0 of 1 GPUs are cool enough, the pod needs 1",
    ),
    (
        GpuAtSlowdown(0, 3, 8, 4, 83.0, 87.0, 5.0),
        K.THERMAL,
        True,
        "gpu 0 is at 83 °C, within 5 °C of its slowdown threshold 87 °C; 3 of 8 GPUs are cool enough, the pod needs 4",
    ),
    (
        GpuThrottling(0, 0, 1, 1, ("hw_thermal_slowdown",)),
        K.THERMAL,
        True,
        "gpu 0 is thermally throttling (hw_thermal_slowdown); 0 of 1 GPUs are cool enough, the pod needs 1",
    ),
    (
        GpuAboveMaxTemperature(1, 0, 1, 1, 72.5, 70.0),
        K.THERMAL,
        True,
        "gpu 1 is at 72.5 °C, above the pod's kelvin.dev/max-temperature of 70 °C; 0 of 1 GPUs are cool enough, "
        "the pod needs 1",
    ),
    (
        NoNvlinkGroup(4, 8),
        K.TOPOLOGY,
        True,
        "no 4 of the node's 8 usable GPUs are all linked by NVLink; the pod sets kelvin.dev/topology=nvlink-required",
    ),
    (
        GpuMemoryFull(3, 12.0, 20 * GIB),
        K.GPU_MEMORY,
        False,
        "gpu 3 has 12.0 GiB free; the pod needs 20 GiB on one GPU",
    ),
    (
        GpuComputeFull(0, 500, 600),
        K.GPU_MEMORY,
        False,
        "gpu 0 has 50% of its capacity free; the pod needs 60% of one GPU",
    ),
    (GpusInUse(3, 8, 4), K.GPU_COUNT, False, "3 of 8 usable GPUs are free; the pod needs 4 whole GPUs"),
    (
        NvlinkGroupInUse(4, 2),
        K.TOPOLOGY,
        False,
        "4 GPUs are free but no 2 of them are all linked by NVLink; the pod sets kelvin.dev/topology=nvlink-required",
    ),
    (Fits(), K.GPU_COUNT, False, "the pod fits this node"),
    (NoTelemetry(30.0), K.STALE_TELEMETRY, True, "no telemetry from this node yet (limit 30 s)"),
    (
        StaleTelemetry(30.0),
        K.STALE_TELEMETRY,
        True,
        "stale telemetry (older than 30 s: telemetry.maxAgeSeconds)",
    ),
    (
        StaleTelemetry(30.0, 95),
        K.STALE_TELEMETRY,
        True,
        "stale telemetry (95 s old, older than 30 s: telemetry.maxAgeSeconds)",
    ),
    (
        NodeHot(1, 1, 90.0, 83.0),
        K.THERMAL,
        True,
        "gpu 1 is at 90 °C, at or above the hot threshold 83 °C (and 1 more); the operator drains hot nodes "
        "(kelvin.dev/thermal=hot)",
    ),
    (
        NodeThrottling(0, 0),
        K.THERMAL,
        True,
        "gpu 0 is thermally throttling; the operator drains hot nodes (kelvin.dev/thermal=hot)",
    ),
    (
        NodeWarming(0, 0, 78.0, 2.0, 300.0),
        K.THERMAL,
        True,
        "gpu 0 is at 78 °C and rising 2.0 °C/min: it reaches its slowdown threshold within 300 s; the operator "
        "drains hot nodes (kelvin.dev/thermal=hot)",
    ),
    (
        InsufficientResource("cpu", 2000, 4000),
        K.NODE_RESOURCES,
        False,
        "Insufficient cpu: 2000m free, the pod requests 4000m",
    ),
    (
        InsufficientResource("memory", 16 * GIB, 32 * GIB),
        K.NODE_RESOURCES,
        False,
        "Insufficient memory: 16.0 GiB free, the pod requests 32.0 GiB",
    ),
    (
        ReservedForPriority(0, 100, 2.0, 9.5, 8),
        K.RESERVED,
        False,
        "priority 0 is below 100 and the pod would break 2.0 GPUs' worth of free NVLink groups here; the fleet "
        "keeps 8 for higher priorities (9.5 free)",
    ),
]


@pytest.mark.parametrize(("rej", "label", "unresolvable", "words"), KINDS, ids=lambda x: type(x).__name__)
def test_each_kind_has_its_label_and_words(
    rej: Rejection, label: RejectionKind, unresolvable: bool, words: str
) -> None:
    """The label comes from the class, not from the text: the extender counts ``rej.kind``."""
    assert rej.kind is label and type(rej).kind is label
    assert rej.unresolvable is unresolvable
    assert rej.reason == words


def test_every_kind_is_in_the_table() -> None:
    """A new kind must come with its label and words here."""
    concrete = {
        c
        for _, c in inspect.getmembers(reasons, inspect.isclass)
        if issubclass(c, Rejection) and c is not Rejection and not c.__name__.startswith("_")
    }
    assert concrete == {type(rej) for rej, *_ in KINDS}


def test_the_extender_counts_every_kind_a_filter_reports() -> None:
    """Every label a kind carries is a pre-registered value of ``kelvin_extender_rejections_total`` (listed in
    docs/metrics.md), except kube-scheduler's own NodeResourcesFit, which only the simulator checks."""
    labels = {rej.kind for rej, *_ in KINDS} - {K.NODE_RESOURCES}
    assert labels <= set(REASONS)
    assert set(REASONS) == set(K) - {K.NODE_RESOURCES}
    docs = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    line = next(ln for ln in docs.splitlines() if "kelvin_extender_rejections_total" in ln)
    assert all(f"`{r}`" in line for r in REASONS)


def test_equal_figures_are_equal_objects_and_words_are_not_compared() -> None:
    a, b = GpusInUse(3, 8, 4), GpusInUse(3, 8, 4)
    assert a == b and hash(a) == hash(b) and a is not b
    assert GpusInUse(2, 8, 4) != a
    assert {a: 1}[b] == 1


def test_need_leaves_the_node_figures_out() -> None:
    """Nodes rejected for the same need read alike (the demo groups refusals by it); nearness orders them."""
    near, far = GpusInUse(6, 8, 8), GpusInUse(2, 8, 8)
    assert near.need() == far.need() == "the pod needs 8 whole GPUs"
    assert near.nearness() > far.nearness()
    assert GpuMemoryFull(3, 12.0, 20 * GIB).need() == GpusTooSmall(20 * GIB, 16 * GIB).need()
    assert GpusTooSmall(20 * GIB, 16 * GIB).nearness() > GpuMemoryFull(3, 12.0, 20 * GIB).nearness()  # both GiB
    assert NoNvlinkGroup(4, 8).need() == NvlinkGroupInUse(6, 4).need()
    assert NoTelemetry(30.0).need() == NoTelemetry(30.0).reason
