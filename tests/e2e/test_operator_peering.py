"""Two operator replicas, as the chart deploys them (``operator.replicas: 2``, kopf peering on the ClusterKopfPeering
the install created), each on the operator ServiceAccount's own token: exactly one acts, the other stands by, and
when the leader dies (SIGKILL: no goodbye) the other takes over. Asserted on the API objects: the peering object's
status, the node's taint and the Events' ``reportingInstance``."""

from __future__ import annotations

import time
from pathlib import Path

from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster
from tests.e2e.opharness import (
    GpuState,
    Replica,
    events,
    nodes_with_telemetry,
    peers,
    start_operator,
    thermal_taint,
)
from tests.e2e.test_operator_events import installed_operator_env

NODE = "e2e-op-peer-1"
#: kopf's peering lifetime (60 s, kopf's default; the chart sets none): a dead leader's entry expires after it.
PEERING_LIFETIME_S = 60


tel = nodes_with_telemetry((NODE,), "peering")


def _reported_by(cluster: LoopbackCluster, reason: str) -> list[str]:
    return [e.get("reportingInstance", "") for e in events(cluster, name=NODE, reason=reason)]


def test_two_replicas_one_leader_and_takeover(cluster: LoopbackCluster, tel: GpuState, tmp_path: Path) -> None:
    installed = installed_operator_env(cluster)
    # what the chart runs: peering on, with the peering object the install created
    assert installed["KELVIN_OPERATOR_STANDALONE"] == "false", installed
    peering = installed["KELVIN_OPERATOR_PEERING"]
    assert cluster.api.get_or_none(f"/apis/kopf.dev/v1/clusterkopfpeerings/{peering}") is not None
    replicas: dict[str, Replica] = {}
    try:
        for name in ("op-a", "op-b"):
            replicas[name] = start_operator(cluster, tel, tmp_path / name, name)

        def both_announced() -> dict[str, dict[str, object]] | None:
            for r in replicas.values():
                r.check_alive()
            found = peers(cluster, peering)
            return found if set(found) == set(replicas) else None

        status = wait_for("both replicas in the ClusterKopfPeering's status", both_announced, 60)
        priorities = {name: int(str(status[name]["priority"])) for name in replicas}
        assert len(set(priorities.values())) == 2, f"equal priorities pause every replica: {priorities}"
        leader = max(priorities, key=lambda n: priorities[n])
        (follower,) = set(replicas) - {leader}

        # a hot GPU: the leader taints the node, the follower does nothing
        tel.temperature(NODE, 3, 90)
        taint = wait_for("the thermal taint", lambda: thermal_taint(cluster, NODE), 60)
        assert taint == {"key": "kelvin.dev/thermal", "value": "hot", "effect": "NoSchedule",
                         "timeAdded": taint["timeAdded"]}  # fmt: skip
        hot_by = wait_for("Event KelvinNodeHot", lambda: _reported_by(cluster, "KelvinNodeHot"), 30)
        assert hot_by == [leader], f"KelvinNodeHot reported by {hot_by}, the leader is {leader}"
        (hot,) = events(cluster, name=NODE, reason="KelvinNodeHot")
        assert hot["type"] == "Warning" and "gpu 3: 90.0 °C" in hot["message"], hot
        time.sleep(6)  # three more cycles: the follower still posts nothing
        assert all(e.get("reportingInstance") != follower for e in events(cluster, name=NODE)), events(
            cluster, name=NODE
        )

        # the leader dies; the GPU cools; the follower takes over once the leader's entry expires, and lifts the taint
        replicas[leader].kill()
        killed = time.monotonic()
        tel.temperature(NODE, 3, 40)

        def lifted() -> bool:
            replicas[follower].check_alive()
            return thermal_taint(cluster, NODE) is None

        wait_for("the follower lifting the taint", lifted, PEERING_LIFETIME_S + 45, 0.5)
        took_over_s = time.monotonic() - killed
        # the Event follows the taint's removal (a separate API call): wait for it rather than read it once
        cooled_by = wait_for("Event KelvinNodeCooled", lambda: _reported_by(cluster, "KelvinNodeCooled"), 30)
        assert cooled_by == [follower], f"KelvinNodeCooled reported by {cooled_by}, the follower is {follower}"
        print(f"takeover after SIGKILL of the leader: {took_over_s:.1f} s (peering lifetime {PEERING_LIFETIME_S} s)")
        # the dead leader's entry is cleaned out of the peering object by the new leader
        wait_for("the dead leader gone from the peering", lambda: set(peers(cluster, peering)) == {follower}, 30)
    finally:
        for r in replicas.values():
            if r.alive():
                r.stop()
        tel.reset()
