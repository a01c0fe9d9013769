"""The row stamps' hints (:class:`~scheduler_plugin.policies.fragmentation.row_stamps.RowStamps` comparing only the
rows a sealed ledger overlay names) find exactly the rows a whole-column compare finds: over a random run of binds,
forgets, expiries, rebuilt overlays, host-column writes and calls on the (writable) snapshot itself, the rows whose
stamp moved are the same for a holder fed the real overlays and for one fed writable copies of them (no hint: compared
whole)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from scheduler_plugin.model import GIB, FleetArrays, GpuAssignment
from scheduler_plugin.model.snapshot import LINEAGE_COLUMNS, sealed
from scheduler_plugin.policies.fragmentation.row_stamps import CAPACITY, RowStamps
from tests.fleet_helpers import dgx, fleet, shared, whole

N_NODES = 12


def _writable_copy(f: FleetArrays) -> FleetArrays:
    """The same content in columns nobody sealed: a holder fed this compares the columns whole."""
    out = dataclasses.replace(f, lineage=None)
    for name in CAPACITY:
        setattr(out, name, getattr(f, name).copy())
    return out


def _moved(before: np.ndarray, after: np.ndarray) -> list[int]:
    return np.flatnonzero(before != after).tolist()


def test_an_overlay_is_sealed_and_names_the_rows_it_recharged() -> None:
    base = fleet(*(dgx(f"n{i}", 4) for i in range(3)))
    first = base.with_assumed({"n0": [whole("a", 0)]})
    assert all(sealed(getattr(first, c)) for c in LINEAGE_COLUMNS) and first.lineage is None
    with pytest.raises(ValueError, match="read-only"):
        first.free_milli[0, 0] = 0
    second = first.with_assumed_on(base, {"n0": [whole("a", 0)], "n2": [whole("b", 1)]}, ["n2", "n2"])
    assert second.lineage is not None
    assert all(a is getattr(first, c) for a, c in zip(second.lineage.parent, LINEAGE_COLUMNS, strict=True))
    assert all(a is getattr(second, c) for a, c in zip(second.lineage.own, LINEAGE_COLUMNS, strict=True))
    assert second.lineage.rows.tolist() == [2]
    assert base.with_assumed_on(base, {"n1": [whole("c", 0)]}, ["n1"]).lineage is None  # parent writable: no hint


@pytest.mark.parametrize("seed", range(8))
def test_hinted_stamps_move_for_the_same_rows_as_a_whole_compare(seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = fleet(*(dgx(f"n{i}", 8, assignments=[whole(f"old{i}", 0)] if i % 3 == 0 else []) for i in range(N_NODES)))
    names = list(base.names)
    assumed: dict[str, list[GpuAssignment]] = {}
    hinted, whole_compare = RowStamps(), RowStamps()
    current = base.with_assumed({})  # no claims yet: the base itself
    prev_h = hinted.stamps(current)
    prev_w = whole_compare.stamps(_writable_copy(current))
    hinted_steps = 0
    for step in range(300):
        op = rng.choice(["bind", "bind", "forget", "expire", "rebuild", "base", "host", "same"])
        touched: list[str] = []
        if op == "bind":
            node = str(rng.choice(names))
            gpu_index = int(rng.integers(0, 8))
            kind = rng.random()
            if kind < 0.4:
                claim = shared(f"p{step}", gpu_index, milli=int(rng.choice([100, 250, 500])))
            elif kind < 0.8:
                claim = whole(f"p{step}", gpu_index)
            else:  # a memory pool without a compute share
                claim = GpuAssignment(pod_key=f"default/p{step}", gpu_indices=(gpu_index,), memory_bytes=GIB)
            assumed.setdefault(node, []).append(claim)
            touched = [node]
        elif op == "forget" and any(assumed.values()):
            node = str(rng.choice(sorted(n for n, e in assumed.items() if e)))
            assumed[node].pop(int(rng.integers(0, len(assumed[node]))))
            touched = [node]
        elif op == "expire" and assumed:
            touched = [str(n) for n in rng.choice(sorted(assumed), size=min(3, len(assumed)), replace=False)]
            for node in touched:
                assumed[node] = []
            touched.append(str(rng.choice(names)))  # a node named but unchanged: its rows compare equal
        elif op == "host":  # the host columns, shared by the overlays with the snapshot, written in place
            base.cpu_free[int(rng.integers(0, N_NODES))] -= 100
        if op == "rebuild":
            current = base.with_assumed({n: e for n, e in assumed.items() if e})
        elif op == "base":
            current = base  # the snapshot itself (writable): no hint, and the next overlay's parent is unsealed
        elif op not in ("same", "host"):
            current = current.with_assumed_on(base, assumed, touched)
        hinted_steps += current.lineage is not None
        now_h = hinted.stamps(current)
        now_w = whole_compare.stamps(_writable_copy(current))
        assert _moved(prev_h, now_h) == _moved(prev_w, now_w), (step, op, touched)
        prev_h, prev_w = now_h, now_w
    assert hinted_steps > 50  # the hint was exercised, not only the whole compare
