"""The fit and telemetry filters: which nodes pass, and the words and verdicts of the ones that do not."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_plugin.model import GpuRequest, ThrottleReason
from scheduler_plugin.policies.base import CycleContext
from scheduler_plugin.policies.fit import FitFilter, TelemetryFilter
from scheduler_plugin.policies.policy_file import FilterPolicy
from tests.fleet_helpers import NOW, dgx, fleet, gpu, node, nvlink_pairs, pcie_box, request, shared, whole

FIT = FitFilter(FilterPolicy())


def verdict(req: GpuRequest, *nodes: object) -> tuple[list[bool], list[tuple[str, bool]]]:
    f = fleet(*nodes)  # type: ignore[arg-type]
    idx = np.arange(f.n_nodes)
    ctx = CycleContext(now=NOW)
    ok = FIT.filter(req, f, idx, ctx)
    rej = FIT.reasons(req, f, idx, ctx)
    return ok.tolist(), [(r.reason, r.unresolvable) for r in rej]


@pytest.mark.parametrize(
    ("req", "n", "expect"),
    [
        (request(1), dgx("a"), True),
        (request(8), dgx("a"), True),
        (request(8), dgx("a", assignments=[whole("x", 3)]), False),
        (request(7), dgx("a", assignments=[whole("x", 3)]), True),
        (request(1, memory="20Gi"), dgx("a", assignments=[whole(f"x{i}", i) for i in range(8)]), False),
        (request(1, memory="20Gi"), node("a", [gpu(0, used_gib=60)]), True),
        (request(1, memory="20Gi"), node("a", [gpu(0, used_gib=61)]), False),
        (request(1, memory="20Gi"), node("a", [gpu(0, mem_gib=16)]), False),
        (request(1, share=500), node("a", [gpu(0)], assignments=[shared("x", 0, milli=500)]), True),
        (request(1, share=501), node("a", [gpu(0)], assignments=[shared("x", 0, milli=500)]), False),
        (request(1, models="H100"), dgx("a"), False),
        (request(1, models="h100,A100"), dgx("a"), True),
        (request(1), node("a", [gpu(0, temp=87, slowdown=87)]), False),
        (request(1), node("a", [gpu(0, temp=86.9, slowdown=87)]), True),
        (request(1), node("a", [gpu(0, throttle=int(ThrottleReason.SW_THERMAL_SLOWDOWN))]), False),
        (request(1), node("a", [gpu(0, throttle=int(ThrottleReason.SW_POWER_CAP))]), True),
        (request(1, max_temp=60), node("a", [gpu(0, temp=61)]), False),
        (request(1, max_temp=60), node("a", [gpu(0, temp=60)]), True),
        (request(4, topology="nvlink-required"), dgx("a"), True),
        (request(4, topology="nvlink-required"), pcie_box("a"), False),
        (request(2, topology="nvlink-required"), nvlink_pairs("a"), True),
        (request(2, topology="nvlink-required"), nvlink_pairs("a", assignments=[whole("x", 0, 2, 4, 6)]), False),
        (request(4, topology="nvlink-preferred"), pcie_box("a"), True),
        (request(1, topology="nvlink-required"), pcie_box("a"), True),
        (request(3), node("a", [gpu(0), gpu(1)]), False),
        (request(0), node("a", []), True),
    ],
)
def test_fit_table(req: GpuRequest, n: object, expect: bool) -> None:
    ok, _ = verdict(req, n)
    assert ok == [expect]


def test_hot_gpus_are_skipped_not_the_node() -> None:
    gpus = [gpu(i, temp=95 if i < 2 else 50) for i in range(4)]
    assert verdict(request(2), node("a", gpus))[0] == [True]
    assert verdict(request(3), node("a", gpus))[0] == [False]


def test_mixed_models_count_only_allowed_ones() -> None:
    gpus = [gpu(0, model="A100"), gpu(1, model="H100"), gpu(2, model="H100")]
    assert verdict(request(2, models="H100"), node("a", gpus))[0] == [True]
    assert verdict(request(3, models="H100"), node("a", gpus))[0] == [False]


def test_nvlink_clique_on_wide_node_uses_enumeration() -> None:
    wide = dgx("w", 12)
    broken = nvlink_pairs("p", 12)
    ok, _ = verdict(request(4, topology="nvlink-required"), wide, broken)
    assert ok == [True, False]


@pytest.mark.parametrize(
    ("req", "n", "text", "unresolvable"),
    [
        (
            request(1, memory="20Gi"),
            node("a", [gpu(3, used_gib=68)]),
            "gpu 3 has 12.0 GiB free; the pod needs 20 GiB on one GPU",
            False,
        ),
        (request(4, models="A100"), dgx("a", model="H100"), "needs 4 GPUs of model A100; node has 8 H100", True),
        (
            request(1),
            node("a", [gpu(2, temp=88, slowdown=87)]),
            "gpu 2 is at 88 °C, at or above its slowdown threshold 87 °C; 0 of 1 GPUs are cool enough, the pod needs 1",
            True,
        ),
        (
            request(1),
            node("a", [gpu(0, throttle=int(ThrottleReason.HW_THERMAL_SLOWDOWN))]),
            "gpu 0 is thermally throttling (hw_thermal_slowdown)",
            True,
        ),
        (
            request(1, max_temp=70),
            node("a", [gpu(1, temp=72.5)]),
            "gpu 1 is at 72.5 °C, above the pod's kelvin.dev/max-temperature of 70 °C",
            True,
        ),
        (request(3), node("a", [gpu(0), gpu(1)]), "needs 3 GPUs; node has 2 in total", True),
        (request(1), node("a", []), "node has no GPUs; the pod needs 1 whole GPU", True),
        (
            request(1, memory="100Gi"),
            node("a", [gpu(0)]),
            "the pod needs 100 GiB on one GPU; the largest allowed GPU here has 80.0 GiB",
            True,
        ),
        (
            request(4),
            dgx("a", assignments=[whole("x", 0, 1, 2, 3, 4)]),
            "3 of 8 usable GPUs are free; the pod needs 4 whole GPUs",
            False,
        ),
        (
            request(4, topology="nvlink-required"),
            pcie_box("a"),
            "no 4 of the node's 8 usable GPUs are all linked by NVLink; "
            "the pod sets kelvin.dev/topology=nvlink-required",
            True,
        ),
        (
            request(2, topology="nvlink-required"),
            nvlink_pairs("a", assignments=[whole("x", 0, 2, 4, 6)]),
            "4 GPUs are free but no 2 of them are all linked by NVLink; "
            "the pod sets kelvin.dev/topology=nvlink-required",
            False,
        ),
        (
            request(1, share=600),
            node("a", [gpu(0)], assignments=[shared("x", 0, milli=500)]),
            "gpu 0 has 50% of its capacity free; the pod needs 60% of one GPU",
            False,
        ),
    ],
)
def test_rejection_reasons(req: GpuRequest, n: object, text: str, unresolvable: bool) -> None:
    ok, reasons = verdict(req, n)
    assert ok == [False]
    reason, unres = reasons[0]
    assert reason.startswith(text), reason
    assert unres is unresolvable


def test_reasons_are_per_row_in_order() -> None:
    ok, reasons = verdict(
        request(1, memory="20Gi"),
        node("a", [gpu(0, used_gib=70)]),
        dgx("b"),
        node("c", [gpu(0, used_gib=75)]),
        node("d", [gpu(0, model="T4", mem_gib=16)]),
    )
    assert ok == [False, True, False, False]
    assert reasons[0][0] == "gpu 0 has 10.0 GiB free; the pod needs 20 GiB on one GPU"
    assert reasons[1][0] == "the pod fits this node"
    assert reasons[2][0] == "gpu 0 has 5.0 GiB free; the pod needs 20 GiB on one GPU"
    assert reasons[3][0].startswith("the pod needs 20 GiB on one GPU; the largest allowed GPU here has 16.0 GiB")


def test_limits_can_be_switched_off() -> None:
    lax = FitFilter(FilterPolicy(thermal_hard_limits=False, throttle_hard_limit=False))
    f = fleet(node("a", [gpu(0, temp=95, throttle=int(ThrottleReason.SW_THERMAL_SLOWDOWN))]))
    ctx = CycleContext(now=NOW)
    assert lax.filter(request(1), f, np.array([0]), ctx).tolist() == [True]
    assert FIT.filter(request(1), f, np.array([0]), ctx).tolist() == [False]


def test_slowdown_margin() -> None:
    margin = FitFilter(FilterPolicy(slowdown_margin_celsius=5))
    f = fleet(node("a", [gpu(0, temp=83, slowdown=87)]))
    ctx = CycleContext(now=NOW)
    assert margin.filter(request(1), f, np.array([0]), ctx).tolist() == [False]
    assert margin.explain(request(1), f, 0, ctx).reason.startswith(
        "gpu 0 is at 83 °C, within 5 °C of its slowdown threshold 87 °C"
    )


@pytest.mark.parametrize(
    ("mode", "observed", "passes", "reason"),
    [
        ("deny", NOW - 95, False, "stale telemetry (95 s old, older than 30 s: telemetry.maxAgeSeconds)"),
        ("deny", None, False, "no telemetry from this node yet (limit 30 s)"),
        ("deny", NOW - 5, True, None),
        ("allow", NOW - 95, True, None),
        ("allow", None, True, None),
    ],
)
def test_telemetry_filter(mode: str, observed: float | None, passes: bool, reason: str | None) -> None:
    f = fleet(node("a", [gpu(0)], observed_at=observed))
    stale = np.asarray(~(NOW - f.observed_at <= 30.0))
    ctx = CycleContext(now=NOW, stale=stale)
    flt = TelemetryFilter(30.0, mode)  # type: ignore[arg-type]
    assert flt.filter(request(1), f, np.array([0]), ctx).tolist() == [passes]
    if reason is not None:
        rej = flt.explain(request(1), f, 0, ctx)
        assert rej.reason == reason
        assert rej.unresolvable
        assert rej.kind == "stale_telemetry"


def test_stale_nodes_share_one_reason_whatever_their_age() -> None:
    """kube-scheduler groups the nodes of its message by reason text: a reason naming each node's age split one
    telemetry outage into a group per second ("12 telemetry is 56 s old ..., 14 ... 60 s old ...", issue 20 defect 9).
    One cause, one reason; the age stays in ``explain``."""
    f = fleet(*(node(n, [gpu(0)], observed_at=NOW - age) for n, age in (("a", 56), ("b", 60), ("c", 95.5))))
    ctx = CycleContext(now=NOW, stale=np.asarray(~(NOW - f.observed_at <= 30.0)))
    flt = TelemetryFilter(30.0, "deny")
    reasons = flt.reasons(request(1), f, np.array([0, 1, 2]), ctx)
    assert {r.reason for r in reasons} == {"stale telemetry (older than 30 s: telemetry.maxAgeSeconds)"}
    assert all(r.unresolvable and r.kind == "stale_telemetry" for r in reasons)


def test_pods_without_gpus_pass_everything() -> None:
    f = fleet(node("a", [], observed_at=None))
    ctx = CycleContext(now=NOW, stale=np.array([True]))
    assert FIT.filter(request(0), f, np.array([0]), ctx).tolist() == [True]
    assert TelemetryFilter(30.0, "deny").filter(request(0), f, np.array([0]), ctx).tolist() == [True]


def test_gpu_lines_say_why_each_gpu_is_unusable() -> None:
    n = node("a", [gpu(0, model="T4"), gpu(1, temp=90), gpu(2, used_gib=70), gpu(3)])
    lines = FIT.gpu_lines(request(1, models="A100"), fleet(n), 0)
    assert [ln.rsplit("; ", 1)[1] for ln in lines] == [
        "not usable: model not allowed",
        "not usable: too hot",
        "not usable now: in use",
        "usable",
    ]


@pytest.mark.parametrize(
    ("req", "n", "code"),
    [
        (request(1, memory="20Gi"), node("a", [gpu(0, used_gib=68)]), "gpu_memory"),
        (request(1, memory="20.05Gi"), node("a", [gpu(0, used_gib=60)]), "gpu_memory"),
        (request(1, memory="100Gi"), node("a", [gpu(0)]), "gpu_memory"),
        (request(1, models="H100"), dgx("a"), "gpu_model"),
        (request(3), node("a", [gpu(0), gpu(1)]), "gpu_count"),
        (request(2), dgx("a", assignments=[whole("x", *range(7))]), "gpu_count"),
        (request(1), node("a", [gpu(0, temp=99)]), "thermal"),
        (request(4, topology="nvlink-required"), pcie_box("a"), "topology"),
        (request(2, topology="nvlink-required"), nvlink_pairs("a", assignments=[whole("x", 0, 2, 4, 6)]), "topology"),
    ],
)
def test_rejection_codes_match_the_metric_labels(req: GpuRequest, n: object, code: str) -> None:
    f = fleet(n)  # type: ignore[arg-type]
    assert FIT.explain(req, f, 0, CycleContext(now=NOW)).kind == code


def test_memory_short_by_less_than_the_printed_precision() -> None:
    # 20.0 GiB free, 20.05 GiB needed: the text still says memory, not compute
    f = fleet(node("a", [gpu(0, used_gib=60)]))
    rej = FIT.explain(request(1, memory="20.05Gi"), f, 0, CycleContext(now=NOW))
    assert rej.reason == "gpu 0 has 20.0 GiB free; the pod needs 20.05 GiB on one GPU"


def test_cycle_eligibility_cache_for_few_and_many_rows() -> None:
    from scheduler_plugin.policies.eligibility import cycle_eligible, eligible_gpus

    nodes = [node(f"n{i}", [gpu(0, temp=50 + 5 * i), gpu(1, used_gib=10 * i)]) for i in range(10)]
    f = fleet(*nodes)
    req = request(1, memory="20Gi")
    ctx = CycleContext(now=NOW)
    few = np.array([7, 2])
    got = cycle_eligible(req, f, few, ctx)
    assert got.tolist() == eligible_gpus(req, f, few).tolist()
    assert cycle_eligible(req, f, few, ctx) is got  # the same rows array: reused
    other = np.array([8, 1])
    assert cycle_eligible(req, f, other, ctx).tolist() == eligible_gpus(req, f, other).tolist()
    many = np.arange(10)[::-1]
    assert cycle_eligible(req, f, many, ctx).tolist() == eligible_gpus(req, f, many).tolist()
    assert cycle_eligible(req, f, few, ctx).tolist() == eligible_gpus(req, f, few).tolist()  # from the full mask
