"""The job simulator's fleet: trace nodes grouped into racks, the topology levels the planner sees, the thermal
scenario's poorly cooled nodes, and releasing a finished pod's GPUs.

Racks: neither public node list says where nodes sit, so racks are assumed: the nodes of one GPU model and GPU count,
in file order, are cut into racks of ``rack_nodes`` (default 16: 128 GPUs per rack of 8-GPU nodes), each labelled
``kelvin.dev/rack``. Inside a node the GPUs of 8-GPU nodes share NVLink (NVSwitch); smaller nodes have none. Above
the racks there is one spine.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...gang.levels import GangPolicy, TopologyLevel
from ...gang.topology import Domains, build_domains
from ...model import GIB, FleetArrays, GpuInfo, GpuNode, build_arrays
from ..fleet import known_gpu_memory_bytes
from ..trace import TraceError, TraceNode, load_nodes

RACK_LABEL = "kelvin.dev/rack"
DEFAULT_RACK_NODES = 16
#: Memory of a GPU whose model kelvin does not know (the spot trace's anonymised "GPU-series-1/2"); whole-GPU jobs
#: never look at it.
UNKNOWN_GPU_MEMORY = 80 * GIB
SPOT_COLUMNS = ("gpu_model", "gpu_capacity_num", "cpu_num", "node_name")

GANG_POLICY = GangPolicy(levels=(TopologyLevel(name="rack", label=RACK_LABEL),))


@dataclass(frozen=True, slots=True)
class JobFleet:
    nodes: tuple[GpuNode, ...]
    fleet: FleetArrays
    domains: Domains
    rack_of: np.ndarray
    """(N,) rack id per row."""
    rack_nodes: int
    racks: int

    @property
    def capacity_gpus(self) -> int:
        return int(self.fleet.gpu_count.sum())

    def describe(self) -> str:
        eight = int((self.fleet.gpu_count == 8).sum())
        return (
            f"{self.fleet.n_nodes} nodes, {self.capacity_gpus} GPUs ({eight} 8-GPU nodes); racks: {self.racks}, "
            f"of up to {self.rack_nodes} consecutive nodes of one GPU model and size (assumed)"
        )


def _read_spot(path: Path) -> list[TraceNode]:
    text = path.read_text(encoding="utf-8")
    out = []
    for row, rec in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        try:
            gpus = int(rec["gpu_capacity_num"])
            cpus = int(rec["cpu_num"])
        except (TypeError, ValueError):
            raise TraceError(f"{path}: row {row}: gpu_capacity_num and cpu_num must be integers") from None
        model = (rec["gpu_model"] or "").strip()
        mem = known_gpu_memory_bytes(model) or UNKNOWN_GPU_MEMORY
        out.append(TraceNode(f"spot-{rec['node_name'].strip()}", cpus * 1000, 1024 * GIB, gpus, model, mem))
    return out


def load_trace_nodes(path: Path) -> list[TraceNode]:
    """The spot-GPU node list (``gpu_model,gpu_capacity_num,cpu_num,node_name``), openb's, or kelvin's own."""
    try:
        header = path.read_text(encoding="utf-8").partition("\n")[0]
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the node list ({exc.strerror or exc})") from None
    spot = all(c in header.split(",") for c in SPOT_COLUMNS)
    nodes = _read_spot(path) if spot else load_nodes(path)
    nodes = [n for n in nodes if n.gpus > 0]
    if not nodes:
        raise TraceError(f"{path}: no GPU nodes")
    return nodes


def racks_of(nodes: Sequence[TraceNode], rack_nodes: int) -> list[str]:
    """Rack name per node: nodes of one (model, GPU count), in order, cut into racks of ``rack_nodes``."""
    seen: dict[tuple[str, int], int] = {}
    out = []
    for n in nodes:
        k = (n.model, n.gpus)
        i = seen.get(k, 0)
        seen[k] = i + 1
        out.append(f"{n.model}x{n.gpus}-r{i // rack_nodes:03d}")
    return out


def build_job_fleet(trace_nodes: Sequence[TraceNode], rack_nodes: int = DEFAULT_RACK_NODES) -> JobFleet:
    racks = racks_of(trace_nodes, rack_nodes)
    nodes = []
    for tn, rack in zip(trace_nodes, racks, strict=True):
        mem = tn.gpu_memory_bytes or known_gpu_memory_bytes(tn.model) or UNKNOWN_GPU_MEMORY
        k = tn.gpus
        gpus = tuple(
            GpuInfo(
                index=j,
                uuid=f"{tn.name}-gpu{j}",
                model=tn.model,
                memory_total_bytes=mem,
                nvlink_peers=frozenset(i for i in range(k) if i != j) if k >= 8 else frozenset(),
                power_watts=60.0,
                thermal_resistance_c_per_w=0.03,
            )
            for j in range(k)
        )
        nodes.append(
            GpuNode(
                name=tn.name,
                gpus=gpus,
                cpu_allocatable_milli=tn.cpu_milli,
                memory_allocatable_bytes=tn.memory_bytes,
                labels={RACK_LABEL: rack},
                observed_at=0.0,
            )
        )
    fleet = build_arrays(nodes)
    labels: list[Mapping[str, str]] = [n.labels for n in nodes]
    domains = build_domains(fleet.names, labels, GANG_POLICY)
    rack_ids = domains.ids[domains.level_index("rack")]
    return JobFleet(tuple(nodes), fleet, domains, rack_ids, rack_nodes, domains.count(1))


@dataclass(frozen=True, slots=True)
class CoolingScenario:
    """Poorly cooled nodes: idle they look like the others; under load they settle near slowdown and throttle."""

    poor_share: float = 0.10
    """Share of GPU nodes that are poorly cooled (drawn per seed)."""
    poor_resistance_c_per_w: float = 0.15
    """°C per watt above idle of a poorly cooled GPU (a well cooled one: 0.03): idle at 40 °C, it settles at
    40 + 0.15 * (400 - 60) = 91 °C under a pod, past its 90 °C slowdown; a well cooled one at 50 °C."""
    load_power_w: float = 400.0
    straggler_speed: float = 0.7
    """Clock ratio of a throttling GPU: a job with a member there runs at this speed (DEVELOPERS.md: 30-50 %)."""


def apply_cooling(jf: JobFleet, sc: CoolingScenario, seed: int) -> tuple[FleetArrays, np.ndarray]:
    """A copy of the fleet whose telemetry shows the scenario (cooling quality, one busy GPU per model so the typical
    power under load is known) and the (N,) mask of poorly cooled nodes."""
    fleet = jf.fleet.copy()
    rng = np.random.default_rng([seed, 7])
    poor = rng.random(fleet.n_nodes) < sc.poor_share
    r = np.where(poor[:, None], sc.poor_resistance_c_per_w, 0.03)
    fleet.thermal_resistance = np.where(fleet.gpu_present, r, np.nan)
    fleet.power = np.where(fleet.gpu_present, 60.0, np.nan)
    fleet.util = np.zeros_like(fleet.util)
    for m in range(len(fleet.models)):  # one busy GPU per model tells the thermal policy what a pod draws
        rows, cols = np.nonzero(fleet.model_id == m)
        if rows.size:
            fleet.power[rows[0], cols[0]] = sc.load_power_w
            fleet.util[rows[0], cols[0]] = 0.9
    fleet.cooling_samples = np.where(fleet.gpu_present, -1, 0).astype(np.int32)
    return fleet, poor
