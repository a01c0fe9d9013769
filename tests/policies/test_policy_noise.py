"""Noise score: co-tenant pressure on shared GPUs, node-level errors for whole GPUs."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from scheduler_plugin.model import GpuNode, GpuRequest
from scheduler_plugin.policies.base import CycleContext
from scheduler_plugin.policies.noise import NoiseArgs, NoiseScore
from tests.fleet_helpers import NOW, fleet, gpu, node, request, shared

SCORE = NoiseScore(NoiseArgs())


def raw(req: GpuRequest, *nodes: GpuNode) -> list[float]:
    f = fleet(*nodes)
    return [round(x, 4) for x in SCORE.score(req, f, np.arange(f.n_nodes), CycleContext(now=NOW)).tolist()]


@pytest.mark.parametrize(
    ("kw", "assign", "expect"),
    [
        ({}, 0, 1.0),
        ({"util": 1.0}, 0, 0.65),
        ({"mem_util": 1.0}, 0, 0.85),
        ({"used_gib": 40}, 0, 0.85),  # memory pressure 0.5 * 0.3
        ({}, 2, 0.9),  # two tenants of 4: 0.5 * 0.2
        ({"xid": 2}, 0, 0.5),
        ({"xid": 9, "util": 0.2}, 0, 0.0),
    ],
)
def test_shared_gpu_quiet(kw: dict[str, object], assign: int, expect: float) -> None:
    tenants = [shared(f"t{i}", 0, milli=100, mem_gib=5) for i in range(assign)]
    n = node("a", [gpu(0, **kw)], assignments=tenants)  # type: ignore[arg-type]
    assert raw(request(1, memory="10Gi"), n) == [expect]


def test_shared_pod_takes_the_quietest_usable_gpu() -> None:
    n = node("a", [gpu(0, util=0.9), gpu(1, util=0.1), gpu(2, util=0.0, model="T4")])
    assert raw(request(1, memory="10Gi", models="A100"), n) == [round(1 - 0.35 * 0.1, 4)]


def test_whole_gpu_pods_only_see_the_node() -> None:
    busy = node("a", [gpu(0, util=1.0, used_gib=80, mem_util=1.0), gpu(1)])
    erroring = node("b", [gpu(0, xid=4), gpu(1)])
    quiet = node("c", [gpu(0), gpu(1)])
    b, e, q = raw(request(1), busy, erroring, quiet)
    assert q == 1.0
    assert e == round(1 - 0.6, 4)
    assert b == round(1 - 0.2 * (0.8 / 2), 4)


def test_args_need_one_weight() -> None:
    with pytest.raises(ValidationError, match="at least one of"):
        NoiseArgs(util_weight=0, mem_util_weight=0, memory_pressure_weight=0, tenants_weight=0)


def test_explain() -> None:
    f = fleet(node("a", [gpu(0, util=0.5, xid=1)]))
    (line,) = SCORE.explain(request(1, memory="10Gi"), f, 0, CycleContext(now=NOW))
    assert line.startswith("gpu 0: util 50%")
    assert "1 XID errors" in line
    assert SCORE.explain(request(1), f, 0, CycleContext(now=NOW))[0].startswith("whole GPUs share no SMs")
