"""Scores on a fleet that tells no node from another (:mod:`scheduler_plugin.policies.thermal`'s one GPU quality,
:mod:`~scheduler_plugin.policies.noise`'s silent telemetry, :mod:`~scheduler_plugin.policies.topology`'s one link
level): each plugin then skips its per-row work and answers from whether the pod fits. The answer must be the general
computation's, bit for bit, on every row (fitting or not), for every shape; and a fleet where one GPU differs must
take the general path."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from scheduler_plugin.model import FleetArrays, GpuAssignment, GpuNode, GpuRequest
from scheduler_plugin.model.snapshot import SnapshotIndex
from scheduler_plugin.policies.base import CycleContext, FloatA
from scheduler_plugin.policies.eligibility import GpuLimits, eligible_gpus
from scheduler_plugin.policies.noise import NoiseArgs, NoiseScore
from scheduler_plugin.policies.policy_file import PolicyConfig
from scheduler_plugin.policies.thermal import ThermalArgs, ThermalScore
from scheduler_plugin.policies.topology import TopologyArgs, TopologyScore
from scheduler_plugin.policies.topology.plugin import FlatWiring, flat_wiring
from tests.fleet_helpers import dgx, fleet, gpu, node, request, shared, whole

SHAPES = [
    request(1),
    request(2),
    request(3),
    request(4),
    request(8),
    request(1, memory="20Gi"),
    request(1, share=300),
    request(1, share=900),
    request(1, models="H100"),
]


def random_nodes(seed: int, **kw: object) -> list[GpuNode]:
    """Nodes of 0, 1, 2, 4 or 8 GPUs (some H100), every GPU with the same telemetry ``kw``, partly taken by whole and
    shared pods."""
    rng = random.Random(seed)
    out = []
    for i in range(24):
        n = rng.choice([0, 1, 2, 4, 8, 8])
        model = rng.choice(["A100", "H100"])
        gpus = [gpu(j, model=model, **kw) for j in range(n)]  # type: ignore[arg-type]
        taken: list[GpuAssignment] = []
        for j in range(n):
            pick = rng.random()
            if pick < 0.25:
                taken.append(whole(f"w{i}-{j}", j))
            elif pick < 0.5:
                taken.append(shared(f"s{i}-{j}", j, milli=rng.choice([200, 500, 700]), mem_gib=rng.choice([8, 30])))
        out.append(node(f"n{i}", gpus, assignments=taken))
    return out


def fresh(f: FleetArrays) -> FleetArrays:
    return dataclasses.replace(f, derived=SnapshotIndex())


def rows_of(f: FleetArrays, seed: int) -> list[np.ndarray]:
    """Every row, a few rows and a random half: the memo's path, the few-row path and a subset of it."""
    rng = np.random.default_rng(seed)
    every = np.arange(f.n_nodes, dtype=np.int64)
    return [every, every[:2], np.sort(rng.choice(every, f.n_nodes // 2, replace=False))]


def same(a: FloatA, b: FloatA) -> bool:
    """Equal bit for bit, NaN where NaN."""
    return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))


def general(plugin: ThermalScore | TopologyScore, req: GpuRequest, f: FleetArrays, idx: np.ndarray) -> FloatA:
    elig = eligible_gpus(req, f, idx, GpuLimits())
    if isinstance(plugin, TopologyScore):
        return plugin._by_wiring(req, f, idx, elig)
    return plugin._raw(req, f, idx, elig)


# --- thermal --------------------------------------------------------------------------------------------------------


def rounding_temp() -> float:
    """A temperature whose quality ``q`` is not the mean of three ``q`` (``(q + q + q) / 3 != q``): the flat path must
    round a pod's mean as the general path does."""
    score = ThermalScore(ThermalArgs())
    for temp in np.arange(60.0, 86.0, 0.1).tolist():
        f = fleet(node("a", [gpu(0, temp=temp)]))
        q = float(f.derive(score._quality_key, score._quality_of)[0][0, 0])
        if float(np.full((1, 3), q).mean()) != q:
            return float(temp)
    raise AssertionError("no temperature between 60 and 86 °C rounds")


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("temp", [float("nan"), 50.0, rounding_temp(), 95.0])
def test_thermal_one_quality_scores_as_the_general_path(seed: int, temp: float) -> None:
    f = fleet(*random_nodes(seed, temp=temp))
    score = ThermalScore(ThermalArgs())
    assert f.derive(score._flat_key, score._flat_of) is not None
    for req in SHAPES:
        for idx in rows_of(f, seed):
            got = score.score(req, fresh(f), idx, CycleContext(now=0.0))
            assert same(got, general(score, req, f, idx)), (temp, req)


def test_thermal_one_gpu_warmer_takes_the_general_path() -> None:
    nodes = random_nodes(1, temp=50.0)
    hot = next(n for n in nodes if n.gpus)
    warmer = dataclasses.replace(hot.gpus[0], temperature_celsius=80.0)
    nodes[nodes.index(hot)] = dataclasses.replace(hot, gpus=(warmer, *hot.gpus[1:]))
    f = fleet(*nodes)
    score = ThermalScore(ThermalArgs())
    assert f.derive(score._flat_key, score._flat_of) is None
    every = np.arange(f.n_nodes, dtype=np.int64)
    got = score.score(request(1), fresh(f), every, CycleContext(now=0.0))
    assert same(got, general(score, request(1), f, every))
    assert len(set(got[np.isfinite(got)].tolist())) > 1


# --- noise ----------------------------------------------------------------------------------------------------------


def noise_general(score: NoiseScore, req: GpuRequest, f: FleetArrays, idx: np.ndarray) -> FloatA:
    fn = score._noise_of(f)
    if not req.shared:
        return score._node(f, idx, fn)
    return score._quietest(f, idx, fn, eligible_gpus(req, f, idx, GpuLimits()))


DEFAULT_NOISE = NoiseArgs(**PolicyConfig().scoring["noise"].args)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("args", [DEFAULT_NOISE, NoiseArgs()], ids=["default-policy", "crowding-weighed"])
def test_silent_telemetry_scores_as_the_general_path(seed: int, args: NoiseArgs) -> None:
    f = fleet(*random_nodes(seed))
    score = NoiseScore(args)
    fn = f.derive(score._noise_key, score._noise_of)
    assert fn.silent
    # crowding weighed and tenants on the fleet: not quiet (the tenants count), still the same answers
    assert score._quiet(f, fn) is (args.tenants_weight == 0)
    for req in [*SHAPES, request(1, share=300)]:
        for idx in rows_of(f, seed):
            got = score.score(req, fresh(f), idx, CycleContext(now=0.0))
            assert same(got, noise_general(score, req, f, idx)), req


@pytest.mark.parametrize("reading", [{"util": 0.4}, {"mem_util": 0.1}, {"used_gib": 3.0}, {"xid": 1}])
def test_one_gpu_reporting_load_or_errors_is_not_silent(reading: dict[str, float]) -> None:
    nodes = random_nodes(2)
    busy = next(n for n in nodes if n.gpus)
    loud = gpu(0, model=busy.gpus[0].model, **reading)  # type: ignore[arg-type]
    nodes[nodes.index(busy)] = dataclasses.replace(busy, gpus=(loud, *busy.gpus[1:]))
    f = fleet(*nodes)
    score = NoiseScore(DEFAULT_NOISE)
    assert not f.derive(score._noise_key, score._noise_of).silent
    for req in (request(1), request(1, share=300)):
        every = np.arange(f.n_nodes, dtype=np.int64)
        got = score.score(req, fresh(f), every, CycleContext(now=0.0))
        assert same(got, noise_general(score, req, f, every))


# --- topology -------------------------------------------------------------------------------------------------------


def topology_flat(f: FleetArrays, score: TopologyScore) -> dict[int, float | None]:
    flat = f.derive(score._flat_key, score._flat_of)
    return {k: flat.value(k) for k in (1, 2, 4, 8)}


@pytest.mark.parametrize("seed", range(4))
def test_one_link_level_scores_as_the_general_path(seed: int) -> None:
    f = fleet(*random_nodes(seed))  # no wiring reported: every pair on NUMA node 0
    score = TopologyScore(TopologyArgs())
    assert topology_flat(f, score) == {1: 1.0, 2: 0.3, 4: 0.3, 8: 0.3}
    for req in SHAPES:
        for idx in rows_of(f, seed):
            got = score.score(req, fresh(f), idx, CycleContext(now=0.0))
            assert same(got, general(score, req, f, idx)), req


def test_nvlink_and_numa_nodes_together_are_flat_for_one_gpu_only() -> None:
    """An NVSwitch box and a box without wiring: one GPU taken costs no connectivity on either, but 4 GPUs are
    worth more on the first."""
    f = fleet(*random_nodes(5)[:6], dgx("x", 8), dgx("y", 4, assignments=[whole("z", 0)]))
    score = TopologyScore(TopologyArgs())
    assert topology_flat(f, score) == {1: 1.0, 2: None, 4: None, 8: None}
    every = np.arange(f.n_nodes, dtype=np.int64)
    for req in SHAPES:
        got = score.score(req, fresh(f), every, CycleContext(now=0.0))
        assert same(got, general(score, req, f, every)), req


def test_numa_split_is_not_flat() -> None:
    two_numa = [gpu(j, numa=j // 4) for j in range(8)]
    f = fleet(node("a", two_numa, assignments=[whole("w", 5)]), node("b", [gpu(j) for j in range(8)]))
    score = TopologyScore(TopologyArgs())
    assert topology_flat(f, score) == {1: None, 2: None, 4: None, 8: None}
    every = np.arange(f.n_nodes, dtype=np.int64)
    for req in SHAPES:
        got = score.score(req, fresh(f), every, CycleContext(now=0.0))
        assert same(got, general(score, req, f, every)), req


def test_an_empty_fleet_is_scored_empty() -> None:
    f = fleet()
    idx = np.zeros(0, dtype=np.int64)
    for plugin in (ThermalScore(ThermalArgs()), NoiseScore(DEFAULT_NOISE), TopologyScore(TopologyArgs())):
        assert plugin.score(request(1), f, idx, CycleContext(now=0.0)).shape == (0,)


def test_tables_without_a_pattern_per_row_or_with_unknown_slots_are_never_flat() -> None:
    f = fleet(*random_nodes(3))
    score = TopologyScore(TopologyArgs())
    ft = score.tables.for_fleet(f)
    assert flat_wiring(ft).single
    unknown = dataclasses.replace(ft.patterns[0], present=None)
    assert flat_wiring(dataclasses.replace(ft, patterns=[unknown, *ft.patterns[1:]])) == FlatWiring(False, {})
    assert flat_wiring(dataclasses.replace(ft, patterns=ft.patterns[1:])) == FlatWiring(False, {})
