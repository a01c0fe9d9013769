"""The priority scenario of scheduler_plugin/simulator/preemption.py on a small slice of the spot-GPU fleet."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_plugin.policies import PolicyConfig
from scheduler_plugin.simulator.preemption import ISLAND_MODELS, Mix, jobs, placement_config, read_spot_nodes, simulate


@pytest.fixture
def nodes_csv(spot_trace_dir: Path) -> Path:
    return spot_trace_dir / "node_info_df.csv"


def test_reads_the_8_gpu_nodes_with_the_stated_topology(nodes_csv: Path) -> None:
    nodes = read_spot_nodes(nodes_csv, stride=1)
    assert len(nodes) == 872 and all(len(n.gpus) == 8 for n in nodes)
    islands = [n for n in nodes if n.gpus[0].model in ISLAND_MODELS]
    assert len(islands) == 199
    assert islands[0].gpus[0].nvlink_peers == frozenset({1, 2, 3})
    nvs = next(n for n in nodes if n.gpus[0].model.startswith("A100"))
    assert nvs.gpus[0].nvlink_peers == frozenset(range(1, 8))


def test_the_mix_is_seeded_and_the_same_for_both_runs() -> None:
    a, b = jobs(Mix(hours=2, seed=3), 256), jobs(Mix(hours=2, seed=3), 256)
    assert [(j.name, j.gpus, j.arrival) for j in a] == [(j.name, j.gpus, j.arrival) for j in b]
    assert any(j.priority > 0 for j in a) and any(j.pods == 2 for j in a)


def test_kelvin_evicts_less_and_loses_less_at_equal_placement(nodes_csv: Path) -> None:
    nodes = read_spot_nodes(nodes_csv, stride=28)  # 32 nodes, 256 GPUs
    mix = Mix(hours=3, high_per_hour=4, seed=1)
    count = simulate(nodes, mix, "count")
    kelvin = simulate(nodes, mix, "kelvin")
    assert count.high_arrived == kelvin.high_arrived > 0
    assert kelvin.high_placed >= count.high_placed
    assert count.evictions > 0
    assert kelvin.evictions < count.evictions
    assert kelvin.lost_gpu_hours < count.lost_gpu_hours
    assert kelvin.wasted_evictions == 0
    # every preemption stops one pod at least: kelvin's stop no more per preemption than count-based's
    assert kelvin.preemptions > 0 and count.preemptions > 0
    assert 1.0 <= kelvin.evictions_per_preemption <= count.evictions_per_preemption
    assert kelvin.spot_done_gpu_hours > 0


def test_the_default_placement_has_no_priority_policy() -> None:
    """Without a reserve or a weight the scenario places with kelvin's default policy (no priority term)."""
    assert placement_config() == PolicyConfig()
    assert "priority" in placement_config(reserve_gpus=8).scoring


def test_the_reserve_leaves_room_for_high_priority_pods(nodes_csv: Path) -> None:
    """The priority policy's reserve keeps freed NVLink groups for the high-priority mix: fewer preemptions (and
    evictions) at equal high-priority placement, for the same preemption verb."""
    nodes = read_spot_nodes(nodes_csv, stride=28)  # 32 nodes, 256 GPUs
    mix = Mix(hours=3, high_per_hour=4, seed=1)
    plain = simulate(nodes, mix, "kelvin")
    reserved = simulate(nodes, mix, "kelvin", placement=placement_config(priority_weight=1, reserve_gpus=8))
    assert reserved.high_arrived == plain.high_arrived > 0
    assert reserved.high_placed >= plain.high_placed
    assert plain.preemptions > 0
    assert reserved.preemptions < plain.preemptions and reserved.evictions < plain.evictions
