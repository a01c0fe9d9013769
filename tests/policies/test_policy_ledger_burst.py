"""The assumed-allocation ledger (TTL, forget, reconcile, threads) and the burst score that reads it."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import replace

import numpy as np
import pytest

from scheduler_plugin.model import GpuAssignment, GpuProcess, Snapshot
from scheduler_plugin.policies.base import PLACEMENT_LOG, CycleContext, CycleState
from scheduler_plugin.policies.burst import PLACEMENTS_KEY, BurstArgs, BurstScore, burst_load
from scheduler_plugin.policies.ledger import AssumedLedger
from tests.fleet_helpers import NOW, dgx, fleet, gpu, node, request


def a(pod: str, *gpus: int, uid: str | None = None) -> GpuAssignment:
    return GpuAssignment(pod_key=f"default/{pod}", gpu_indices=gpus, pod_uid=uid)


def test_entries_expire_after_ttl() -> None:
    led = AssumedLedger(ttl_s=10)
    led.assume("n1", a("p1", 0), NOW)
    led.assume("n1", a("p2", 1), NOW + 5)
    led.assume("n2", a("p3", 0), NOW + 6)
    assert {k: [x.pod_key for x in v] for k, v in led.entries(NOW + 9).items()} == {
        "n1": ["default/p1", "default/p2"],
        "n2": ["default/p3"],
    }
    assert {k: len(v) for k, v in led.entries(NOW + 10).items()} == {"n1": 1, "n2": 1}
    assert led.entries(NOW + 16) == {}
    assert len(led) == 0


def test_reads_are_kept_until_the_ledger_changes() -> None:
    """A read while nothing changed is the same object (no walk over every entry); a bind, a forget, a reconcile,
    an expiry and a window that moved past a placement each give a new, correct answer."""
    led = AssumedLedger(ttl_s=10)
    led.assume("n1", a("p1", 0), NOW)
    led.assume("n2", a("p2", 1), NOW + 4)
    first = led.entries(NOW + 5)
    assert led.entries(NOW + 6) is first
    win = led.placements(NOW + 5, 10)
    assert win == {"n1": [NOW], "n2": [NOW + 4]}
    assert led.placements(NOW + 6, 10) is win
    assert led.placements(NOW + 5, 3) == {"n2": [NOW + 4]}  # a shorter window: not the cached answer
    assert led.placements(NOW + 8, 3) == {}  # the window moved past the last placement
    version = led.version
    led.assume("n1", a("p3", 2), NOW + 7)
    assert first == {"n1": [a("p1", 0)], "n2": [a("p2", 1)]}  # what a reader holds is never changed
    assert led.version > version
    assert {k: [x.pod_key for x in v] for k, v in led.entries(NOW + 7).items()} == {
        "n1": ["default/p1", "default/p3"],
        "n2": ["default/p2"],
    }
    assert led.placements(NOW + 7, 10) == {"n1": [NOW, NOW + 7], "n2": [NOW + 4]}
    assert {k: [x.pod_key for x in v] for k, v in led.entries(NOW + 10).items()} == {  # p1 reached the TTL
        "n1": ["default/p3"],
        "n2": ["default/p2"],
    }
    assert led.placements(NOW + 10, 10) == {"n1": [NOW + 7], "n2": [NOW + 4]}
    led.forget("default/p2")
    assert {k: len(v) for k, v in led.entries(NOW + 10).items()} == {"n1": 1}
    assert led.placements(NOW + 10, 10) == {"n1": [NOW + 7]}
    assert led.reconcile(Snapshot((dgx("n1", assignments=[a("p3", 2)]),), NOW)) == 1
    assert led.entries(NOW + 10) == {}


def test_reassume_elsewhere_keeps_the_order_assumed() -> None:
    """A pod assumed again on another node takes its first place among that node's entries, as before; the views
    handed out before stay as they were."""
    led = AssumedLedger(ttl_s=30)
    led.assume("n1", a("p1", 0), NOW)
    led.assume("n2", a("p2", 0), NOW + 1)
    before = led.entries(NOW + 2)
    led.assume("n2", a("p1", 1), NOW + 2)
    assert {k: [x.pod_key for x in v] for k, v in led.entries(NOW + 2).items()} == {"n2": ["default/p1", "default/p2"]}
    assert led.placements(NOW + 2, 30) == {"n2": [NOW + 1, NOW + 2]}
    assert {k: [x.pod_key for x in v] for k, v in before.items()} == {"n1": ["default/p1"], "n2": ["default/p2"]}
    led.assume("n2", a("p2", 3), NOW + 3)  # again on the same node: same place, new GPUs
    assert [x.gpu_indices for x in led.entries(NOW + 3)["n2"]] == [(1,), (3,)]


def test_placements_after_the_clock_stepped_back() -> None:
    """Placements out of time order (the clock stepped back) are still windowed by their own times."""
    led = AssumedLedger(ttl_s=30)
    led.assume("n1", a("p1", 0), NOW + 5)
    led.assume("n2", a("p2", 0), NOW)
    led.assume("n3", a("p3", 0), NOW + 6)
    assert led.placements(NOW + 8, 4) == {"n1": [NOW + 5], "n3": [NOW + 6]}
    assert led.placements(NOW + 9, 4) == {"n3": [NOW + 6]}
    assert led.placements(NOW + 9, 10) == {"n1": [NOW + 5], "n2": [NOW], "n3": [NOW + 6]}
    # the TTL window: p2's placement is older than the TTL though the first one of the history is not
    assert led.placements(NOW + 31, 30) == {"n1": [NOW + 5], "n3": [NOW + 6]}


def test_reassume_replaces_and_forget_drops() -> None:
    led = AssumedLedger(ttl_s=30)
    led.assume("n1", a("p1", 0), NOW)
    led.assume("n2", a("p1", 3), NOW + 1)
    assert {k: [x.gpu_indices for x in v] for k, v in led.entries(NOW + 2).items()} == {"n2": [(3,)]}
    assert led.placements(NOW + 2, 30) == {"n2": [NOW + 1]}
    assert led.forget("default/p1") is True
    assert led.forget("default/p1") is False
    assert led.entries(NOW + 2) == {}
    assert led.placements(NOW + 2, 30) == {}


def test_forget_of_an_attempt_leaves_a_retrys_entry() -> None:
    """A first bind attempt that fails late must not release the GPUs its retry has assumed since."""
    led = AssumedLedger(ttl_s=30)
    first, retry = a("p1", 0), a("p1", 2)
    led.assume("n1", first, NOW)
    led.assume("n2", retry, NOW + 1)
    assert led.forget("default/p1", first) is False
    assert {k: [x.gpu_indices for x in v] for k, v in led.entries(NOW + 2).items()} == {"n2": [(2,)]}
    assert led.forget("default/p1", a("p1", 2)) is False  # equal, but not the entry this attempt added
    assert led.forget("default/p1", retry) is True
    assert led.entries(NOW + 2) == {}


def test_reconcile_drops_what_telemetry_shows() -> None:
    led = AssumedLedger(ttl_s=30)
    led.assume("n1", a("recorded", 0), NOW)
    led.assume("n1", a("running", 1, uid="uid-run"), NOW)
    led.assume("n1", a("unseen", 2, uid="uid-unseen"), NOW)
    led.assume("gone", a("elsewhere", 0), NOW)
    snap = Snapshot(
        nodes=(
            node(
                "n1",
                [gpu(0), gpu(1, processes=[GpuProcess(pid=7, used_bytes=2**30, pod_uid="uid-run")]), gpu(2)],
                assignments=[a("recorded", 0)],
            ),
        ),
        taken_at=NOW,
    )
    assert led.reconcile(snap) == 2
    assert sorted(x.pod_key for v in led.entries(NOW + 1).values() for x in v) == [
        "default/elsewhere",
        "default/unseen",
    ]
    # the burst history keeps all four until the TTL
    assert sum(len(v) for v in led.placements(NOW + 1, 30).values()) == 4


def test_overlay_uses_capacity() -> None:
    led = AssumedLedger(ttl_s=30)
    f = fleet(dgx("n1"))
    led.assume("n1", a("p", 0, 1), NOW)
    view = f.with_assumed(led.entries(NOW))
    assert view.free_milli[0, :3].tolist() == [0, 0, 1000]
    assert f.free_milli[0, :3].tolist() == [1000, 1000, 1000]


def test_thread_safety() -> None:
    led = AssumedLedger(ttl_s=1000)

    def work(t: int) -> None:
        for i in range(200):
            led.assume(f"n{i % 7}", a(f"t{t}-{i}", i % 8), NOW + i)
            led.entries(NOW + i)
            if i % 3 == 0:
                led.forget(f"default/t{t}-{i}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert len(led) == 4 * (200 - 67)


def test_bad_ttl() -> None:
    with pytest.raises(ValueError, match="ttl_s must be > 0"):
        AssumedLedger(ttl_s=0)


@pytest.mark.parametrize(
    ("times", "expect"),
    [
        ([], 1.0),
        ([NOW], 0.75),  # one placement just now: load 1 of 4
        ([NOW, NOW, NOW, NOW], 0.0),
        ([NOW - 5], round(1 - 0.5 / 4, 4)),  # half faded
        ([NOW - 10, NOW - 20], 1.0),  # outside the window
        ([NOW] * 9, 0.0),
    ],
)
def test_burst_score(times: list[float], expect: float) -> None:
    f = fleet(dgx("a"), dgx("b"))
    ctx = CycleContext(now=NOW, state=CycleState({PLACEMENTS_KEY: {"a": times, "unknown": [NOW]}}))
    s = BurstScore(BurstArgs()).score(request(1), f, np.array([0, 1]), ctx)
    assert [round(x, 4) for x in s.tolist()] == [expect, 1.0]


def test_burst_without_ledger_is_neutral() -> None:
    f = fleet(dgx("a"))
    assert BurstScore(BurstArgs()).score(request(1), f, np.array([0]), CycleContext(now=NOW)).tolist() == [1.0]
    assert burst_load(None, NOW, 10) == {}


def test_burst_explain() -> None:
    f = fleet(dgx("a"))
    ctx = CycleContext(now=NOW, state=CycleState({PLACEMENTS_KEY: {"a": [NOW - 1, NOW - 2, NOW - 30]}}))
    assert BurstScore(BurstArgs()).explain(request(1), f, 0, ctx) == [
        "2 pods placed here in the last 10 s (fading load 1.70 of 4)"
    ]


def test_burst_load_per_row_is_burst_load_to_the_bit() -> None:
    """The score reads every node's load in numpy: the very floats :func:`burst_load` sums, placement by placement
    (fractional ages, placements after now, nodes outside the fleet, empty lists)."""
    names = [f"n{i}" for i in range(6)]
    f = fleet(*(dgx(n) for n in names))
    rng = np.random.default_rng(7)
    score = BurstScore(BurstArgs(window_seconds=7.3))
    for _ in range(50):
        placements = {
            n: (NOW - rng.uniform(-0.5, 9.0, size=int(rng.integers(0, 9)))).tolist()
            for n in [*rng.choice(names, size=4, replace=False).tolist(), "not-in-fleet"]
        }
        ctx = CycleContext(now=NOW, state=CycleState({PLACEMENTS_KEY: placements}))
        want = np.zeros(len(names))
        for name, w in burst_load(placements, NOW, 7.3).items():
            if name in f.index:
                want[f.index[name]] = w
        got = score._per_row(f, ctx)
        assert got.tobytes() == want.tobytes()


def test_history_views_match_a_rebuild_after_any_changes() -> None:
    """Assuming a new pod appends its placement without reading the history: after any mix of binds, re-binds,
    forgets and expiries the per-node times, the oldest placement and the keys are what a rebuild reads off it."""
    rng = np.random.default_rng(3)
    led = AssumedLedger(ttl_s=5)
    t = NOW
    for _ in range(400):
        t += float(rng.uniform(0, 0.3)) if rng.uniform() > 0.03 else -float(rng.uniform(0, 3))  # now and then back
        op = rng.integers(0, 10)
        key = f"p{int(rng.integers(0, 40))}"
        node = f"n{int(rng.integers(0, 6))}"
        if op < 7:
            led.assume(node, a(key, 0), t)
        elif op < 9:
            led.forget(f"default/{key}")
        else:
            led.entries(t)
        led.placements(t, led.ttl_s)  # expires first
        read = dict(led._times)  # the whole history's, as kept node by node (a window may cut it after a step back)
        times: dict[str, list[float]] = {}
        for h in led._history:
            times.setdefault(h.node, []).append(h.at)
        assert read == times
        assert led._history_oldest == min((h.at for h in led._history), default=float("inf"))
        assert led._history_keys == {h.assignment.pod_key for h in led._history}
        log = led.placement_log(t)
        assert list(zip(log.nodes[: log.size], log.times[: log.size], strict=True)) == [
            (h.node, h.at) for h in led._history
        ]
        assert not log.ordered or all(x <= y for x, y in itertools.pairwise(log.times[: log.size]))


NODES = [f"n{i}" for i in range(8)]
"""Node names of the randomized burst tests (the last one not in their fleets)."""


def _ledger_and_burst(ttl_s: float, window_s: float) -> tuple[AssumedLedger, BurstScore]:
    return AssumedLedger(ttl_s=ttl_s), BurstScore(BurstArgs(window_seconds=window_s))


def test_burst_reads_the_log_to_the_bit_of_the_per_node_lists() -> None:
    """The burst score reads the ledger's placement log (the last window's placements only) or, without one, the
    per-node lists: the same floats, whatever the binds, forgets, expiries and clock steps back did to the ledger."""
    names = NODES
    f = fleet(*(dgx(n) for n in names[:7]))  # n7: not in the fleet
    rng = np.random.default_rng(11)
    led, score = _ledger_and_burst(ttl_s=30, window_s=4.7)
    t = NOW
    checked_ordered = checked_unordered = 0
    for _ in range(300):
        t += float(rng.uniform(0, 0.2)) if rng.uniform() > 0.02 else -float(rng.uniform(0, 5))
        key = f"p{int(rng.integers(0, 200))}"
        if rng.uniform() < 0.9:
            led.assume(str(rng.choice(names)), a(key, 0), t)
        else:
            led.forget(f"default/{key}")
        log = led.placement_log(t)
        by_node = CycleContext(now=t, state=CycleState({PLACEMENTS_KEY: led.placements(t, led.ttl_s)}))
        by_log = CycleContext(now=t, state=CycleState({PLACEMENT_LOG: log}))
        assert score._per_row(f, by_log).tobytes() == score._per_row(f, by_node).tobytes()
        checked_ordered += log.ordered
        checked_unordered += not log.ordered
    assert checked_ordered and checked_unordered  # both ways of cutting the window were read


def test_entries_since_names_every_node_whose_list_changed() -> None:
    """The nodes :meth:`entries_since` names cover every node whose list is not the very object it was at the
    earlier version; a version further back than the change log answers None."""
    rng = np.random.default_rng(5)
    led = AssumedLedger(ttl_s=3)
    t = NOW
    marks: list[tuple[int, dict[str, list[GpuAssignment]]]] = []
    for _ in range(300):
        t += float(rng.uniform(0, 0.2))
        key = f"p{int(rng.integers(0, 30))}"
        node = f"n{int(rng.integers(0, 5))}"
        if rng.uniform() < 0.8:
            led.assume(node, a(key, int(rng.integers(0, 8))), t)
        else:
            led.forget(f"default/{key}")
        entries, version, _ = led.entries_since(t, 0)
        marks.append((version, dict(entries)))
        for old_version, old in marks[-20:]:
            now_entries, now_version, changed = led.entries_since(t, old_version)
            assert now_version == version and now_entries is entries
            assert changed is not None
            for n in old.keys() | now_entries.keys():
                if n not in changed:
                    assert now_entries.get(n) is old.get(n), n
    assert led.entries_since(t, led.version)[2] == set()
    assert led.entries_since(t, -1)[2] is None  # not a version of this ledger
    small = AssumedLedger(ttl_s=30)
    small.CHANGE_LOG = 4  # type: ignore[misc]
    small._changes = deque(maxlen=4)
    for i in range(6):
        small.assume(f"n{i}", a(f"q{i}", 0), NOW)
    assert small.entries_since(NOW, small.version - 2)[2] == {"n5"}  # two changes: the entry, the history
    assert small.entries_since(NOW, 1)[2] is None  # the log no longer reaches back that far


def test_a_reassumed_pod_expires_from_its_last_bind() -> None:
    """The TTL counts from a pod's last bind: the expiry of its first one leaves the re-bound entry in place, and a
    forgotten then re-bound pod is not dropped by its first bind's time either."""
    led = AssumedLedger(ttl_s=10)
    led.assume("n1", a("p1", 0), NOW)
    led.assume("n2", a("p1", 1), NOW + 8)
    led.assume("n1", a("p2", 0), NOW + 1)
    led.forget("default/p2")
    led.assume("n1", a("p2", 2), NOW + 9)
    assert {k: [x.pod_key for x in v] for k, v in led.entries(NOW + 11).items()} == {
        "n2": ["default/p1"],
        "n1": ["default/p2"],
    }
    assert led.entries(NOW + 19) == {}


class _CountingIndex(dict[str, int]):
    """A fleet index that counts its lookups by ``get`` (what the burst window's row lookup calls)."""

    gets = 0

    def get(self, key: str, default: int | None = None) -> int | None:  # type: ignore[override]
        type(self).gets += 1
        return super().get(key, default)


def test_burst_looks_up_each_placement_once_and_follows_a_new_snapshot() -> None:
    """The burst window keeps its placements' rows from one cycle to the next (the log's numbering): a cycle looks
    up only the placements made since the last one, across the TTL's trims of the log; a new snapshot (another
    index, rows in another order) and a rebuilt history (a forget: a new epoch) are looked up afresh. Every cycle's
    loads are the bits a score without kept rows computes."""
    first = fleet(*(dgx(n) for n in NODES[:7]))  # n7: not in the fleet
    second = fleet(*(dgx(n) for n in reversed(NODES[1:])))  # n0 gone, the others in another order
    fleets = [replace(f, index=_CountingIndex(f.index)) for f in (first, second)]
    rng = np.random.default_rng(3)
    led, score = _ledger_and_burst(ttl_s=6, window_s=2.5)
    t = NOW
    kept_lookups = fresh_lookups = 0
    for step in range(400):
        f = fleets[step // 200]
        t += float(rng.uniform(0, 0.1))
        if step % 97 == 50:
            led.forget("default/p10")  # a rebuilt history: a new epoch
        led.assume(str(rng.choice(NODES)), a(f"p{step}", 0), t)
        ctx = CycleContext(now=t, state=CycleState({PLACEMENT_LOG: led.placement_log(t)}))
        before = _CountingIndex.gets
        kept = score._per_row(f, ctx)
        middle = _CountingIndex.gets
        fresh = BurstScore(BurstArgs(window_seconds=2.5))._per_row(f, ctx)
        kept_lookups += middle - before
        fresh_lookups += _CountingIndex.gets - middle
        assert kept.tobytes() == fresh.tobytes()
    assert led.placement_log(t).first > 0  # the TTL trimmed the log: kept rows were found across trims
    assert fresh_lookups > 10 * 400  # a whole window (about 25 placements) per cycle
    assert kept_lookups < 400 + 4 * 30  # one per placement, and a window again after each new snapshot or epoch
