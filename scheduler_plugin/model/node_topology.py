"""A node's GPU topology from what telemetry reports, the same for every source (the exporter's ``/v1/node`` and the
Prometheus source read the same NVML levels and links): which GPUs share a PCIe switch, which reach each other
over NVLink. Pure.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

#: NVML topology levels (``nvmlDeviceGetTopologyCommonAncestor``) at or below which two GPUs share a PCIe switch:
#: ``NVML_TOPOLOGY_SINGLE`` (10, PIX) and ``NVML_TOPOLOGY_MULTIPLE`` (20, PXB).
SAME_SWITCH_LEVEL = 20


def pcie_switches(levels: Mapping[int, Mapping[int, float]]) -> dict[int, str]:
    """GPU index -> PCIe switch id, from each GPU's topology level to its peers (``levels[gpu][peer]``): GPUs whose
    common ancestor is a PCIe switch (level at most :data:`SAME_SWITCH_LEVEL`) share one, transitively. The id names
    the group's lowest-indexed GPU (``pcie0``); every id is ``""`` when no GPU reports a level."""
    parent = {i: i for i in levels}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for gpu, peers in levels.items():
        for peer, level in peers.items():
            if peer in parent and level <= SAME_SWITCH_LEVEL:
                a, b = find(gpu), find(peer)
                parent[max(a, b)] = min(a, b)
    if not any(levels.values()):
        return {i: "" for i in levels}
    return {i: f"pcie{find(i)}" for i in levels}


def nvlink_peers(direct: Mapping[int, Iterable[int]], on_nvswitch: Collection[int]) -> dict[int, frozenset[int]]:
    """GPU index -> the GPUs it reaches over NVLink: its direct links (``direct[gpu]``: peers of its up links), plus
    every other GPU on the node's NVSwitch fabric (``on_nvswitch``: the GPUs with an up link to an NVSwitch)."""
    fabric = frozenset(on_nvswitch)
    return {gpu: frozenset(peers) | (fabric - {gpu} if gpu in fabric else frozenset()) for gpu, peers in direct.items()}
