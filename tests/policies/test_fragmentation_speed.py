"""The fragmentation score's speed paths compute what the plain definitions compute, bit for bit: the per-threshold
sums of :meth:`ShapeGroups.fit_mass`, the grouping of a workload of known shapes, and the scarcity index and F memo
served from the cycle's one row-stamps comparison."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scheduler_plugin.model import GIB, GpuInfo, GpuNode, GpuRequest, build_arrays
from scheduler_plugin.policies import fragmentation
from scheduler_plugin.policies.base import CycleContext, CycleState
from scheduler_plugin.policies.fragmentation import WORKLOAD_KEY, FragmentationPolicy, PodShape, Workload
from scheduler_plugin.policies.fragmentation import row_stamps as stamps_module
from scheduler_plugin.policies.fragmentation import shape_groups as groups_module
from scheduler_plugin.policies.fragmentation.gradient import free_stats
from scheduler_plugin.policies.fragmentation.scarcity import FLEET_USABLE
from scheduler_plugin.policies.fragmentation.shape_groups import ShapeGroups, shape_groups
from scheduler_plugin.simulator.fleet import apply_placement


def _workload(rng: np.random.Generator, shapes: int, probs: np.random.Generator | None = None) -> Workload:
    """Many shapes of few shares (several per threshold), a third pinned to a model; ``probs`` draws the
    probabilities (the same shapes in the same order, by frequency, with another mix)."""
    p = rng if probs is None else probs
    counts: dict[PodShape, float] = {}
    for i in range(shapes):
        models = (None, frozenset({"A100"}), frozenset({"A100", "V100"}))[i % 3]
        share = (1000, 500, 250, 125)[i % 4]
        counts[PodShape(500 * (1 + i % 5), share, 1 + (i % 8 == 0) if share == 1000 else 1, models)] = float(
            shapes - i + 0.5 * p.random()
        )
    return Workload.from_counts(counts, coverage=1.0)


def _fleet(seed: int, nodes: int = 40) -> Any:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(nodes):
        model = ("A100", "V100")[i % 2]
        infos = tuple(GpuInfo(index=j, uuid=f"n{i}-{j}", model=model, memory_total_bytes=40 * GIB) for j in range(8))
        out.append(GpuNode(f"n{i}", infos, cpu_allocatable_milli=64_000, memory_allocatable_bytes=256 * GIB))
    fleet = build_arrays(out)
    fleet.free_milli[:] = rng.integers(0, 9, size=fleet.free_milli.shape) * 125
    fleet.cpu_free[:] = rng.integers(0, 64_001, size=fleet.n_nodes)
    return fleet


def _in_order_reference(groups: ShapeGroups, gpus_at_least: Any, cpu: Any, mass: Any, mem: Any) -> Any:
    """fit_mass as it was: one ``np.add.reduce`` over each threshold's groups (accumulate for a single row)."""
    ok = cpu[None, :] >= groups.cpu_milli[:, None]
    ok &= gpus_at_least.T[groups.threshold] >= groups.count[:, None]
    if mem is not None:
        ok &= mem[None, :] >= groups.host_memory[:, None]
    vals = np.where(ok, groups.prob if mass is None else mass.T, 0.0)
    out = np.empty((len(cpu), len(groups.bounds) - 1), dtype=np.float64)
    for t in range(len(groups.bounds) - 1):
        block = vals[groups.bounds[t] : groups.bounds[t + 1]]
        if block.shape[1] > 1 or len(block) == 0:
            out[:, t] = np.add.reduce(block, axis=0)
        else:
            out[:, t] = np.add.accumulate(block, axis=0)[-1]
    return out


@pytest.mark.parametrize("rows", [1, 2, 40, 200])
def test_fit_mass_adds_each_thresholds_groups_in_order_bit_for_bit(rows: int) -> None:
    rng = np.random.default_rng(rows)
    for trial in range(20):
        w = _workload(rng, int(rng.integers(1, 30)))
        fleet = _fleet(trial, nodes=max(40, rows))
        sel = np.sort(rng.choice(fleet.n_nodes, size=rows, replace=False))
        st = free_stats(fleet.free_milli[sel], w)
        groups = shape_groups(w)
        mass = groups.node_mass(w, fleet)[sel] if groups.restricted else None
        mem = fleet.mem_free_host[sel]
        got = groups.fit_mass(st.gpus_at_least, fleet.cpu_free[sel], mass, mem)
        want = _in_order_reference(groups, st.gpus_at_least, fleet.cpu_free[sel], mass, mem)
        assert got.flags.c_contiguous
        assert got.tobytes() == want.tobytes()


def test_a_workload_of_known_shapes_is_grouped_like_the_first_without_regrouping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The extender's learned workload is a new object with every pod, of the same shapes: grouped once."""
    first = _workload(np.random.default_rng(3), 18)
    again = _workload(np.random.default_rng(3), 18, probs=np.random.default_rng(9))  # same shapes, another mix
    assert first.prob.tolist() != again.prob.tolist()
    groups_module._STRUCTURES.clear()
    built: list[Workload] = []
    of = ShapeGroups.of.__func__  # type: ignore[attr-defined]

    def counted(cls: type[ShapeGroups], w: Workload) -> ShapeGroups:
        built.append(w)
        return of(cls, w)  # type: ignore[no-any-return]

    monkeypatch.setattr(ShapeGroups, "of", classmethod(counted))
    a, b = shape_groups(first), shape_groups(again)
    assert built == [first]
    want = of(ShapeGroups, again)
    for name in ("bounds", "threshold", "cpu_milli", "count", "host_memory", "of_shape", "pad"):
        assert getattr(b, name).tolist() == getattr(want, name).tolist(), name
    assert [m.tolist() for m in b.members] == [m.tolist() for m in want.members]
    assert b.prob.tobytes() == want.prob.tobytes() and b.prob.tobytes() != a.prob.tobytes()
    fleet = _fleet(1)
    assert b.node_mass(again, fleet).tobytes() == want.node_mass(again, fleet).tobytes()
    other = _workload(np.random.default_rng(4), 17)  # other shapes: grouped afresh
    shape_groups(other)
    assert built == [first, other]


def test_a_kelvin_cycle_compares_the_fleets_rows_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Score and pick of one cycle read the fleet's row stamps once (the scarcity index, the F memo, the fleet's free
    totals and the score memo share them) and the scarcity index keeps no copies of the capacity columns; the scores
    equal those of a policy scoring the fleet afresh."""
    fleet = _fleet(2)
    w = _workload(np.random.default_rng(5), 12)
    kept = FragmentationPolicy.create(fragmentation.FragmentationArgs())
    compares: list[int] = []
    real = stamps_module.changed_rows

    def counted(*pairs: Any) -> Any:
        compares.append(1)
        return real(*pairs)

    monkeypatch.setattr(stamps_module, "changed_rows", counted)
    rows = np.arange(fleet.n_nodes)
    rng = np.random.default_rng(6)
    for i in range(8):
        req = GpuRequest(count=1, milli=(1000, 500, 250)[i % 3], cpu_milli=2000, pod_key=f"ns/p{i}")
        ctx = CycleContext(now=0.0, state=CycleState({WORKLOAD_KEY: w}))
        compares.clear()
        got = kept.score(req, fleet, rows, ctx)
        row = int(np.argmax(got))
        gpus = kept.pick(req, fleet, row, ctx)
        assert len(compares) <= 1
        fresh = FragmentationPolicy.create(fragmentation.FragmentationArgs())
        fresh_ctx = CycleContext(now=0.0, state=CycleState({WORKLOAD_KEY: w}))
        assert got.tolist() == fresh.score(req, fleet.copy(), rows, fresh_ctx).tolist()
        assert gpus is not None
        apply_placement(fleet, req, row, gpus)
        fleet.cpu_free[int(rng.integers(fleet.n_nodes))] -= 100  # another node written too
    usable = fleet.derive(FLEET_USABLE, lambda _: None)
    assert usable is not None and not hasattr(usable._memo, "free")
