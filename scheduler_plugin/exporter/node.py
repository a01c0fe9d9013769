"""A node reading as the shared model (:class:`GpuNode`), for ``/v1/node``. Pure: no NVML here."""

from __future__ import annotations

import math

import pynvml

from ..model import GpuInfo, GpuNode, GpuProcess
from ..telemetry.model_defaults import defaults_for
from .reader import GpuReading, NodeReading


def pcie_groups(gpus: tuple[GpuReading, ...]) -> dict[int, str]:
    """GPU index -> PCIe switch id: GPUs whose common ancestor is a PCIe switch (PIX/PXB) share one.

    The id names the group's lowest-indexed GPU (``pcie0``), as the Prometheus source names it from the same levels.
    """
    parent = {g.index: g.index for g in gpus}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for g in gpus:
        for peer, level in g.topology.items():
            if peer in parent and level <= pynvml.NVML_TOPOLOGY_MULTIPLE:
                a, b = find(g.index), find(peer)
                parent[max(a, b)] = min(a, b)
    if not any(g.topology for g in gpus):
        return {g.index: "" for g in gpus}
    return {g.index: f"pcie{find(g.index)}" for g in gpus}


def nvlink_peers(gpus: tuple[GpuReading, ...]) -> dict[int, frozenset[int]]:
    """GPU index -> GPUs it reaches over an up NVLink: direct links, plus every GPU on the same NVSwitch fabric."""
    on_switch = {g.index for g in gpus if any(link.up and link.peer == "nvswitch" for link in g.links)}
    out: dict[int, frozenset[int]] = {}
    for g in gpus:
        direct = {int(link.peer) for link in g.links if link.up and link.peer.isdigit()}
        fabric = on_switch - {g.index} if g.index in on_switch else set()
        out[g.index] = frozenset(direct | fabric)
    return out


def to_gpu_node(reading: NodeReading) -> GpuNode:
    switches = pcie_groups(reading.gpus)
    peers = nvlink_peers(reading.gpus)
    gpus = []
    for g in reading.gpus:
        d = defaults_for(g.model)
        total = g.memory_total_bytes if g.memory_total_bytes is not None else d.memory_total_bytes
        used = g.memory_used_bytes if g.memory_used_bytes is not None else 0
        gpus.append(
            GpuInfo(
                index=g.index,
                uuid=g.uuid,
                model=g.model,
                memory_total_bytes=total,
                memory_used_bytes=used,
                temperature_celsius=g.temperature_celsius if g.temperature_celsius is not None else math.nan,
                memory_temperature_celsius=g.memory_temperature_celsius,
                slowdown_celsius=g.slowdown_celsius if g.slowdown_celsius is not None else d.slowdown_celsius,
                shutdown_celsius=g.shutdown_celsius if g.shutdown_celsius is not None else d.shutdown_celsius,
                throttle_reasons=g.clocks_event_reasons or 0,
                sm_clock_mhz=g.sm_clock_mhz or 0.0,
                sm_clock_max_mhz=g.sm_clock_max_mhz if g.sm_clock_max_mhz is not None else d.sm_clock_max_mhz,
                utilization=(g.utilization_percent or 0.0) / 100.0,
                memory_utilization=(g.memory_utilization_percent or 0.0) / 100.0,
                power_watts=g.power_watts,
                xid_errors=sum(n for (i, _), n in reading.xid_counts.items() if i == g.index),
                numa_node=g.numa_node if g.numa_node is not None else 0,
                pcie_switch=switches[g.index],
                nvlink_peers=peers[g.index],
                processes=tuple(
                    GpuProcess(p.pid, p.used_bytes or 0, p.pod_uid, p.namespace, p.pod) for p in g.processes or ()
                ),
            )
        )
    return GpuNode(name=reading.node, gpus=tuple(gpus), observed_at=reading.taken_at if reading.gpus else None)
