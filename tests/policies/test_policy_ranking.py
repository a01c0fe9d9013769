"""The framework's batch entry points for the simulators (policies/ranking.py) are the framework's own verdicts: the
same rows pass as :meth:`Framework.filter`, ranked by :meth:`Framework.prioritize`'s float (issue 15, item 5: no
second filter/score combination in the simulator)."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_plugin.model import GIB, FleetArrays, GpuRequest
from scheduler_plugin.policies import Framework, PolicyConfig
from scheduler_plugin.policies.ranking import feasible, rank, tied_best
from scheduler_plugin.simulator.policies import POLICIES, build_policy
from tests.fleet_helpers import NOW, dgx, fleet, gpu, node, pcie_box, shared, whole

REQUESTS = [
    GpuRequest(count=1),
    GpuRequest(count=1, milli=250),
    GpuRequest(count=1, milli=None, memory_bytes=30 * GIB),
    GpuRequest(count=2),
    GpuRequest(count=4),
    GpuRequest(count=8),
    GpuRequest(count=0, cpu_milli=1000),
]


def _fleet() -> FleetArrays:
    return fleet(
        dgx("free"),
        dgx("busy", assignments=[whole("w", 0, 1, 2, 3, 4, 5), shared("s", 6, milli=600)]),
        pcie_box("hot", 4, temp=89),
        node("throttled", [gpu(0, throttle=0x20), gpu(1)]),
        node("stale", [gpu(0), gpu(1)], observed_at=NOW - 3600),
    )


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: r.describe())
def test_feasible_and_rank_are_the_frameworks_filter_and_prioritize(req: GpuRequest) -> None:
    fw = Framework.from_config(PolicyConfig())
    f = _fleet()
    rows = np.arange(f.n_nodes, dtype=np.int64)
    ctx = fw.context(f, NOW)
    passed = feasible(fw, req, f, rows, ctx)
    assert passed.tolist() == fw.filter(req, f, rows, fw.context(f, NOW)).passed.tolist()
    if req.wants_gpu:
        assert 0 < passed.size < f.n_nodes  # the case exercises the filters
    if passed.size:
        got = rank(fw, req, f, passed, fw.context(f, NOW))
        _, want = fw.prioritize(req, f, passed, fw.context(f, NOW))
        assert got.tolist() == want.tolist()


def test_raw_ranking_is_the_only_score_plugins_raw_score() -> None:
    policy = build_policy("best-fit")
    fw = policy.framework
    f = _fleet()
    rows = np.arange(f.n_nodes, dtype=np.int64)
    req = GpuRequest(count=1, cpu_milli=1000)
    ctx = fw.context(f, NOW)
    raw = fw.scorers[0].plugin.score(req, f, rows, ctx)
    assert rank(fw, req, f, rows, ctx, raw=True).tolist() == raw.tolist()
    with pytest.raises(ValueError, match="exactly one score plugin, the framework has 5"):
        kelvin = Framework.from_config(PolicyConfig())
        rank(kelvin, req, f, rows, kelvin.context(f, NOW), raw=True)


def test_every_simulator_policy_is_a_framework() -> None:
    for name in POLICIES:
        policy = build_policy(name, 1)
        assert isinstance(policy.framework, Framework), name
        assert policy.raw == (name not in ("kelvin", "kelvin-fragmentation")), name


def test_tied_best_keeps_float_noise_ties_and_every_row_without_a_finite_score() -> None:
    rows = np.array([4, 5, 6, 7], dtype=np.int64)
    assert tied_best(rows, np.array([1.0, 3.0, 3.0 - 1e-12, 2.0])).tolist() == [5, 6]
    assert tied_best(rows, np.array([-np.inf] * 4)).tolist() == [4, 5, 6, 7]
