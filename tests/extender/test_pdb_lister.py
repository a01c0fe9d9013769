"""kelvin's own list of PodDisruptionBudgets (extender/pdb_lister.py) and the preempt verb counting them: pages,
the bound, a failed list keeping the previous one, a stale list not used, bad objects left out; the verb choosing
the island no budget protects where kube-scheduler's own count says nothing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from ext_helpers import gpu_node, make_extender
from fastapi.testclient import TestClient
from test_extender_preempt import ISLAND_A, ISLAND_B, T0, islands, meta_args, preemptor, victim_gpus

from scheduler_plugin.extender.app import create_app
from scheduler_plugin.extender.pdb_lister import PdbLister
from scheduler_plugin.extender.service import Extender
from scheduler_plugin.kubeapi import KubeError
from scheduler_plugin.model.eviction import EvictionFacts
from tests.extender.paged_api import Clock, PagedApi


def budget(name: str, app: str, allowed: int, namespace: str = "low") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": app}}},
        "status": {"disruptionsAllowed": allowed},
    }


class FakeApi(PagedApi):
    """Answers the list of PodDisruptionBudgets in pages of ``page`` (or fails with ``error``)."""

    def __init__(self, items: list[dict[str, Any]], page: int = 2) -> None:
        super().__init__("/apis/policy/v1/poddisruptionbudgets", items, page)


def lister(api: FakeApi, **kw: Any) -> tuple[PdbLister, Clock]:
    clock = Clock()
    return PdbLister(api, clock=clock, **kw), clock  # type: ignore[arg-type]


def test_pages_are_followed_and_bad_objects_left_out(caplog: pytest.LogCaptureFixture) -> None:
    bad = budget("bad", "x", 0)
    bad["status"]["disruptionsAllowed"] = "none"
    api = FakeApi([budget("a", "a", 0), budget("b", "b", 1), bad, budget("c", "c", 2), budget("d", "d", 0)])
    pl, _ = lister(api)
    with caplog.at_level(logging.WARNING):
        assert asyncio.run(pl.refresh())
    idx = pl.index()
    assert idx is not None and [b.name for b in idx.budgets] == ["a", "b", "c", "d"] and api.calls == 3
    assert "low/bad: status.disruptionsAllowed" in caplog.text


def test_more_than_the_bound_is_not_used() -> None:
    pl, _ = lister(FakeApi([budget(f"b{i}", "a", 0) for i in range(5)]), max_budgets=4)
    assert not asyncio.run(pl.refresh())
    assert pl.index() is None and pl.error is not None and "more than 4" in pl.error


def test_a_failed_list_keeps_the_previous_one_until_it_is_too_old() -> None:
    api = FakeApi([budget("a", "a", 0)])
    pl, clock = lister(api, max_age_s=60.0)
    assert asyncio.run(pl.refresh())
    api.error = KubeError(403, "forbidden")
    clock.t += 30
    assert not asyncio.run(pl.refresh())
    assert pl.index() is not None and pl.error is not None
    clock.t += 31  # the last good list is now older than max_age_s
    assert pl.index() is None


@pytest.fixture
def ext() -> Extender:
    # every pod of island A runs app=train under a budget with no disruption left, and checkpointed just now (the
    # cheapest island without budgets); island B's pods run app=batch
    base = islands()
    labelled = []
    for a in base.assignments:
        on_a = a.gpu_indices[0] < 4
        facts = replace(a.eviction or EvictionFacts(), labels=(("app", "train" if on_a else "batch"),))
        if on_a:
            facts = replace(facts, checkpoint_at=T0 - 5)
        labelled.append(replace(a, eviction=facts))
    e = make_extender([replace(base, assignments=tuple(labelled)), gpu_node("gpu-node-2")])[0]
    api = FakeApi([budget("train", "train", 0), budget("batch", "batch", 4)])
    e.pdbs = PdbLister(api)  # type: ignore[arg-type]
    return e


@pytest.fixture
def client(ext: Extender) -> Iterator[TestClient]:
    with TestClient(create_app(ext)) as c:  # the lifespan lists the budgets once
        yield c


def test_the_verb_avoids_the_island_a_listed_budget_protects(client: TestClient) -> None:
    # kube-scheduler proposes island A and says no PDB is violated (NumPDBViolations 0): kelvin's own list says
    # evicting any of them violates "train"; island B's budget allows 4
    body = meta_args(preemptor(), {"gpu-islands": [f"uid-w{i}" for i in ISLAND_A]}, pdb=0)
    out = client.post("/preempt", content=body).json()
    assert victim_gpus(out) == set(ISLAND_B)
    assert out["NodeNameToMetaVictims"]["gpu-islands"]["NumPDBViolations"] == 0


def test_the_verb_reports_the_violations_it_counts(ext: Extender, client: TestClient) -> None:
    # both budgets exhausted: every island costs 4 violations, and kelvin says so
    assert ext.pdbs is not None
    ext.pdbs.client.items = [budget("train", "train", 0), budget("batch", "batch", 0)]  # type: ignore[attr-defined]
    assert client.portal.call(ext.pdbs.refresh)
    body = meta_args(preemptor(), {"gpu-islands": [f"uid-w{i}" for i in ISLAND_A]}, pdb=0)
    out = client.post("/preempt", content=body).json()
    assert victim_gpus(out) == set(ISLAND_A)  # the fresher island, now that both cost the same violations
    assert out["NodeNameToMetaVictims"]["gpu-islands"]["NumPDBViolations"] == 4
