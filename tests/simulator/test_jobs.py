"""The job-level simulator: workload generator and trace, racks, the ring all-reduce model, and the four schedulers
on small fleets (all or nothing, incomplete gangs, spread, stragglers)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from scheduler_plugin.cli import app
from scheduler_plugin.model import FleetArrays
from scheduler_plugin.policies.fragmentation.plugin import FragmentationBase
from scheduler_plugin.policies.fragmentation.workload import PodShape
from scheduler_plugin.simulator.jobs.cluster import CoolingScenario, JobFleet, apply_cooling, build_job_fleet, racks_of
from scheduler_plugin.simulator.jobs.engine import RunMetrics, simulate_jobs
from scheduler_plugin.simulator.jobs.network import Network
from scheduler_plugin.simulator.jobs.report import aggregate, goals
from scheduler_plugin.simulator.jobs.schedulers import SCHEDULERS, KelvinGang, PerPod, build_scheduler, nodes_to_score
from scheduler_plugin.simulator.jobs.workload import JobMix, JobSpec, generate, read_jobs, write_jobs
from scheduler_plugin.simulator.trace import TraceError, TraceNode

GIB = 2**30


def eight(n: int, model: str = "A100") -> list[TraceNode]:
    return [TraceNode(f"{model}-{i}", 64000, 512 * GIB, 8, model) for i in range(n)]


def test_generator_is_seeded_and_follows_its_mix() -> None:
    mix = JobMix()
    a = generate(mix, 10_000, 4000, seed=3)
    assert a == generate(mix, 10_000, 4000, seed=3) and a != generate(mix, 10_000, 4000, seed=4)
    small = sum(j.gpus <= 8 for j in a) / len(a)
    assert 0.82 < small < 0.88  # 85 % of jobs take 1-8 GPUs
    assert all(j.members == 1 or j.gpus_per_member == 8 for j in a)
    assert max(j.gpus for j in a) == 256
    rate = len(a) / (a[-1].arrival_s / 3600)
    assert rate == pytest.approx(mix.rate_per_hour(10_000), rel=0.1)


def test_job_trace_round_trips_and_bad_rows_name_row_and_column(tmp_path: Path) -> None:
    jobs = generate(JobMix(), 1000, 20, seed=1)
    path = tmp_path / "jobs.csv"
    write_jobs(jobs, path)
    back = read_jobs(path)
    assert [(j.name, j.members, j.gpus_per_member) for j in back] == [
        (j.name, j.members, j.gpus_per_member) for j in jobs
    ]
    path.write_text("name,arrival_seconds,duration_seconds,members,gpus_per_member\nx,0,60,two,8\n", encoding="utf-8")
    with pytest.raises(TraceError, match="row 2, column members: 'two' is not a number"):
        read_jobs(path)
    path.write_text("name,arrival_seconds\nx,0\n", encoding="utf-8")
    with pytest.raises(TraceError, match="missing column"):
        read_jobs(path)


def test_racks_are_consecutive_nodes_of_one_model_and_size() -> None:
    nodes = [*eight(3), TraceNode("a10-0", 1000, GIB, 1, "A10"), *eight(3)]
    assert (
        racks_of(nodes, 4)
        == [
            "A100x8-r000",
            "A100x8-r000",
            "A100x8-r000",
            "A10x1-r000",
            "A100x8-r000",
            "A100x8-r001",
            "A100x8-r001",
        ][: len(nodes)]
    )


def test_ring_model_nvlink_rack_spine_and_rank_order() -> None:
    net = Network()
    in_node = net.ring_bandwidth([0] * 8, [0] * 8)
    in_rack = net.ring_bandwidth([0] * 8 + [1] * 8, [0] * 16)
    two_racks = net.ring_bandwidth([0] * 8 + [1] * 8, [0] * 8 + [1] * 8)
    assert in_node > in_rack > two_racks
    ordered = net.ring_bandwidth([0, 0, 1, 1, 2, 2, 3, 3], [0, 0, 0, 0, 1, 1, 1, 1])
    scattered = net.ring_bandwidth([0, 2, 1, 3, 0, 2, 1, 3], [0, 1, 0, 1, 0, 1, 0, 1])
    assert scattered < ordered  # a rank-scattered ring leaves each node and rack many times
    ideal = net.ideal_bandwidth(members=2, gpus_per_member=8, node_gpus=8, rack_nodes=4)
    assert net.slowdown(in_rack, ideal) == 1.0 and net.slowdown(two_racks, ideal) > 1.0
    assert net.run_factor(1.0) == 1.0


def test_kube_scheduler_scores_a_sample_of_large_fleets() -> None:
    assert nodes_to_score(50) == 100 and nodes_to_score(4278) == int(4278 * (50 - 4278 / 125) / 100)


def test_per_pod_schedulers_hold_gpus_for_incomplete_gangs_and_gangs_do_not() -> None:
    jf = build_job_fleet(eight(4), rack_nodes=4)
    jobs = [JobSpec("a", 0.0, 3600.0, 3, 8), JobSpec("b", 1.0, 3600.0, 3, 8)]
    held = {}
    for name in SCHEDULERS:
        m = simulate_jobs(jobs, jf, build_scheduler(name, jf, 1), seed=1)
        s = m.summary()
        assert s["started"] == 2
        held[name] = float(s["incomplete_gang_gpu_hours"])
    # b's first pod waits an hour on a node of its own while a runs
    assert held["kube-default"] == pytest.approx(8.0, rel=0.05)
    assert held["kelvin-pod"] == pytest.approx(8.0, rel=0.05)
    assert held["tas-greedy"] == held["kelvin-gang"] == 0.0


def test_kelvin_s_schedulers_learn_the_job_pods_as_the_extender_s_filter_does() -> None:
    """Every pod a kelvin scheduler tries to place is observed by its framework (kelvin's fragmentation score learns
    the mix from the arrivals, as the extender's filter learns every pod it sees); the gang scheduler's planner and
    per-pod frameworks learn the same pods, single-pod jobs included. A pod tried again counts once."""
    jf = build_job_fleet(eight(4), rack_nodes=4)
    jobs = [JobSpec("a", 0.0, 3600.0, 3, 8), JobSpec("b", 1.0, 3600.0, 3, 8), JobSpec("c", 2.0, 60.0, 1, 2)]
    pods = sum(j.members for j in jobs)
    for name in ("kelvin-pod", "kelvin-gang"):
        sched = build_scheduler(name, jf, 1)
        simulate_jobs(jobs, jf, sched, seed=1)
        if isinstance(sched, KelvinGang):
            frameworks = [sched.planner.fw, sched.single.policy.framework]
        else:
            assert isinstance(sched, PerPod)
            frameworks = [sched.policy.framework]
        for fw in frameworks:
            frag = next(ws.plugin for ws in fw.scorers if ws.name == "fragmentation")
            assert isinstance(frag, FragmentationBase)
            assert frag.estimator.observed == pods, name  # b waited for a: its pods were tried more than once
            assert PodShape(0, 1000, 8, None) in frag.estimator.weights() and PodShape(0, 1000, 2, None) in (
                frag.estimator.weights()
            )


def test_gangs_stay_in_one_rack_where_per_pod_spreads() -> None:
    jf = build_job_fleet(eight(16), rack_nodes=4)
    jobs = [JobSpec(f"j{i}", i * 10.0, 7200.0, 2, 8) for i in range(6)]
    spread = {}
    for name in ("kube-default", "kelvin-gang"):
        s = simulate_jobs(jobs, jf, build_scheduler(name, jf, 1), seed=1).summary()
        spread[name] = (float(s["over_spread_share"]), float(s["mean_comm_slowdown"]))
    assert spread["kelvin-gang"] == (0.0, 1.0)
    assert spread["kube-default"][0] > 0.5 and spread["kube-default"][1] > 1.0


def test_gang_planner_avoids_poorly_cooled_nodes_where_the_greedy_does_not() -> None:
    jf = build_job_fleet(eight(32), rack_nodes=4)
    fleet, poor = apply_cooling(jf, CoolingScenario(poor_share=0.25), seed=5)
    assert 4 <= int(poor.sum()) <= 14
    jobs = [JobSpec(f"j{i}", i * 600.0, 3600.0, 2, 8) for i in range(12)]
    straggler = {}
    for name in ("tas-greedy", "kelvin-gang"):
        m = simulate_jobs(jobs, jf, build_scheduler(name, jf, 5), seed=5, fleet=fleet, poor=poor)
        straggler[name] = float(m.summary()["straggler_gpu_hours"])
    assert straggler["tas-greedy"] > 0
    assert straggler["kelvin-gang"] <= 0.2 * straggler["tas-greedy"]


def test_simulate_jobs_cli_writes_table_csv_and_png(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    rows = ["gpu_model,gpu_capacity_num,cpu_num,node_name"]
    rows += [f"A100-SXM4-80GB,8,128,{i}" for i in range(24)] + [f"A10,1,128,{100 + i}" for i in range(8)]
    nodes.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app,
        [
            "simulate",
            "--nodes",
            str(nodes),
            "--jobs",
            "generate",
            "--job-count",
            "40",
            "--thermal",
            "--rack-nodes",
            "8",
            "--out",
            str(out),
            "--no-progress",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    assert (out / "jobs.csv").stat().st_size > 0 and (out / "jobs.png").stat().st_size > 0

    def strict(const: str) -> float:
        raise AssertionError(f"{const} is not JSON")

    rows = json.loads(res.stdout, parse_constant=strict)["rows"]
    for r in rows:  # null where no job waited in the measured window
        assert r["saturated_allocation_ratio"] is None or 0.0 <= r["saturated_allocation_ratio"] <= 1.0, r
    assert "kelvin-gang" in (out / "jobs.csv").read_text(encoding="utf-8")


def test_simulate_jobs_cli_refuses_a_bad_trace(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("gpu_model,gpu_capacity_num,cpu_num,node_name\nA100,8,128,0\n", encoding="utf-8")
    bad = tmp_path / "jobs.csv"
    bad.write_text("name,arrival_seconds,duration_seconds,members,gpus_per_member\nx,0,60,0,8\n", encoding="utf-8")
    res = CliRunner().invoke(app, ["simulate", "--nodes", str(nodes), "--jobs", str(bad), "--no-progress"])
    assert res.exit_code != 0
    assert "column members" in res.output and "Traceback" not in res.output
    assert np.isfinite(1.0)


def test_allocation_while_jobs_wait_is_measured_only_when_a_job_waits() -> None:
    jf = build_job_fleet(eight(4), rack_nodes=4)
    # a holds 3 of the 4 nodes for 2 h; b (3 nodes) waits for it through the whole measured window [1 h, 2 h]
    jobs = [JobSpec("a", 0.0, 7200.0, 3, 8), JobSpec("b", 10.0, 3600.0, 3, 8), JobSpec("c", 7200.0, 60.0, 1, 1)]
    s = simulate_jobs(jobs, jf, build_scheduler("kelvin-gang", jf, 1), seed=1).summary()
    assert s["waiting_share"] == pytest.approx(1.0)
    assert s["saturated_allocation_ratio"] == pytest.approx(0.75)
    # kelvin per pod places one of b's pods on the free node: the fleet is full while b waits
    s = simulate_jobs(jobs, jf, build_scheduler("kelvin-pod", jf, 1), seed=1).summary()
    assert s["saturated_allocation_ratio"] == pytest.approx(1.0)
    # nothing waits: the whole-window ratio only says how much work there was; the saturated one is not measured
    alone = [JobSpec("a", 0.0, 7200.0, 3, 8), JobSpec("c", 7200.0, 60.0, 1, 1)]
    s = simulate_jobs(alone, jf, build_scheduler("kelvin-gang", jf, 1), seed=1).summary()
    assert s["allocation_ratio"] == pytest.approx(0.75) and s["waiting_share"] == 0.0
    assert math.isnan(float(s["saturated_allocation_ratio"]))


def test_allocation_goal_compares_while_jobs_wait_and_says_when_it_cannot() -> None:
    def row(sched: str, whole: float, sat: float) -> dict[str, float | str | int]:
        return {
            "scenario": "base",
            "scheduler": sched,
            "incomplete_gang_gpu_hours": 0.0,
            "allocation_ratio": whole,
            "saturated_allocation_ratio": sat,
        }

    # per pod's slower jobs fill more of the whole window; while jobs wait, the gang planner packs as tightly
    rows = [row("kelvin-pod", 0.86, 0.880), row("tas-greedy", 0.79, 0.877), row("kelvin-gang", 0.80, 0.878)]
    got = {name: (met, figures) for name, met, figures in goals(rows)}
    met, figures = got["allocation while jobs wait within 0.5 pt of kelvin per pod"]
    assert met and figures.startswith("-0.20 pt; over the whole window -6.00 pt")
    assert got["allocation while jobs wait above the TAS-like greedy"][0]
    rows[2] = row("kelvin-gang", 0.80, float("nan"))
    met, figures = dict((n, (m, f)) for n, m, f in goals(rows))["allocation while jobs wait above the TAS-like greedy"]
    assert not met and "not measured" in figures


def test_allocation_while_jobs_wait_is_pooled_over_seeds() -> None:
    jf = build_job_fleet(eight(4), rack_nodes=4)
    waits = [JobSpec("a", 0.0, 7200.0, 3, 8), JobSpec("b", 10.0, 3600.0, 3, 8), JobSpec("c", 7200.0, 60.0, 1, 1)]
    alone = [JobSpec("a", 0.0, 7200.0, 3, 8), JobSpec("c", 7200.0, 60.0, 1, 1)]
    runs = [simulate_jobs(js, jf, build_scheduler("kelvin-gang", jf, 1), seed=s) for s, js in ((1, waits), (2, alone))]
    (row,) = aggregate(runs)
    # the seed in which nothing waited adds no time: the pooled figure is the other seed's, not NaN
    assert row["saturated_allocation_ratio"] == pytest.approx(0.75) and row["waiting_share"] == pytest.approx(0.5)


def _one_poor_node(n: int) -> tuple[JobFleet, FleetArrays, np.ndarray]:
    """``n`` 8-GPU nodes, node 0 poorly cooled (its telemetry shows it as apply_cooling draws it)."""
    jf = build_job_fleet(eight(n), rack_nodes=n)
    sc = CoolingScenario(poor_share=0.0)
    fleet, _ = apply_cooling(jf, sc, seed=1)
    fleet.thermal_resistance[0] = np.where(fleet.gpu_present[0], sc.poor_resistance_c_per_w, np.nan)
    poor = np.zeros(n, dtype=np.bool_)
    poor[0] = True
    return jf, fleet, poor


def test_kelvin_s_operator_moves_a_straggling_job_when_the_gang_rule_says_it_pays() -> None:
    """a takes the well cooled node for 5 min; b gets the poorly cooled one at 70 % speed. At its first checkpoint
    (10 min of work) moving pays (the gang rule: 10 min x 0.3/0.7 on its 8 GPUs against a 2 min restart), so b
    moves to the node a freed and runs at full speed: fewer straggler GPU-hours than staying, and never for a
    scheduler without kelvin's operator."""
    from scheduler_plugin.simulator.jobs.remediation import Remediation

    jf, fleet, poor = _one_poor_node(2)
    jobs = [JobSpec("a", 0.0, 300.0, 1, 8), JobSpec("b", 1.0, 3600.0, 1, 8)]

    def run(rem: Remediation) -> RunMetrics:
        return simulate_jobs(
            jobs, jf, build_scheduler("kelvin-pod", jf, 1), seed=1, fleet=fleet, poor=poor, remediation=rem
        )

    stay, moved = run(Remediation(max_moves=0)), run(Remediation())
    b_stay, b_moved = stay.jobs[1], moved.jobs[1]
    assert b_stay.moves == 0 and b_stay.straggler_gpu_hours == pytest.approx((3600 / 0.7 - 3600) * 8 / 3600)
    assert b_moved.moves == 1
    # moved at its first checkpoint: 600 s run at 70 % keep 420 s of work (180 s lost to the slowdown), then the
    # 120 s restart, on 8 GPUs
    assert b_moved.straggler_gpu_hours == pytest.approx((600 - 600 * 0.7 + 120) * 8 / 3600)
    assert b_moved.finished is not None and b_stay.finished is not None and b_moved.finished < b_stay.finished
    # the decision is the operator's gang rule
    assert Remediation().verdict(1, 8, 600.0, 0.7).move and not Remediation().verdict(1, 8, 540.0, 0.7).move
    tas = simulate_jobs(jobs, jf, build_scheduler("tas-greedy", jf, 1), seed=1, fleet=fleet, poor=poor)
    assert all(o.moves == 0 for o in tas.jobs)
    rows = {r["scheduler"]: r for r in aggregate([moved, tas])}
    assert rows["kelvin-pod"]["straggler_moves"] == 1 and rows["tas-greedy"]["straggler_moves"] == 0


def test_a_straggling_job_is_not_moved_when_no_cooler_node_has_room_for_it() -> None:
    """a holds the well cooled node for 2 h; b runs on the poorly cooled one. Moving b at a checkpoint would free its
    node and put it back there (the only room): it would pay the lost work and the restart and throttle again (the
    old rule moved it twice, for more straggler GPU-hours than staying). The move is priced at the straggler's speed
    where it would land, so b stays."""
    from scheduler_plugin.simulator.jobs.remediation import Remediation, cooler_place

    jf, fleet, poor = _one_poor_node(2)
    jobs = [JobSpec("a", 0.0, 7200.0, 1, 8), JobSpec("b", 1.0, 3600.0, 1, 8)]
    m = simulate_jobs(jobs, jf, build_scheduler("kelvin-pod", jf, 1), seed=1, fleet=fleet, poor=poor)
    a, b = m.jobs
    assert a.straggler is False and b.straggler is True
    assert b.moves == 0 and b.straggler_gpu_hours == pytest.approx((3600 / 0.7 - 3600) * 8 / 3600)
    # at its first checkpoint moving pays towards a cooler place, not back to a throttling one
    assert Remediation().verdict(1, 8, 600.0, 0.7).move and not Remediation().verdict(1, 8, 600.0, 0.7, 0.7).move
    # the room check counts the GPUs the job frees on well cooled nodes, and only whole pods
    free = np.array([0, 0, 4])
    cool = np.array([False, False, False])
    assert not cooler_place(free, ~cool, [(2, 4)], 1, 8)  # every node poorly cooled
    assert not cooler_place(free, cool, [], 1, 8)  # 4 whole free GPUs: no room for a pod of 8
    assert cooler_place(free, cool, [(2, 4)], 1, 8)  # its own 4 GPUs on node 2 come free: 8
    assert not cooler_place(free, np.array([True, False, False]), [(0, 8)], 2, 4)  # its 8 free on a poor node
