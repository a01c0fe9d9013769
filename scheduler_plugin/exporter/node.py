"""A node reading as the shared model (:class:`GpuNode`), for ``/v1/node``. Pure: no NVML here."""

from __future__ import annotations

import math

from ..model import GpuInfo, GpuNode, GpuProcess
from ..model.catalogue import defaults_for
from ..model.node_topology import nvlink_peers, pcie_switches
from .reader import NodeReading


def to_gpu_node(reading: NodeReading) -> GpuNode:
    switches = pcie_switches({g.index: g.topology for g in reading.gpus})
    peers = nvlink_peers(
        {g.index: {int(link.peer) for link in g.links if link.up and link.peer.isdigit()} for g in reading.gpus},
        {g.index for g in reading.gpus if any(link.up and link.peer == "nvswitch" for link in g.links)},
    )
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
