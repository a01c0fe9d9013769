"""The hot path's reuse of repeated NodeNames lists (wire.NameCache) and the templated prioritize reply: same
answers as decoding every list and building a dict per node, checks kept on a cache hit."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_plugin.extender import wire
from scheduler_plugin.extender.errors import TooLarge, WireError

POD: dict[str, object] = {"metadata": {"name": "p", "namespace": "default", "uid": "u1"}}


def body(names: list[str], pod: dict[str, object] = POD) -> bytes:
    return json.dumps({"Pod": pod, "NodeNames": names}).encode()


NAMES = [f"gpu-node-{i}" for i in range(200)]


def test_a_repeated_names_list_is_decoded_once() -> None:
    cache = wire.NameCache()
    a = wire.parse_args(body(NAMES), names=cache)
    b = wire.parse_args(body(NAMES, {"metadata": {"name": "q", "uid": "u2"}}), names=cache)
    assert a.name_list is b.name_list and b.names == NAMES
    assert b.pod["metadata"]["name"] == "q"  # the pod is the request's own
    other = wire.parse_args(body(NAMES[:150]), names=cache)
    assert other.name_list is not a.name_list and other.names == NAMES[:150]
    assert len(cache) == 2


def test_the_cache_is_bounded_and_skips_short_lists() -> None:
    cache = wire.NameCache(size=2, min_names=10)
    wire.parse_args(body(NAMES[:5]), names=cache)
    assert len(cache) == 0
    first = wire.parse_args(body(NAMES[:20]), names=cache).name_list
    for n in (30, 40):
        wire.parse_args(body(NAMES[:n]), names=cache)
    assert len(cache) == 2
    assert wire.parse_args(body(NAMES[:20]), names=cache).name_list is not first  # evicted: decoded again
    assert (
        wire.parse_args(body(NAMES[:40]), names=cache).name_list
        is wire.parse_args(body(NAMES[:40]), names=cache).name_list
    )


def test_max_node_names_holds_on_a_cache_hit() -> None:
    cache = wire.NameCache()
    wire.parse_args(body(NAMES), max_node_names=1000, names=cache)
    with pytest.raises(TooLarge, match="NodeNames: 200 nodes, more than max_node_names"):
        wire.parse_args(body(NAMES), max_node_names=100, names=cache)


def test_duplicates_are_counted_as_sent_and_dropped() -> None:
    cache = wire.NameCache(min_names=1)
    names = ["a", "b", "a", "c", "b"]
    first = wire.parse_args(body(names), names=cache)
    again = wire.parse_args(body(names), names=cache)
    assert again.names == ["a", "b", "c"] and again.name_list.sent == 5 and again.name_list is first.name_list
    with pytest.raises(TooLarge, match="5 nodes"):
        wire.parse_args(body(names), max_node_names=4, names=cache)


def test_bad_names_are_refused_on_the_cached_path_too() -> None:
    cache = wire.NameCache(min_names=1)
    with pytest.raises(WireError, match=r"NodeNames\[1\]: must be a string, not int"):
        wire.parse_args(b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["a", 1]}', names=cache)
    with pytest.raises(WireError, match="not valid JSON"):
        wire.parse_args(b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["\xff"]}', names=cache)
    assert len(cache) == 0


def test_rows_follow_the_index_they_are_asked_for() -> None:
    names = wire.NodeNameList(["a", "b", "x"])
    one = {"a": 0, "b": 1}
    two = {"b": 0, "x": 4}
    assert names.rows(one).tolist() == [0, 1, -1]
    assert names.rows(one) is names.rows(one)  # remembered for the same index
    assert names.rows(two).tolist() == [-1, 0, 4]
    assert not names.rows(two).flags.writeable  # shared between requests: read-only


def test_subset_keeps_the_order_given() -> None:
    names = wire.NodeNameList(["a", "b", "c"])
    assert names.subset(np.array([0, 1, 2])) is names.names
    assert names.subset(np.array([2, 0, 1])) == ["c", "a", "b"]
    assert names.subset(np.array([1])) == ["b"]
    assert names.subset(np.array([], dtype=np.int64)) == []


@given(st.lists(st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=12), max_size=40), st.data())
def test_the_priority_template_is_the_list_of_hosts_and_scores(names: list[str], data: st.DataObject) -> None:
    unique = list(dict.fromkeys(names))  # any text JSON can carry: quotes, backslashes, controls, non-ASCII
    scores = data.draw(st.lists(st.integers(0, 10), min_size=len(unique), max_size=len(unique)))
    nl = wire.NodeNameList(unique)
    for s in (scores, scores[::-1], scores, scores[::-1]):  # as dicts twice, then into the list's template
        reply = nl.priority_json(np.asarray(s, dtype=np.int64))
        assert orjson.loads(reply) == [{"Host": n, "Score": v} for n, v in zip(unique, s, strict=True)]


def test_the_priority_template_refuses_scores_out_of_range() -> None:
    nl = wire.NodeNameList(["a", "b"])
    with pytest.raises(ValueError, match=r"0\.\.10"):
        nl.priority_json(np.array([3, 11]))
    with pytest.raises(ValueError, match="1 scores for 2 names"):
        nl.priority_json(np.array([3]))


@given(st.lists(st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=12), max_size=40), st.data())
def test_a_passed_list_cuts_its_template_and_rows_from_the_filters(names: list[str], data: st.DataObject) -> None:
    unique = list(dict.fromkeys(names))
    nl = wire.NodeNameList(unique)
    index = {n: i * 3 for i, n in enumerate(unique) if i % 4}  # some names unknown to the snapshot
    nl.rows(index)
    positions = data.draw(st.lists(st.integers(0, max(len(unique) - 1, 0)), unique=True, max_size=len(unique)))
    if not unique:
        positions = []
    kept = nl.passed(np.asarray(positions, dtype=np.int64))
    assert kept.names == [unique[p] for p in positions]
    assert kept.rows(index).tolist() == [index.get(unique[p], -1) for p in positions]
    scores = data.draw(st.lists(st.integers(0, 10), min_size=len(positions), max_size=len(positions)))
    reply = kept.priority_json(np.asarray(scores, dtype=np.int64))  # the first reply: from the cut template
    assert orjson.loads(reply) == [{"Host": unique[p], "Score": s} for p, s in zip(positions, scores, strict=True)]
    ascending = sorted(positions)  # a filter's passed names: the template is cut by a mask
    reply = nl.passed(np.asarray(ascending, dtype=np.int64)).priority_json(np.asarray(scores, dtype=np.int64))
    assert orjson.loads(reply) == [{"Host": unique[p], "Score": s} for p, s in zip(ascending, scores, strict=True)]


def test_prioritize_finds_the_names_its_filter_passed() -> None:
    """kube-scheduler sends prioritize exactly the names the filter passed (Go's compact JSON): the list is not
    decoded again and its rows are the filter's."""

    class Index(dict[str, int]):
        looked_up = 0

        def __getitem__(self, name: str) -> int:
            Index.looked_up += 1
            return super().__getitem__(name)

    cache = wire.NameCache()
    index = Index({n: i + 7 for i, n in enumerate(NAMES)})
    args = wire.parse_args(body(NAMES), names=cache)
    args.name_list.rows(index)
    assert Index.looked_up == 200
    positions = np.arange(0, 200, 2)
    reply = wire.filter_result(args, positions, {}, {}, names=cache)
    prio_body = orjson.dumps({"Pod": POD, "NodeNames": reply["NodeNames"]})
    prio = wire.parse_args(prio_body, names=cache)
    assert prio.names == NAMES[::2]
    assert prio.name_list.rows(index).tolist() == list(range(7, 207, 2))
    assert Index.looked_up == 200  # the filter's rows, not looked up again
    assert prio.name_list is wire.parse_args(prio_body, names=cache).name_list  # kept: not decoded again
    for _ in range(20):  # a passed list per pod never pushes the repeated filter list out
        wire.filter_result(args, np.arange(1, 150), {}, {}, names=cache)
    assert wire.parse_args(body(NAMES), names=cache).name_list is args.name_list


def test_the_same_names_passed_again_keep_the_list_prioritize_used() -> None:
    """The next pod of a shape passes the same nodes more often than not: prioritize then gets the list kept for the
    first one, whose reply template was cut already (not cut again), and the same reply bytes."""
    cache = wire.NameCache()
    args = wire.parse_args(body(NAMES), names=cache)
    positions = np.arange(0, 200, 3)
    scores = np.arange(positions.size, dtype=np.int64) % 11
    first = wire.filter_result(args, positions, {}, {}, names=cache)
    prio_body = orjson.dumps({"Pod": POD, "NodeNames": first["NodeNames"]})
    kept = wire.parse_args(prio_body, names=cache).name_list
    reply = kept.priority_json(scores)
    template = kept._template
    assert template is not None
    again = wire.filter_result(args, positions.copy(), {}, {}, names=cache)
    assert again["NodeNames"] == first["NodeNames"]
    later = wire.parse_args(prio_body, names=cache).name_list
    assert later is kept and later._template is template
    assert later.priority_json(scores) == reply
    other = wire.filter_result(args, np.arange(1, 200, 3), {}, {}, names=cache)  # other names: a list of their own
    other_body = orjson.dumps({"Pod": POD, "NodeNames": other["NodeNames"]})
    assert wire.parse_args(other_body, names=cache).name_list is not kept
