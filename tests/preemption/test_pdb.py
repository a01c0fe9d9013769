"""PodDisruptionBudgets as kelvin lists them (scheduler_plugin/preemption/pdb.py): parsing with errors naming the
field, kube-scheduler's matching rules, violations counted per victim set, and victim choice with listed budgets."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from scheduler_plugin.model import GpuAssignment
from scheduler_plugin.preemption import Candidate, choose_victims
from scheduler_plugin.preemption.pdb import BudgetError, BudgetIndex, parse_budget, violations
from scheduler_plugin.preemption.victims import gang_costs
from tests.fleet_helpers import NOW, fleet
from tests.preemption.test_preemption_choice import (
    ISLAND_A,
    ISLAND_B,
    framework,
    full_node,
    gpus_of,
    high,
    islands_node,
)


def pdb(
    name: str = "b",
    *,
    namespace: str = "default",
    labels: dict[str, str] | None = None,
    exprs: list[dict[str, Any]] | None = None,
    allowed: Any = 0,
    disrupted: list[str] | None = None,
) -> dict[str, Any]:
    sel: dict[str, Any] = {}
    if labels is not None:
        sel["matchLabels"] = labels
    if exprs is not None:
        sel["matchExpressions"] = exprs
    status: dict[str, Any] = {"disruptionsAllowed": allowed}
    if disrupted:
        status["disruptedPods"] = {p: "2026-12-01T00:00:00Z" for p in disrupted}
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"selector": sel}, "status": status}


def test_parse_and_match_as_kube_scheduler() -> None:
    b = parse_budget(pdb(labels={"app": "train"}, exprs=[{"key": "tier", "operator": "In", "values": ["spot"]}]))
    assert b.disruptions_allowed == 0
    assert b.matches("default", "p", {"app": "train", "tier": "spot"})
    assert not b.matches("other", "p", {"app": "train", "tier": "spot"})  # another namespace
    assert not b.matches("default", "p", {"app": "train", "tier": "prod"})
    assert not b.matches("default", "p", {})  # a pod without labels matches nothing
    empty = parse_budget(pdb())
    assert not empty.matches("default", "p", {"app": "train"})  # an empty selector matches nothing
    gone = parse_budget(pdb(labels={"app": "train"}, disrupted=["p"]))
    assert not gone.matches("default", "p", {"app": "train"})  # already counted by the API server
    for op, labels, want in [
        ("NotIn", {"tier": "spot"}, False),
        ("NotIn", {"app": "x"}, True),
        ("Exists", {"tier": "x"}, True),
        ("DoesNotExist", {"tier": "x"}, False),
        ("DoesNotExist", {"app": "x"}, True),
    ]:
        e: dict[str, Any] = {"key": "tier", "operator": op}
        if op == "NotIn":
            e["values"] = ["spot"]
        assert parse_budget(pdb(exprs=[e])).matches("default", "p", labels) is want, (op, labels)


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (pdb(allowed="1"), "status.disruptionsAllowed"),
        (pdb(exprs=[{"key": "a", "operator": "Near"}]), "matchExpressions[0].operator"),
        (pdb(exprs=[{"key": "a", "operator": "In", "values": []}]), "matchExpressions[0].values"),
        (pdb(exprs=[{"operator": "Exists"}]), "matchExpressions[0].key"),
        (pdb(labels={"a": 3}), "spec.selector.matchLabels.a"),  # type: ignore[dict-item]
        ({"metadata": {"name": "b"}, "spec": {}}, "metadata.namespace"),
        ({"metadata": {"name": "b", "namespace": "d"}, "spec": []}, "spec"),
    ],
)
def test_bad_budgets_name_the_field(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(BudgetError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_budget(obj)


def test_violations_count_the_set_as_a_whole() -> None:
    # a budget that allows one disruption: one victim under it is fine, two make one violation
    assert violations([0], [1]) == 0
    assert violations([0, 0], [1]) == 1
    assert violations([0, 0, 1], [1, 0]) == 2
    idx = BudgetIndex([parse_budget(pdb("x", labels={"app": "a"})), parse_budget(pdb("y", namespace="o", labels={}))])
    assert idx.matching("default/p", {"app": "a"}) == (0,)
    assert idx.matching("o/p", {"app": "a"}) == ()
    assert idx.allowed == (0, 0)


def choose_listed(assignments: list[GpuAssignment], budgets: dict[str, tuple[int, ...]], allowed: tuple[int, ...]):  # type: ignore[no-untyped-def]
    nd = replace(islands_node(), assignments=tuple(assignments))  # type: ignore[type-var]
    cands = [Candidate.of(a, NOW, budgets=budgets.get(a.pod_key, ())) for a in assignments]
    return choose_victims(
        framework(), fleet(nd), 0, high(4, topology="nvlink-required"), cands, NOW,
        gangs=gang_costs(assignments, NOW), allowed=allowed,
    )  # fmt: skip


def test_a_listed_budget_with_no_disruption_left_protects_its_island() -> None:
    # island A's pods checkpointed just now (cheapest by progress), but a budget allowing 0 disruptions covers them
    node = full_node(**{str(i): {"checkpoint_ago": 5.0} for i in ISLAND_A})
    ch = choose_listed(node, {f"default/p{i}": (0,) for i in ISLAND_A}, (0,))
    assert ch is not None and gpus_of(ch) == set(ISLAND_B) and ch.pdb_violations == 0


def test_a_budget_allowing_some_counts_the_whole_set() -> None:
    # island A under one budget allowing 3: each pod alone is fine, the four together are one violation; island B
    # has no budget, so it is the cheaper set although its pods lose more progress
    node = full_node(**{str(i): {"checkpoint_ago": 5.0} for i in ISLAND_A})
    ch = choose_listed(node, {f"default/p{i}": (0,) for i in ISLAND_A}, (3,))
    assert ch is not None and gpus_of(ch) == set(ISLAND_B) and ch.pdb_violations == 0
    # every pod under the budget: both islands make one violation, and the fresher island A wins on progress
    ch = choose_listed(node, {f"default/p{i}": (0,) for i in range(8)}, (3,))
    assert ch is not None and gpus_of(ch) == set(ISLAND_A) and ch.pdb_violations == 1


def test_the_index_finds_budgets_by_label_and_scans_expression_only_ones() -> None:
    idx = BudgetIndex(
        [
            parse_budget(pdb("two", labels={"app": "a", "tier": "x"})),
            parse_budget(pdb("expr", exprs=[{"key": "tier", "operator": "Exists"}])),
            parse_budget(pdb("empty")),
            parse_budget(pdb("other-ns", namespace="o", labels={"app": "a"})),
        ]
    )
    assert idx.matching("default/p", {"app": "a", "tier": "x"}) == (0, 1)
    assert idx.matching("default/p", {"tier": "x"}) == (1,)
    assert idx.matching("default/p", {"app": "a"}) == ()
    assert idx.matching("o/p", {"app": "a"}) == (3,)
