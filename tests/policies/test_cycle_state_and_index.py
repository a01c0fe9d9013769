"""Typed cycle state (``CycleState``) and the per-snapshot index (``FleetArrays.derived``)."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_plugin.model import FleetArrays
from scheduler_plugin.model.snapshot import IndexKey
from scheduler_plugin.policies import Framework, PolicyConfig
from scheduler_plugin.policies.base import CycleContext, CycleState, MissingState, StateKey
from scheduler_plugin.policies.eligibility import LIMITS_KEY, STATIC_MASKS, GpuLimits, static_of
from scheduler_plugin.preemption.overlay import released_rows
from tests.fleet_helpers import NOW, dgx, fleet, gpu, node, pcie_box, request, shared, whole

# --- cycle state -----------------------------------------------------------------------------------------------------


def test_reading_a_missing_key_names_it_and_what_was_written() -> None:
    state = CycleState()
    state.write(LIMITS_KEY, GpuLimits())
    missing: StateKey[int] = StateKey("example.count")
    with pytest.raises(
        MissingState, match=r"cycle state has no 'example.count' \(written this cycle: kelvin.gpu_limits\)"
    ):
        state.read(missing)
    assert state.find(missing) is None
    assert missing not in state


def test_typed_entries_are_computed_once_per_cycle() -> None:
    key: StateKey[list[int]] = StateKey("example.list")
    calls: list[int] = []

    def make() -> list[int]:
        calls.append(1)
        return [len(calls)]

    state = CycleState()
    first = state.compute(key, make)
    assert state.compute(key, make) is first and state.read(key) is first
    assert calls == [1]
    assert state.setdefault(key, [99]) is first  # an entry already there is kept
    assert CycleState().find(key) is None  # a new cycle starts empty: nothing leaks between requests


def test_keys_of_one_name_are_distinct_entries() -> None:
    a: StateKey[int] = StateKey("same")
    b: StateKey[int] = StateKey("same")
    state = CycleState({a: 1})
    assert state.read(a) == 1 and state.find(b) is None


def test_framework_contexts_do_not_share_state() -> None:
    fw = Framework.from_config(PolicyConfig())
    f = fleet(dgx("a"))
    one, two = fw.context(f, NOW), fw.context(f, NOW)
    assert one.state is not two.state
    assert one.state.read(LIMITS_KEY) == fw.fit.limits


# --- the snapshot index --------------------------------------------------------------------------------------------


def _fleet() -> FleetArrays:
    hot = [gpu(i, temp=86.0) if i == 0 else gpu(i) for i in range(8)]
    return fleet(
        *(dgx(f"d{i}") for i in range(6)),
        *(pcie_box(f"p{i}", assignments=[shared("s", 0, milli=250)]) for i in range(4)),
        node("hot", hot),
        dgx("busy", assignments=[whole("w", 0, 1, 2, 3)]),
    )


PER_SNAPSHOT = ("thermal.quality", "noise.telemetry", "topology.fleet", "hotness.hot_gpus")


def test_index_is_built_once_per_published_snapshot_not_per_request() -> None:
    fw = Framework.from_config(PolicyConfig())
    f = _fleet()
    fw.warm(f)  # the snapshot cache publishes the snapshot
    warmed = dict(f.derived.computed)
    for name in PER_SNAPSHOT:
        assert warmed[name] == 1, name
    rows = np.arange(f.n_nodes, dtype=np.int64)
    reqs = [request(1, pod=f"a{i}") for i in range(10)] + [request(2, pod=f"b{i}") for i in range(5)]
    reqs += [request(1, share=250, pod=f"c{i}") for i in range(5)]
    for i, req in enumerate(reqs):
        ctx = fw.context(f, NOW)
        passed = fw.filter(req, f, rows, ctx).passed
        ints, _ = fw.prioritize(req, f, passed, ctx)
        row = int(passed[int(np.argmax(ints))])
        gpus = fw.pick(req, f, row, ctx)
        assert gpus
        fw.assume(f.names[row], req, gpus, NOW + i)  # the ledger overlay changes every cycle
    for name in PER_SNAPSHOT:
        assert f.derived.computed[name] == 1, name  # not once per request: 20 requests, one computation
    assert f.derived.computed["eligibility.static"] == 2  # once per shape: whole GPUs (any count), a 250 share
    assert f.derived.computed["eligibility.breaks_limits"] == 1
    again = _fleet()  # the next snapshot: its own index, computed afresh
    fw.warm(again)
    assert again.derived.computed["thermal.quality"] == 1 and f.derived.computed["thermal.quality"] == 1


def test_copies_keep_entries_and_a_replaced_column_recomputes() -> None:
    f = _fleet()
    key = IndexKey[float]("example.hottest", ("temp",))
    calls: list[FleetArrays] = []

    def hottest(x: FleetArrays) -> float:
        calls.append(x)
        return float(x.temp.max())

    assert f.derive(key, hottest) == 86.0
    work = f.copy()  # the simulator's working copy: same telemetry, no recomputation
    assert work.derive(key, hottest) == 86.0 and len(calls) == 1
    overlay = f.with_assumed({"d0": [whole("x", 0)]})  # the ledger overlay shares the telemetry columns
    assert overlay.derive(key, hottest) == 86.0 and len(calls) == 1
    cooler = f.temp.copy()
    cooler[cooler > 80] = 50.0
    work.temp = cooler  # a column replaced: the entry no longer holds
    assert work.derive(key, hottest) < 86.0 and len(calls) == 2
    assert f.derive(key, hottest) == 86.0  # the snapshot itself is untouched
    assert work.derived.computed["example.hottest"] == 1  # the copy counts its own


def test_a_fleet_of_other_rows_gets_an_index_of_its_own() -> None:
    f = _fleet()
    fw = Framework.from_config(PolicyConfig())
    fw.warm(f)
    z = np.zeros((2, f.max_gpus), dtype=np.int64)
    variant = released_rows(f, 0, z.astype(np.int32), z, z.astype(np.int32))  # preemption: built field by field
    fw.warm(variant)
    assert variant.derived is not f.derived
    assert variant.derived.computed["thermal.quality"] == 1
    assert f.derived.computed["thermal.quality"] == 1  # the snapshot's entries were not replaced


def test_request_shapes_cannot_grow_the_index_without_bound() -> None:
    f = _fleet()
    limits = GpuLimits()
    assert STATIC_MASKS.limit is not None
    for milli in range(1, 3 * STATIC_MASKS.limit):  # every request a new shape
        static_of(request(1, share=milli), f, limits)
    assert len(f.derived) <= STATIC_MASKS.limit
    assert f.derived.computed["eligibility.static"] == 3 * STATIC_MASKS.limit - 1


def test_cycle_context_is_typed_state_not_a_dict() -> None:
    ctx = CycleContext(now=NOW)
    assert not hasattr(ctx, "extras")
    assert isinstance(ctx.state, CycleState)


def test_a_pickled_fleet_starts_with_an_empty_index() -> None:
    import pickle

    f = _fleet()
    Framework.from_config(PolicyConfig()).warm(f)
    assert len(f.derived) > 0
    g = pickle.loads(pickle.dumps(f))  # the simulator's worker processes
    assert len(g.derived) == 0 and g.derived.rows is None


@pytest.mark.parametrize("replaced", ["temp", "slowdown", "throttle"])
def test_an_entry_over_several_columns_recomputes_when_any_one_is_replaced(replaced: str) -> None:
    f = _fleet()
    key = IndexKey[int]("example.three", ("temp", "slowdown", "throttle"))
    single = IndexKey[int]("example.one", (replaced,))
    none = IndexKey[int]("example.none", ())
    calls: list[str] = []

    def count(name: str) -> int:
        calls.append(name)
        return len(calls)

    assert f.derive(key, lambda _: count("three")) == 1
    assert f.derive(single, lambda _: count("one")) == 2
    assert f.derive(none, lambda _: count("none")) == 3
    assert f.derive(key, lambda _: count("three")) == 1  # same columns: served
    assert f.derive(single, lambda _: count("one")) == 2
    setattr(f, replaced, getattr(f, replaced).copy())  # same content, another array: recomputed
    assert f.derive(key, lambda _: count("three")) == 4
    assert f.derive(single, lambda _: count("one")) == 5
    assert f.derive(none, lambda _: count("none")) == 3  # reads no column: kept
    assert calls == ["three", "one", "none", "three", "one"]
