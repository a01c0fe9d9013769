"""The fit filter words rejections only when they are asked for (:meth:`FitFilter.reasons`), never on the way to a
verdict, and words them as it always did: the text of each kind of rejection on a fleet that has each, through the
memo (many rows) and alone (one row), and the rejection memo catching up after cycles that only filtered."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from scheduler_plugin.model import FleetArrays, GpuAssignment, GpuRequest
from scheduler_plugin.model.snapshot import SnapshotIndex
from scheduler_plugin.policies.base import CycleContext, Rejection
from scheduler_plugin.policies.fit import FitFilter
from scheduler_plugin.policies.policy_file import FilterPolicy
from tests.fleet_helpers import dgx, fleet, gpu, node, nvlink_pairs, request, shared, whole

FLEET = fleet(
    node("full", [gpu(0), gpu(1)], assignments=[whole("x", 0, 1)]),
    node("hot", [gpu(0, temp=95), gpu(1, temp=70)]),
    node("small", [gpu(0, mem_gib=16)]),
    node(
        "busy",
        [gpu(0), gpu(1)],
        assignments=[shared("y", 0, milli=900, mem_gib=10), shared("v", 1, milli=100, mem_gib=75)],
    ),
    dgx("used", 4, assignments=[whole("z", 0)]),
    node("warm", [gpu(0, temp=70)]),
    nvlink_pairs("pairs", 4, assignments=[whole("u", 0, 2)]),
    node("none", []),
)

CASES = [
    request(1),
    request(2),
    request(1, memory="20Gi"),
    request(1, share=300),
    request(1, memory="30Gi", share=100),
    request(1, max_temp=60),
    request(4, topology="nvlink-required"),
    request(2, topology="nvlink-required"),
    request(1, models="H100"),
]

EXPECTED = (
    {
        "busy": "0 of 2 usable GPUs are free; the pod needs 1 whole GPU",
        "full": "0 of 2 usable GPUs are free; the pod needs 1 whole GPU",
        "none": "node has no GPUs; the pod needs 1 whole GPU",
    },
    {
        "busy": "0 of 2 usable GPUs are free; the pod needs 2 whole GPUs",
        "full": "0 of 2 usable GPUs are free; the pod needs 2 whole GPUs",
        "hot": "gpu 0 is at 95 °C, at or above its slowdown threshold 87 °C; 1 of 2 GPUs are cool enough, "
        "the pod needs 2",
        "none": "node has no GPUs; the pod needs 2 whole GPUs",
        "small": "needs 2 GPUs; node has 1 in total",
        "warm": "needs 2 GPUs; node has 1 in total",
    },
    {
        "busy": "gpu 0 has 10% of its capacity free; the pod needs 25% of one GPU",
        "full": "gpu 0 has 0.0 GiB free; the pod needs 20 GiB on one GPU",
        "none": "node has no GPUs; the pod needs a share of one GPU (20 GiB)",
        "small": "the pod needs 20 GiB on one GPU; the largest allowed GPU here has 16.0 GiB",
    },
    {
        "busy": "gpu 0 has 10% of its capacity free; the pod needs 30% of one GPU",
        "full": "gpu 0 has 0% of its capacity free; the pod needs 30% of one GPU",
        "none": "node has no GPUs; the pod needs a share of one GPU (30% of compute)",
    },
    {
        "busy": "gpu 0 has 10% of its capacity free; the pod needs 37.5% of one GPU",
        "full": "gpu 0 has 0.0 GiB free; the pod needs 30 GiB on one GPU",
        "none": "node has no GPUs; the pod needs a share of one GPU (30 GiB, 10% of compute)",
        "small": "the pod needs 30 GiB on one GPU; the largest allowed GPU here has 16.0 GiB",
    },
    {
        "busy": "0 of 2 usable GPUs are free; the pod needs 1 whole GPU",
        "full": "0 of 2 usable GPUs are free; the pod needs 1 whole GPU",
        "hot": "gpu 0 is at 95 °C, at or above its slowdown threshold 87 °C; 0 of 2 GPUs are cool enough, "
        "the pod needs 1",
        "none": "node has no GPUs; the pod needs 1 whole GPU",
        "warm": "gpu 0 is at 70 °C, above the pod's kelvin.dev/max-temperature of 60 °C; 0 of 1 GPUs are cool enough, "
        "the pod needs 1",
    },
    {
        "busy": "needs 4 GPUs; node has 2 in total",
        "full": "needs 4 GPUs; node has 2 in total",
        "hot": "needs 4 GPUs; node has 2 in total",
        "none": "node has no GPUs; the pod needs 4 whole GPUs",
        "pairs": "no 4 of the node's 4 usable GPUs are all linked by NVLink; the pod sets "
        "kelvin.dev/topology=nvlink-required",
        "small": "needs 4 GPUs; node has 1 in total",
        "used": "3 of 4 usable GPUs are free; the pod needs 4 whole GPUs",
        "warm": "needs 4 GPUs; node has 1 in total",
    },
    {
        "busy": "no 2 of the node's 2 usable GPUs are all linked by NVLink; the pod sets "
        "kelvin.dev/topology=nvlink-required",
        "full": "no 2 of the node's 2 usable GPUs are all linked by NVLink; the pod sets "
        "kelvin.dev/topology=nvlink-required",
        "hot": "gpu 0 is at 95 °C, at or above its slowdown threshold 87 °C; 1 of 2 GPUs are cool enough, "
        "the pod needs 2",
        "none": "node has no GPUs; the pod needs 2 whole GPUs",
        "pairs": "2 GPUs are free but no 2 of them are all linked by NVLink; the pod sets "
        "kelvin.dev/topology=nvlink-required",
        "small": "needs 2 GPUs; node has 1 in total",
        "warm": "needs 2 GPUs; node has 1 in total",
    },
    {
        "busy": "needs 1 GPU of model H100; node has 2 A100",
        "full": "needs 1 GPU of model H100; node has 2 A100",
        "hot": "needs 1 GPU of model H100; node has 2 A100",
        "none": "node has no GPUs; the pod needs 1 whole GPU",
        "pairs": "needs 1 GPU of model H100; node has 4 A100",
        "small": "needs 1 GPU of model H100; node has 1 A100",
        "used": "needs 1 GPU of model H100; node has 4 A100",
        "warm": "needs 1 GPU of model H100; node has 1 A100",
    },
)
"""The reasons main words for :data:`CASES` on :data:`FLEET` (node name: text), recorded before the change."""


def fresh() -> FleetArrays:
    """:data:`FLEET` with an empty snapshot index of its own (no memo left by another test)."""
    return dataclasses.replace(FLEET, derived=SnapshotIndex())


def worded(fit: FitFilter, req: GpuRequest, f: FleetArrays) -> dict[str, str]:
    """Every row at once (the memo's path): the text of each failing node's rejection."""
    every = np.arange(f.n_nodes, dtype=np.int64)
    ctx = CycleContext(now=0.0)
    bad = every[~fit.filter(req, f, every, ctx)]
    return {f.names[r]: rej.reason for r, rej in zip(bad.tolist(), fit.reasons(req, f, bad, ctx), strict=True)}


def alone(fit: FitFilter, req: GpuRequest, f: FleetArrays) -> dict[str, str]:
    """Each row judged alone (one row is "few": no memo)."""
    out = {}
    for r in range(f.n_nodes):
        one = np.array([r], dtype=np.int64)
        if not fit.filter(req, f, one, CycleContext(now=0.0))[0]:
            out[f.names[r]] = fit.reasons(req, f, one, CycleContext(now=0.0))[0].reason
    return out


@pytest.mark.parametrize(("req", "expected"), list(zip(CASES, EXPECTED, strict=True)), ids=lambda x: str(x)[:40])
def test_reasons_are_worded_as_before(req: GpuRequest, expected: dict[str, str]) -> None:
    fit = FitFilter(FilterPolicy())
    assert worded(fit, req, fresh()) == expected
    assert alone(fit, req, fresh()) == expected


def test_the_filter_words_nothing_and_reasons_catch_up_after_filter_only_cycles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[Rejection] = []
    post_init = Rejection.__post_init__

    def counted(self: Rejection) -> None:
        made.append(self)
        post_init(self)

    monkeypatch.setattr(Rejection, "__post_init__", counted)
    fit = FitFilter(FilterPolicy())
    base = fresh()
    every = np.arange(base.n_nodes, dtype=np.int64)
    assumed: dict[str, list[GpuAssignment]] = {}
    current = base
    binds = [("used", whole("b1", 1)), ("hot", whole("b2", 1)), ("pairs", whole("b3", 1))]
    for req in CASES:  # a cycle per shape and bind, verdicts only: most nodes fail, none is worded
        for name, a in binds:
            assert not fit.filter(req, current, every, CycleContext(now=0.0)).all()
            assumed.setdefault(name, []).append(a)
            current = base.with_assumed(assumed)
    assert made == []
    for req in CASES:  # the rejection memo, first asked now, words the rows as they are now
        assert worded(fit, req, current) == alone(fit, req, current)
    assert made
