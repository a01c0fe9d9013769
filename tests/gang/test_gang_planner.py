"""The gang planner: all or nothing, tightest domain, best fit of domains, rank order, worst-member heat."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from scheduler_plugin.gang import GangPolicy, TopologyAsk, build_domains
from scheduler_plugin.gang.planner import Gang, GangPlan, GangPlanner, PlanFailure, assume
from scheduler_plugin.model import build_arrays
from scheduler_plugin.policies.framework import Framework
from scheduler_plugin.policies.policy_file import PolicyConfig
from tests.fleet_helpers import NOW, dgx
from tests.gang.gang_helpers import POLICY, gang, labelled, plan, planner, rack


def racks_of(result: GangPlan | PlanFailure) -> set[str]:
    assert isinstance(result, GangPlan), result
    return {n.split("-")[0] for n in result.nodes}


def test_a_gang_goes_whole_into_the_rack_it_fills_best_not_the_big_empty_one() -> None:
    nodes = [*rack("big", 8), *rack("small", 4), *rack("mid", 6)]
    result = plan(nodes, gang(4, topology=TopologyAsk("rack", True)))
    assert racks_of(result) == {"small"}
    assert isinstance(result, GangPlan)
    assert len(set(result.nodes)) == 4 and all(len(p.gpus) == 8 for p in result.placements)
    assert result.level == "rack" and result.domain == "small"


def test_preferred_falls_back_to_the_next_level_when_no_rack_holds_it() -> None:
    nodes = [*rack("a", 3), *rack("b", 3)]
    result = plan(nodes, gang(4, topology=TopologyAsk("rack", False)))
    assert isinstance(result, GangPlan)
    assert result.level == "cluster" and len(set(result.nodes)) == 4


def test_a_gang_that_cannot_fit_holds_nothing_and_says_why() -> None:
    nodes = [*rack("a", 4, busy=[0]), *rack("b", 4, busy=[1, 2])]
    p = planner()
    result = plan(nodes, gang(4, topology=TopologyAsk("rack", True)), p)
    assert isinstance(result, PlanFailure)
    assert result.reason.startswith("needs 4 nodes with 8 free GPUs in one rack; the best rack (a) has 3")
    assert not result.unresolvable
    assert p.fw.ledger is not None and not p.fw.ledger.entries(NOW)  # nothing assumed


def test_a_gang_larger_than_any_rack_can_ever_hold_is_unresolvable() -> None:
    result = plan(rack("a", 4), gang(5, topology=TopologyAsk("rack", True)))
    assert isinstance(result, PlanFailure) and result.unresolvable
    assert "no rack can ever hold it (at most 4 even when empty)" in result.reason


def waiting_since(g: Gang, times: list[float]) -> Gang:
    members = [replace(m, request=replace(m.request, pending_since=t)) for m, t in zip(g.members, times, strict=True)]
    return replace(g, members=tuple(members))


def test_members_created_in_different_seconds_are_one_shape() -> None:
    """A Job creates its pods one by one: members that wait since different seconds still ask the same, so the
    gang is judged as 4 members of 8 GPUs (unresolvable in racks of 2), not as two shapes of 2 that each fit."""
    g = waiting_since(gang(4, topology=TopologyAsk("rack", True)), [NOW - 10, NOW - 9, NOW - 9, NOW - 8])
    result = plan([*rack("a", 2), *rack("b", 2)], g)
    assert isinstance(result, PlanFailure) and result.unresolvable, result
    assert result.reason.startswith("needs 4 nodes with 8 free GPUs in one rack; the best rack (a) has 2"), result
    assert "no rack can ever hold it (at most 2 even when empty)" in result.reason


def test_a_gang_of_members_created_in_different_seconds_is_planned_whole() -> None:
    g = waiting_since(gang(4, topology=TopologyAsk("rack", True)), [NOW - 4, NOW - 4, NOW - 3, NOW - 3])
    result = plan([*rack("a", 2), *rack("b", 4)], g)
    assert isinstance(result, GangPlan), result
    assert racks_of(result) == {"b"} and len(set(result.nodes)) == 4


def test_required_at_a_level_no_node_has_is_refused() -> None:
    nodes = [dgx("x"), dgx("y")]
    result = plan(nodes, gang(2, topology=TopologyAsk("rack", True)))
    assert isinstance(result, PlanFailure) and result.unresolvable and "no node carries" in result.reason


def test_consecutive_ranks_share_the_innermost_domain() -> None:
    # 4 nodes of 8 GPUs in cliques of 2 nodes; 8 members of 4 GPUs: two per node, four per clique
    nodes = rack("r", 4, clique_size=2)
    result = plan(nodes, gang(8, gpus=4, topology=TopologyAsk("rack", True)))
    assert isinstance(result, GangPlan)
    cliques = [p.node.split("-n")[1] for p in result.placements]
    clique_of = [int(c) // 2 for c in cliques]
    assert clique_of == sorted(clique_of)  # ranks 0-3 in one clique, 4-7 in the other
    assert result.spread[1] == 2  # two cliques
    nodes_in_order = [p.node for p in result.placements]
    assert nodes_in_order[0] == nodes_in_order[1] and nodes_in_order[2] == nodes_in_order[3]


def test_a_hot_node_never_takes_a_member_even_with_the_hot_filter_off() -> None:
    cfg = PolicyConfig.from_mapping({"filters": {"hotNodes": False}})
    hot_rack = rack("hot", 4)
    hot_rack[2] = labelled(dgx("hot-n2", temp=84), rack="hot", clique="hot-n2")  # at the hot threshold (83 °C)
    nodes = [*hot_rack, *rack("cool", 6)]
    result = plan(nodes, gang(4, topology=TopologyAsk("rack", True)), planner(Framework.from_config(cfg)))
    assert racks_of(result) == {"cool"}


def test_the_gang_is_scored_by_its_worst_member_not_the_mean() -> None:
    # rack 'warm' fits best (4 nodes) but one node runs close to slowdown; the gang goes to the cool rack
    warm = rack("warm", 4)
    warm[1] = labelled(dgx("warm-n1", temp=80, slowdown=87), rack="warm", clique="warm-n1")
    nodes = [*warm, *rack("cool", 5)]
    result = plan(nodes, gang(4, topology=TopologyAsk("rack", True)))
    assert racks_of(result) == {"cool"}
    assert isinstance(result, GangPlan) and result.worst_thermal >= POLICY.good_thermal_quality


def test_a_planned_gang_is_assumed_so_the_next_gang_cannot_take_its_capacity() -> None:
    nodes = [*rack("a", 4), *rack("b", 4)]
    p = planner()
    fleet = build_arrays(nodes)
    domains = build_domains(fleet.names, [nd.labels for nd in nodes], POLICY)
    first = p.plan(
        gang(4, topology=TopologyAsk("rack", True), key="ml/kelvin:one"), fleet, domains, p.fw.context(fleet, NOW)
    )
    assert isinstance(first, GangPlan)
    assume(p.fw, first, NOW)
    second = p.plan(
        gang(4, topology=TopologyAsk("rack", True), key="ml/kelvin:two"), fleet, domains, p.fw.context(fleet, NOW)
    )
    assert isinstance(second, GangPlan)
    assert not set(first.nodes) & set(second.nodes)
    assume(p.fw, second, NOW)
    third = p.plan(gang(1, key="ml/kelvin:three"), fleet, domains, p.fw.context(fleet, NOW))
    assert isinstance(third, PlanFailure)


def test_without_levels_a_small_gang_shares_one_node() -> None:
    nodes = [dgx("x"), dgx("y")]
    p = GangPlanner(Framework.from_config(PolicyConfig()), GangPolicy())
    fleet = build_arrays(nodes)
    domains = build_domains(fleet.names, [{}, {}], GangPolicy())
    result = p.plan(gang(2, gpus=4), fleet, domains, p.fw.context(fleet, NOW))
    assert isinstance(result, GangPlan) and len(set(result.nodes)) == 1 and result.level == "node"
    gpus = [g for pl in result.placements for g in pl.gpus]
    assert sorted(gpus) == list(range(8))
    assert np.unique(gpus).size == 8


def test_a_node_predicted_to_throttle_under_load_never_takes_a_member() -> None:
    # rack 'a' is the only rack with 4 free nodes, but one of them is poorly cooled: idle at 50 °C, it would settle
    # past slowdown under a pod (0.15 °C/W * 340 W). The gang waits (required=rack) rather than take it.
    nodes = [*rack("a", 4), *rack("b", 4, busy=[0])]
    fleet = build_arrays(nodes)
    fleet.power = np.where(fleet.gpu_present, 60.0, np.nan)
    fleet.thermal_resistance = np.where(fleet.gpu_present, 0.03, np.nan)
    fleet.thermal_resistance[1] = 0.15
    fleet.power[7, 0], fleet.util[7, 0] = 400.0, 0.9  # a busy GPU tells the thermal policy what a pod draws
    p = planner()
    domains = build_domains(fleet.names, [nd.labels for nd in nodes], POLICY)
    assert p.node_quality(fleet)[1] < POLICY.min_thermal_quality <= p.node_quality(fleet)[0]
    result = p.plan(gang(4, topology=TopologyAsk("rack", True)), fleet, domains, p.fw.context(fleet, NOW))
    assert isinstance(result, PlanFailure) and "the best rack (a) has 3" in result.reason
    three = p.plan(gang(3, topology=TopologyAsk("rack", True)), fleet, domains, p.fw.context(fleet, NOW))
    assert isinstance(three, GangPlan) and "a-n1" not in three.nodes
