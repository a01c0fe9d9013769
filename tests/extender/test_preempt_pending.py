"""The preemptions whose victims kelvin's records still show (scheduler_plugin/extender/preempt_pending.py)."""

from __future__ import annotations

from scheduler_plugin.extender.preempt_pending import PendingPreemptions


def test_waits_only_on_a_refused_node_with_victims_still_listed() -> None:
    p = PendingPreemptions(ttl_s=60)
    p.record("hi", {"n1": ["a", "b"], "n2": ["c"]}, now=0)
    listed = {"n1": {"a", "x"}, "n2": set()}
    why = p.waiting("hi", ["n1"], lambda n: listed[n], now=1)
    assert why is not None and "on n1" in why and "1 of them" in why
    assert p.waiting("hi", ["n3"], lambda n: listed[n], now=1) is None  # not refused where it preempted
    assert p.waiting("other", ["n1"], lambda n: listed[n], now=1) is None  # no preemption for that pod
    listed["n1"] = {"x"}
    assert p.waiting("hi", ["n1", "n2"], lambda n: listed[n], now=2) is None  # every victim gone
    assert len(p) == 0


def test_expires_and_is_bounded() -> None:
    p = PendingPreemptions(ttl_s=60, size=2)
    p.record("hi", {"n1": ["a"]}, now=0)
    assert p.waiting("hi", ["n1"], lambda n: {"a"}, now=61) is None and len(p) == 0
    for uid in ("p1", "p2", "p3"):
        p.record(uid, {"n1": ["a"]}, now=100)
    assert len(p) == 2 and p.waiting("p1", ["n1"], lambda n: {"a"}, now=101) is None
    p.record("", {"n1": ["a"]}, now=100)
    p.record("p4", {}, now=100)
    assert len(p) == 2
