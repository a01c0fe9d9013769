"""A network cost model of one ring all-reduce, for a job's communication slowdown.

The ring visits the job's GPUs in rank order (members in rank order, each member's GPUs in a row) and closes back
to the first. Each hop runs over the tightest link its two GPUs share:

* **NVLink** inside a node: ``nvlink_gbps`` per GPU (bus bandwidth);
* the **rack fabric** between nodes of one rack: ``rack_gbps`` per GPU (one NIC per GPU), divided among the ring's
  hops that leave the same node;
* the **spine** between racks: ``rack_gbps / oversubscription`` per GPU, divided among the ring's hops that leave
  the same rack (a rank-scattered ring leaves a rack many times and shares its uplinks).

A ring all-reduce of ``S`` bytes over ``p`` GPUs takes ``2 (p - 1) / p * S / B`` with ``B`` its slowest hop. The
slowdown of a placement is that time over the time of the tightest placement the job could have had (its members
on the fewest nodes, those in the fewest racks, ranks in order), so a job that must span two racks is not blamed
for the spine. A job's run time is ``duration * ((1 - f) + f * slowdown)``, ``f`` the share of a step spent
communicating when placed ideally.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Network:
    nvlink_gbps: float = 150.0
    rack_gbps: float = 25.0
    oversubscription: float = 4.0
    comm_share: float = 0.3
    """``f``: share of a step spent in all-reduce when the job is placed ideally."""

    def describe(self) -> str:
        return (
            f"ring all-reduce: NVLink {self.nvlink_gbps:g} GB/s per GPU in a node, rack fabric {self.rack_gbps:g} "
            f"GB/s per GPU, spine oversubscribed {self.oversubscription:g}:1; communication {self.comm_share:.0%} "
            "of an ideally placed step"
        )

    def ring_bandwidth(self, nodes: Sequence[int], racks: Sequence[int]) -> float:
        """Bandwidth of the slowest hop of a ring over GPUs on ``nodes`` (one entry per GPU, rank order) in
        ``racks``; ``inf`` for a single GPU."""
        p = len(nodes)
        if p <= 1:
            return float("inf")
        node_exits: Counter[int] = Counter()
        rack_exits: Counter[int] = Counter()
        hops = []
        for i in range(p):
            a, b = i, (i + 1) % p
            if nodes[a] == nodes[b]:
                hops.append(("nvlink", a))
            elif racks[a] == racks[b]:
                node_exits[nodes[a]] += 1
                hops.append(("rack", a))
            else:
                node_exits[nodes[a]] += 1
                rack_exits[racks[a]] += 1
                hops.append(("spine", a))
        best = float("inf")
        for kind, a in hops:
            if kind == "nvlink":
                bw = self.nvlink_gbps
            elif kind == "rack":
                bw = self.rack_gbps / max(1, node_exits[nodes[a]])
            else:
                bw = min(
                    self.rack_gbps / max(1, node_exits[nodes[a]]),
                    self.rack_gbps / self.oversubscription / max(1, rack_exits[racks[a]]),
                )
            best = min(best, bw)
        return best

    def ideal_bandwidth(self, members: int, gpus_per_member: int, node_gpus: int, rack_nodes: int) -> float:
        """The ring bandwidth of the tightest layout: members packed on nodes of ``node_gpus``, nodes in racks."""
        per_node = max(1, node_gpus // gpus_per_member) if gpus_per_member <= node_gpus else 1
        nodes, racks = [], []
        for m in range(members):
            node = m // per_node
            for _ in range(gpus_per_member):
                nodes.append(node)
                racks.append(node // rack_nodes)
        return self.ring_bandwidth(nodes, racks)

    def slowdown(self, actual_bw: float, ideal_bw: float) -> float:
        """Ring time over the ideal ring time, at least 1."""
        if actual_bw == float("inf") or actual_bw >= ideal_bw:
            return 1.0
        return ideal_bw / actual_bw

    def run_factor(self, slowdown: float) -> float:
        return (1.0 - self.comm_share) + self.comm_share * slowdown
