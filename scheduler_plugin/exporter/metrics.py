"""A node reading as Prometheus metric families (the exporter section of docs/metrics.md). Pure: no NVML here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..model import ThrottleReason
from ..nvml.events import COMMON_XIDS
from .reader import GpuReading, NodeReading

GPU_LABELS = ("node", "gpu", "uuid", "model")

#: (metric, help, GpuReading attribute, scale) for the plain per-GPU gauges that follow the workload.
_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("kelvin_gpu_memory_used_bytes", "Framebuffer memory in use.", "memory_used_bytes", 1.0),
    ("kelvin_gpu_memory_free_bytes", "Framebuffer memory free.", "memory_free_bytes", 1.0),
    ("kelvin_gpu_temperature_celsius", "GPU core temperature.", "temperature_celsius", 1.0),
    ("kelvin_gpu_memory_temperature_celsius", "HBM temperature.", "memory_temperature_celsius", 1.0),
    ("kelvin_gpu_clocks_event_reasons", "Raw NVML clocks-event (throttle) reason bitmask.", "clocks_event_reasons", 1),
    ("kelvin_gpu_sm_clock_hertz", "SM clock.", "sm_clock_mhz", 1e6),
    ("kelvin_gpu_utilization_ratio", "GPU (SM) utilisation, 0..1.", "utilization_percent", 0.01),
    ("kelvin_gpu_memory_utilization_ratio", "Memory-controller utilisation, 0..1.", "memory_utilization_percent", 0.01),
    ("kelvin_gpu_power_watts", "Power draw.", "power_watts", 1.0),
    ("kelvin_gpu_mig_instances", "MIG devices configured on the GPU.", "mig_devices", 1.0),
)

#: The same, for the gauges that change only with the hardware (see :func:`hardware_key`).
_HARDWARE_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("kelvin_gpu_memory_total_bytes", "Framebuffer memory of the GPU.", "memory_total_bytes", 1.0),
    (
        "kelvin_gpu_slowdown_temperature_celsius",
        "Temperature at which the GPU slows its clocks.",
        "slowdown_celsius",
        1,
    ),
    ("kelvin_gpu_shutdown_temperature_celsius", "Temperature at which the GPU shuts down.", "shutdown_celsius", 1.0),
    ("kelvin_gpu_sm_clock_max_hertz", "Maximum SM clock.", "sm_clock_max_mhz", 1e6),
    ("kelvin_gpu_numa_node", "NUMA node of the GPU.", "numa_node", 1.0),
)

#: Every GpuReading attribute that :func:`hardware_families` reads (besides ``links`` and ``topology``).
_HARDWARE_ATTRS = (
    "index",
    "uuid",
    "model",
    "pci_bus_id",
    "numa_node",
    "memory_total_bytes",
    "slowdown_celsius",
    "shutdown_celsius",
    "sm_clock_max_mhz",
    "mig_enabled",
)

PartKey = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class CachedPart:
    """Families whose rendering may be reused while ``key(reading)`` is unchanged: ``families`` reads nothing else."""

    name: str
    key: Callable[[NodeReading], PartKey]
    families: Callable[[NodeReading], Iterator[Metric]]


def _labels(node: str, g: GpuReading) -> list[str]:
    return [node, str(g.index), g.uuid, g.model]


def families(reading: NodeReading) -> Iterator[Metric]:
    """Every exporter metric family for ``reading``. Series whose value NVML did not support are absent."""
    for part in CACHED_PARTS:
        yield from part.families(reading)
    yield from dynamic_families(reading)


def _identity(reading: NodeReading) -> tuple[object, ...]:
    return (reading.node, tuple((g.index, g.uuid, g.model) for g in reading.gpus))


def throttle_key(reading: NodeReading) -> PartKey:
    """Everything :func:`throttle_families` renders from: the GPUs' labels and reason bitmasks."""
    return (*_identity(reading), tuple(g.clocks_event_reasons for g in reading.gpus))


def throttle_families(reading: NodeReading) -> Iterator[Metric]:
    """One 0/1 series per clocks-event reason: a function of the bitmask, which changes far less often than a scrape."""
    node = reading.node
    reasons = GaugeMetricFamily(
        "kelvin_gpu_clocks_event_reason_active",
        "1 while the clocks-event reason is active.",
        labels=[*GPU_LABELS, "reason"],
    )
    for g in reading.gpus:
        if g.clocks_event_reasons is not None:
            for r in ThrottleReason:
                reasons.add_metric([*_labels(node, g), str(r.name).lower()], 1.0 if g.clocks_event_reasons & r else 0.0)
    yield reasons


def xid_key(reading: NodeReading) -> PartKey:
    """Everything :func:`xid_families` renders from: the GPUs' labels and the XID counts."""
    return (*_identity(reading), tuple(sorted(reading.xid_counts.items())))


def xid_families(reading: NodeReading) -> Iterator[Metric]:
    """XID counts per GPU and code (the common codes always present, at 0 until seen); they move only on an XID."""
    node = reading.node
    xid = CounterMetricFamily(
        "kelvin_gpu_xid_errors", "XID errors seen through NVML events.", labels=[*GPU_LABELS, "xid"]
    )
    per_gpu: dict[int, dict[int, int]] = {}
    for (index, code), n in reading.xid_counts.items():
        per_gpu.setdefault(index, {})[code] = n
    for g in reading.gpus:
        seen = per_gpu.get(g.index, {})
        for code in sorted(set(COMMON_XIDS) | set(seen)):
            xid.add_metric([*_labels(node, g), str(code)], float(seen.get(code, 0)))
    yield xid


def hardware_key(reading: NodeReading) -> PartKey:
    """Everything :func:`hardware_families` renders from: equal keys give byte-identical static exposition.

    The values themselves are the key (not an NVML "generation"), so a cached rendering can never be stale: a link
    going down, a MIG mode change or a different GPU set simply gives a new key.
    """
    return (
        reading.node,
        reading.driver_version,
        tuple(
            (*(getattr(g, a) for a in _HARDWARE_ATTRS), g.links, tuple(sorted(g.topology.items())))
            for g in reading.gpus
        ),
    )


def hardware_families(reading: NodeReading) -> Iterator[Metric]:
    """The families that change only with the hardware: identity, thresholds, limits, MIG mode, NVLink, topology.

    Reads only what :func:`hardware_key` covers.
    """
    node = reading.node
    gpus = reading.gpus
    info = GaugeMetricFamily(
        "kelvin_gpu_info", "One series per GPU.", labels=[*GPU_LABELS, "driver_version", "pcie_bus_id", "numa_node"]
    )
    for g in gpus:
        numa = "" if g.numa_node is None else str(g.numa_node)
        info.add_metric([*_labels(node, g), reading.driver_version or "", g.pci_bus_id, numa], 1.0)
    yield info

    yield from _gauges(_HARDWARE_GAUGES, node, gpus)

    mig = GaugeMetricFamily("kelvin_gpu_mig_mode", "1 when MIG is enabled.", labels=GPU_LABELS)
    for g in gpus:
        if g.mig_enabled is not None:
            mig.add_metric(_labels(node, g), 1.0 if g.mig_enabled else 0.0)
    yield mig

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


def _gauges(
    specs: tuple[tuple[str, str, str, float], ...], node: str, gpus: tuple[GpuReading, ...]
) -> Iterator[Metric]:
    for name, help_text, attr, scale in specs:
        fam = GaugeMetricFamily(name, help_text, labels=GPU_LABELS)
        for g in gpus:
            value = getattr(g, attr)
            if value is not None:
                fam.add_metric(_labels(node, g), float(value) * scale)
        yield fam


#: The cacheable parts of a scrape; :func:`dynamic_families` is the rest.
CACHED_PARTS = (
    CachedPart("hardware", hardware_key, hardware_families),
    CachedPart("throttle", throttle_key, throttle_families),
    CachedPart("xid", xid_key, xid_families),
)


def dynamic_families(reading: NodeReading) -> Iterator[Metric]:
    """The families that follow the workload (everything outside :data:`CACHED_PARTS`); rendered on every scrape."""
    node = reading.node
    gpus = reading.gpus
    up = GaugeMetricFamily("kelvin_exporter_nvml_up", "1 when the last NVML collection succeeded.")
    up.add_metric([], 1.0 if reading.nvml_up else 0.0)
    yield up

    yield from _gauges(_GAUGES, node, gpus)

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
