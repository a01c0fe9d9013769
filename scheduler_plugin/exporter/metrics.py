"""A node reading as Prometheus metric families (the exporter section of docs/metrics.md). Pure: no NVML here."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..model import ThrottleReason
from .events import COMMON_XIDS
from .reader import GpuReading, NodeReading

GPU_LABELS = ("node", "gpu", "uuid", "model")

#: (metric, help, GpuReading attribute, scale) for the plain per-GPU gauges.
_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("kelvin_gpu_memory_total_bytes", "Framebuffer memory of the GPU.", "memory_total_bytes", 1.0),
    ("kelvin_gpu_memory_used_bytes", "Framebuffer memory in use.", "memory_used_bytes", 1.0),
    ("kelvin_gpu_memory_free_bytes", "Framebuffer memory free.", "memory_free_bytes", 1.0),
    ("kelvin_gpu_temperature_celsius", "GPU core temperature.", "temperature_celsius", 1.0),
    ("kelvin_gpu_memory_temperature_celsius", "HBM temperature.", "memory_temperature_celsius", 1.0),
    (
        "kelvin_gpu_slowdown_temperature_celsius",
        "Temperature at which the GPU slows its clocks.",
        "slowdown_celsius",
        1,
    ),
    ("kelvin_gpu_shutdown_temperature_celsius", "Temperature at which the GPU shuts down.", "shutdown_celsius", 1.0),
    ("kelvin_gpu_clocks_event_reasons", "Raw NVML clocks-event (throttle) reason bitmask.", "clocks_event_reasons", 1),
    ("kelvin_gpu_sm_clock_hertz", "SM clock.", "sm_clock_mhz", 1e6),
    ("kelvin_gpu_sm_clock_max_hertz", "Maximum SM clock.", "sm_clock_max_mhz", 1e6),
    ("kelvin_gpu_utilization_ratio", "GPU (SM) utilisation, 0..1.", "utilization_percent", 0.01),
    ("kelvin_gpu_memory_utilization_ratio", "Memory-controller utilisation, 0..1.", "memory_utilization_percent", 0.01),
    ("kelvin_gpu_power_watts", "Power draw.", "power_watts", 1.0),
    ("kelvin_gpu_numa_node", "NUMA node of the GPU.", "numa_node", 1.0),
    ("kelvin_gpu_mig_instances", "MIG devices configured on the GPU.", "mig_devices", 1.0),
)


def _labels(node: str, g: GpuReading) -> list[str]:
    return [node, str(g.index), g.uuid, g.model]


def families(reading: NodeReading) -> Iterator[Metric]:
    """Every exporter metric family for ``reading``. Series whose value NVML did not support are absent."""
    node = reading.node
    gpus = reading.gpus
    up = GaugeMetricFamily("kelvin_exporter_nvml_up", "1 when the last NVML collection succeeded.")
    up.add_metric([], 1.0 if reading.nvml_up else 0.0)
    yield up

    info = GaugeMetricFamily(
        "kelvin_gpu_info", "One series per GPU.", labels=[*GPU_LABELS, "driver_version", "pcie_bus_id", "numa_node"]
    )
    for g in gpus:
        numa = "" if g.numa_node is None else str(g.numa_node)
        info.add_metric([*_labels(node, g), reading.driver_version or "", g.pci_bus_id, numa], 1.0)
    yield info

    for name, help_text, attr, scale in _GAUGES:
        fam = GaugeMetricFamily(name, help_text, labels=GPU_LABELS)
        for g in gpus:
            value = getattr(g, attr)
            if value is not None:
                fam.add_metric(_labels(node, g), float(value) * scale)
        yield fam

    reasons = GaugeMetricFamily(
        "kelvin_gpu_clocks_event_reason_active",
        "1 while the clocks-event reason is active.",
        labels=[*GPU_LABELS, "reason"],
    )
    for g in gpus:
        if g.clocks_event_reasons is not None:
            for r in ThrottleReason:
                reasons.add_metric([*_labels(node, g), str(r.name).lower()], 1.0 if g.clocks_event_reasons & r else 0.0)
    yield reasons

    mig = GaugeMetricFamily("kelvin_gpu_mig_mode", "1 when MIG is enabled.", labels=GPU_LABELS)
    for g in gpus:
        if g.mig_enabled is not None:
            mig.add_metric(_labels(node, g), 1.0 if g.mig_enabled else 0.0)
    yield mig

    energy = CounterMetricFamily("kelvin_gpu_energy_joules", "Energy since the driver loaded.", labels=GPU_LABELS)
    replays = CounterMetricFamily("kelvin_gpu_pcie_replays", "PCIe replay counter.", labels=GPU_LABELS)
    ecc = CounterMetricFamily("kelvin_gpu_ecc_errors", "Volatile ECC errors.", labels=[*GPU_LABELS, "type"])
    for g in gpus:
        if g.energy_joules is not None:
            energy.add_metric(_labels(node, g), g.energy_joules)
        if g.pcie_replays is not None:
            replays.add_metric(_labels(node, g), float(g.pcie_replays))
        if g.ecc_corrected is not None:
            ecc.add_metric([*_labels(node, g), "corrected"], float(g.ecc_corrected))
        if g.ecc_uncorrected is not None:
            ecc.add_metric([*_labels(node, g), "uncorrected"], float(g.ecc_uncorrected))
    yield energy
    yield ecc
    yield replays

    xid = CounterMetricFamily(
        "kelvin_gpu_xid_errors", "XID errors seen through NVML events.", labels=[*GPU_LABELS, "xid"]
    )
    for g in gpus:
        seen = {code: n for (index, code), n in reading.xid_counts.items() if index == g.index}
        for code in sorted(set(COMMON_XIDS) | set(seen)):
            xid.add_metric([*_labels(node, g), str(code)], float(seen.get(code, 0)))
    yield xid

    links = GaugeMetricFamily(
        "kelvin_gpu_nvlink_link_up", "1 while the NVLink link is up.", labels=[*GPU_LABELS, "link", "peer_gpu"]
    )
    topo = GaugeMetricFamily(
        "kelvin_gpu_topology_level", "NVML topology level to a peer GPU.", labels=[*GPU_LABELS, "peer_gpu"]
    )
    for g in gpus:
        for link in g.links:
            links.add_metric([*_labels(node, g), str(link.link), link.peer], 1.0 if link.up else 0.0)
        for peer, level in sorted(g.topology.items()):
            topo.add_metric([*_labels(node, g), str(peer)], float(level))
    yield links
    yield topo

    procs = GaugeMetricFamily(
        "kelvin_gpu_process_memory_used_bytes",
        "GPU memory used by a process, attributed to its pod (needs hostPID).",
        labels=[*GPU_LABELS, "pid", "pod_uid", "namespace", "pod"],
    )
    for g in gpus:
        for p in g.processes or ():
            if p.used_bytes is not None:
                procs.add_metric(
                    [*_labels(node, g), str(p.pid), p.pod_uid or "", p.namespace or "", p.pod or ""],
                    float(p.used_bytes),
                )
    yield procs

    duration = GaugeMetricFamily("kelvin_exporter_collect_duration_seconds", "Time the last scrape's collection took.")
    duration.add_metric([], reading.duration_s)
    yield duration
