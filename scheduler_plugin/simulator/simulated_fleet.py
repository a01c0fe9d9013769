"""A simulated GPU fleet: a telemetry source for the demo, benchmarks, tests and development without a cluster.

Nodes come in groups of one shape (GPU model, count, NVLink topology, NUMA nodes, PCIe switches, cooling), from CLI
flags (:meth:`FleetSpec.uniform`) or a YAML fleet file (:meth:`FleetSpec.from_yaml`), for example::

    seed: 7
    initialLoad: 0.35          # share of GPUs already busy with pods placed before kelvin started
    groups:
      - {count: 3000, gpus: 8, model: H100-SXM-80GB, topology: nvswitch, poorCoolingFraction: 0.05}
      - {count: 1500, gpus: 8, model: A100-SXM4-80GB, topology: hybrid-cube-mesh}
      - {count: 500, gpus: 4, model: L40S-48GB, topology: pcie, numaNodes: 2, pcieSwitches: 2}

Load comes from the source's own record of placements: pods placed before start (``initialLoad``) and every bind the
extender reports through :meth:`SimulatedFleetSource.record_binding`; each appears in ``GpuNode.assignments`` and
drives utilisation, memory use and, through :mod:`.thermal_model`, temperature, throttling and clocks. Nodes with poor
cooling run hot under the same load. Each GPU reports its temperature trend, the slope over the last few simulated
minutes (``TREND_WINDOW_S``), so a fleet running faster than the wall clock still reports true slopes. Everything
random comes from one seeded generator: the same seed and the same sequence of calls give the same fleet.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from .. import yamlfile
from ..model import GIB, MILLI_PER_GPU, GpuAssignment, GpuInfo, GpuNode
from ..model.catalogue import CATALOGUE, resolve
from ..model.claim import charged_milli
from ..settings import error_message
from ..textfile import TextFileError, read_text
from . import thermal_model as tm

FloatA = npt.NDArray[np.float64]
TopologyKind = Literal["nvswitch", "hybrid-cube-mesh", "nvlink-pairs", "pcie"]

DRIVER_OVERHEAD_BYTES = GIB // 2
#: Memory pools (GiB) that pods placed before start use on shared GPUs.
_SHARED_POOLS_GIB = (8, 10, 16, 20, 24, 40)
#: Simulated seconds are capped per fetch, so a paused process does not jump an hour ahead.
MAX_STEP_S = 300.0
#: The temperature trend reported is the slope over about this many simulated seconds (what a telemetry pipeline
#: derives from its history; the snapshot cache's default window), sampled every ``TREND_SAMPLE_S``.
TREND_WINDOW_S = 300.0
TREND_SAMPLE_S = 30.0
#: No trend is reported before the history spans this long (a slope over a few seconds is mostly noise).
TREND_MIN_S = 10.0
#: Nodes turned into ``GpuNode`` objects between two awaits of ``pause`` in :meth:`SimulatedFleetSource.fetch`
#: (8 GPUs: ~0.3 ms).
FETCH_SLICE_NODES = 8


class FleetSpecError(ValueError):
    """A fleet file or fleet flags that cannot be used; the message names the field path."""


class _Spec(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True, allow_inf_nan=False
    )


class NodeGroup(_Spec):
    """``count`` nodes of one shape."""

    count: int = Field(ge=1, le=100_000)
    gpus: int = Field(8, ge=1, le=16)
    model: str = Field("H100-SXM-80GB", min_length=1)
    memory_gib: float | None = Field(None, gt=0, le=1024)
    """GPU memory; default: the catalogue's size of the model (80 for H100-SXM-80GB), read as GiB."""
    topology: TopologyKind = "nvswitch"
    """``nvswitch``: all-to-all NVLink; ``hybrid-cube-mesh``: DGX-1 style (8 GPUs); ``nvlink-pairs``: bridged
    pairs; ``pcie``: no NVLink."""
    numa_nodes: int = Field(2, ge=1, le=8)
    pcie_switches: int = Field(4, ge=1, le=16)
    poor_cooling_fraction: float = Field(0.0, ge=0, le=1)
    """Share of the group's nodes with poor cooling (they settle 15-30 C hotter at full load), rounded to whole
    nodes."""
    name_prefix: str = Field("gpu-node-", pattern=r"^[a-z0-9]([-a-z0-9.]*)?$")
    cpu_cores: int = Field(128, ge=1)
    host_memory_gib: int = Field(2048, ge=1)

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        """Only catalogue models with thermal figures (any name :func:`~scheduler_plugin.model.catalogue.resolve`
        reads, returned as the catalogue key): an unknown name would silently get another model's physics."""
        return resolve(v, simulated=True).key

    def gpu_memory_bytes(self) -> int:
        if self.memory_gib is not None:
            return int(self.memory_gib * GIB)
        return CATALOGUE[self.model].memory_gb * GIB


class FleetSpec(_Spec):
    seed: int = Field(0, ge=0)  # numpy's generator takes a non-negative seed
    ambient_c: float = Field(28.0, ge=-10, le=50)
    initial_load: float = Field(0.35, ge=0, lt=1)
    """Share of GPUs busy at start with pods kelvin did not place (whole GPUs and memory-pool shares)."""
    time_scale: float = Field(1.0, gt=0, le=10_000)
    """Simulated seconds per wall-clock second (the demo speeds heating up)."""
    xid_rate_per_gpu_hour: float = Field(0.002, ge=0)
    groups: list[NodeGroup] = Field(min_length=1)

    @property
    def n_nodes(self) -> int:
        return sum(g.count for g in self.groups)

    @classmethod
    def uniform(cls, nodes: int, gpus: int = 8, model: str = "H100-SXM-80GB", seed: int = 0, **extra: Any) -> FleetSpec:
        """The default mix for ``nodes`` nodes of ``gpus`` GPUs: 60 % NVSwitch, 25 % hybrid cube mesh (8 GPUs; bridged
        pairs otherwise), 15 % PCIe-only; 6 % of nodes with poor cooling."""
        mesh: TopologyKind = "hybrid-cube-mesh" if gpus == 8 else "nvlink-pairs"
        n_mesh = nodes * 25 // 100
        n_pcie = nodes * 15 // 100
        n_sw = nodes - n_mesh - n_pcie
        shapes: list[tuple[int, TopologyKind]] = [(n_sw, "nvswitch"), (n_mesh, mesh), (n_pcie, "pcie")]
        groups = [
            {"count": n, "gpus": gpus, "model": model, "topology": topo, "poorCoolingFraction": 0.06}
            for n, topo in shapes
            if n > 0
        ]
        return cls.parse({"seed": seed, "groups": groups, **extra}, source="fleet flags")

    @classmethod
    def parse(cls, data: Any, *, source: str) -> FleetSpec:
        if not isinstance(data, dict):
            raise FleetSpecError(f"{source}: must be a mapping at the top level, got {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {error_message(e)}" for e in exc.errors()
            )
            raise FleetSpecError(f"{source}: {problems}") from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> FleetSpec:
        p = Path(path)
        try:
            data = yamlfile.safe_load(read_text(p, "fleet file"))
        except TextFileError as exc:
            raise FleetSpecError(str(exc)) from None
        except yaml.YAMLError as exc:
            raise FleetSpecError(f"{p}: not valid YAML ({yamlfile.describe(exc)})") from None
        return cls.parse(data, source=str(p))


def nvlink_peers(topology: TopologyKind, gpus: int) -> list[frozenset[int]]:
    """NVLink peers of each GPU index for a topology."""
    if topology == "nvswitch":
        return [frozenset(j for j in range(gpus) if j != i) for i in range(gpus)]
    if topology == "hybrid-cube-mesh" and gpus == 8:
        # DGX-1: two fully connected quads (0-3, 4-7), plus i <-> i+4.
        return [frozenset({q * 4 + k for k in range(4)} - {i} | {(i + 4) % 8}) for i in range(8) for q in [i // 4]]
    if topology in ("hybrid-cube-mesh", "nvlink-pairs"):
        return [frozenset({i ^ 1} & set(range(gpus))) for i in range(gpus)]
    return [frozenset() for _ in range(gpus)]


@dataclass(slots=True)
class _Placement:
    group: int
    row: int
    cols: tuple[int, ...]
    util: float
    mem: int
    assignment: GpuAssignment


@dataclass(slots=True)
class _Group:
    spec: NodeGroup
    names: list[str]
    params: tm.ThermalParams
    cooling: FloatA  # (n,)
    state: tm.ThermalState  # (n, g)
    load: FloatA  # (n, g) utilisation demanded by placements (may exceed 1; clipped when used)
    mem_used: npt.NDArray[np.int64]  # (n, g)
    util: FloatA  # (n, g) last observed utilisation
    xid: npt.NDArray[np.int64]  # (n, g)
    peers: list[frozenset[int]]
    numa: list[int]
    switch: list[str]
    mem_total: int
    assignments: list[list[GpuAssignment]] = field(default_factory=list)
    uuids: list[list[str]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    history: deque[tuple[float, FloatA]] = field(default_factory=deque)
    """(simulated time, temperatures) samples for the trend, oldest first."""
    trend: FloatA | None = None
    """(n, g) °C per simulated minute over the trend window; None until the history is long enough."""

    def update_trend(self, now_s: float) -> None:
        """Record the temperatures at simulated time ``now_s`` and recompute the trend against the oldest sample
        of the window. In simulated time: a fleet running faster than the wall clock still reports true slopes (the
        snapshot cache would divide by wall-clock minutes, ``timeScale`` times too steep)."""
        temp = self.state.temp_c
        if not self.history or now_s - self.history[-1][0] >= TREND_SAMPLE_S:
            self.history.append((now_s, temp.copy()))
        while len(self.history) > 1 and now_s - self.history[1][0] >= TREND_WINDOW_S:
            self.history.popleft()
        base_s, base = self.history[0]
        span = now_s - base_s
        self.trend = (temp - base) * (60.0 / span) if span >= TREND_MIN_S else None


@dataclass(slots=True)
class _GroupReading:
    """One group's telemetry at one moment (see :meth:`SimulatedFleetSource._freeze`), turned into nodes by slices."""

    grp: _Group
    at: float
    temps: FloatA
    bits: npt.NDArray[np.int64]
    clocks: FloatA
    power: FloatA
    util: FloatA
    mem_util: FloatA
    mem_used: npt.NDArray[np.int64]
    xid: npt.NDArray[np.int64]
    trend: FloatA | None
    assignments: list[tuple[GpuAssignment, ...]]

    def nodes(self, lo: int, hi: int) -> list[GpuNode]:
        """The ``GpuNode`` objects of rows ``lo`` to ``hi`` (exclusive)."""
        grp, g, p = self.grp, self.grp.spec, self.grp.params
        spec = CATALOGUE[g.model]
        sl = slice(lo, hi)
        bits = self.bits[sl].tolist()
        clocks = self.clocks[sl].tolist()
        power = self.power[sl].tolist()
        temps_l = self.temps[sl].tolist()
        util_l = self.util[sl].tolist()
        mem_l = self.mem_used[sl].tolist()
        xid_l = self.xid[sl].tolist()
        mem_util = self.mem_util[sl].tolist()
        trend = self.trend[sl].tolist() if self.trend is not None else [[0.0] * g.gpus] * len(temps_l)
        cpu_milli = g.cpu_cores * 1000
        host_mem = g.host_memory_gib * GIB
        nodes = []
        for r, name in enumerate(grp.names[sl]):
            uuids = grp.uuids[lo + r]
            gpus = tuple(
                GpuInfo(
                    index=j,
                    uuid=uuids[j],
                    model=g.model,
                    memory_total_bytes=grp.mem_total,
                    memory_used_bytes=mem_l[r][j],
                    temperature_celsius=temps_l[r][j],
                    slowdown_celsius=p.throttle_onset_c,  # where the simulated clocks drop (see SimThermal)
                    shutdown_celsius=spec.shutdown_celsius,
                    throttle_reasons=bits[r][j],
                    sm_clock_mhz=clocks[r][j],
                    sm_clock_max_mhz=p.max_clock_mhz,
                    utilization=util_l[r][j],
                    memory_utilization=mem_util[r][j],
                    power_watts=power[r][j],
                    xid_errors=xid_l[r][j],
                    numa_node=grp.numa[j],
                    pcie_switch=grp.switch[j],
                    nvlink_peers=grp.peers[j],
                    temperature_trend_c_per_min=trend[r][j],
                )
                for j in range(g.gpus)
            )
            assigned = self.assignments[lo + r]
            busy = sum(len(a.gpu_indices) for a in assigned)
            nodes.append(
                GpuNode(
                    name=name,
                    gpus=gpus,
                    cpu_allocatable_milli=cpu_milli,
                    memory_allocatable_bytes=host_mem,
                    cpu_requested_milli=min(cpu_milli, busy * 8000),
                    memory_requested_bytes=min(host_mem, busy * 64 * GIB),
                    assignments=assigned,
                    labels=grp.labels,  # shared by the group's nodes, never mutated
                    observed_at=self.at,
                )
            )
        return nodes


async def _yield_once() -> None:
    await asyncio.sleep(0)


class SimulatedFleetSource:
    """A :class:`~scheduler_plugin.telemetry.source.TelemetrySource` over a simulated fleet."""

    name = "simulated"

    def __init__(self, spec: FleetSpec, *, clock: Callable[[], float] = time.time) -> None:
        self.spec = spec
        self._clock = clock
        self._rng = np.random.default_rng(spec.seed)
        self._lock = threading.Lock()
        self._groups: list[_Group] = []
        self._where: dict[str, tuple[int, int]] = {}
        self._placements: dict[str, _Placement] = {}
        self._build()
        self._last = clock()
        self._sim_s = 0.0
        """Simulated seconds since start."""
        self.pause: Callable[[], Awaitable[None]] = _yield_once
        """Awaited between slices of :meth:`fetch`; the extender sets its request gate's ``pause`` here."""

    @classmethod
    def uniform(
        cls, nodes: int, gpus: int = 8, model: str = "H100-SXM-80GB", seed: int = 0, **extra: Any
    ) -> SimulatedFleetSource:
        return cls(FleetSpec.uniform(nodes, gpus, model, seed, **extra))

    # -- construction ------------------------------------------------------------------------------------------

    def _build(self) -> None:
        counters: dict[str, int] = {}
        for gi, g in enumerate(self.spec.groups):
            names: list[str] = []
            for _ in range(g.count):
                counters[g.name_prefix] = counters.get(g.name_prefix, 0) + 1
                name = f"{g.name_prefix}{counters[g.name_prefix]}"
                if name in self._where:
                    raise FleetSpecError(f"groups.{gi}.namePrefix: node name {name!r} is used by two groups")
                self._where[name] = (gi, len(names))
                names.append(name)
            params = tm.profile_for(g.model).with_ambient(self.spec.ambient_c)
            # exactly the documented share (rounded), on nodes drawn at random: a binomial draw would give a 48-node
            # group anywhere from 2 to 13 poorly cooled nodes at 15 %
            poor = np.zeros(g.count, dtype=np.bool_)
            poor[self._rng.permutation(g.count)[: round(g.count * g.poor_cooling_fraction)]] = True
            cooling = np.where(poor, self._rng.uniform(0.72, 0.85, g.count), self._rng.uniform(0.95, 1.12, g.count))
            shape = (g.count, g.gpus)
            self._groups.append(
                _Group(
                    spec=g,
                    names=names,
                    params=params,
                    cooling=cooling,
                    state=tm.ThermalState.initial(shape, params, cooling=cooling[:, None], rng=self._rng),
                    load=np.zeros(shape),
                    mem_used=np.full(shape, DRIVER_OVERHEAD_BYTES, dtype=np.int64),
                    util=np.zeros(shape),
                    xid=np.zeros(shape, dtype=np.int64),
                    peers=nvlink_peers(g.topology, g.gpus),
                    numa=[i * g.numa_nodes // g.gpus for i in range(g.gpus)],
                    switch=[f"pcie-sw{i * g.pcie_switches // g.gpus}" for i in range(g.gpus)],
                    mem_total=g.gpu_memory_bytes(),
                    assignments=[[] for _ in range(g.count)],
                    uuids=[[f"GPU-{name}-{j}" for j in range(g.gpus)] for name in names],
                    labels={"nvidia.com/gpu.product": g.model, "kelvin.dev/simulated": "true"},
                )
            )
        self._place_initial_load()
        for grp in self._groups:  # start settled at the initial load
            u = np.clip(grp.load, 0, 1)
            grp.util = u
            grp.state = tm.settle(u, grp.cooling[:, None], grp.params, grp.state.drift_c)
            grp.update_trend(0.0)

    def _place_initial_load(self) -> None:
        load = self.spec.initial_load
        if load <= 0:
            return
        for gi, grp in enumerate(self._groups):
            draws = self._rng.random(grp.load.shape)
            whole = np.argwhere(draws < load * 0.7)
            shared = np.argwhere((draws >= load * 0.7) & (draws < load))
            for row, col in whole.tolist():
                a = GpuAssignment(pod_key=f"preexisting/{grp.names[row]}-g{col}", gpu_indices=(col,))
                self._add(gi, row, a)
            pools = self._rng.choice(_SHARED_POOLS_GIB, size=(len(shared), 3))
            for (row, col), sizes in zip(shared.tolist(), pools.tolist(), strict=True):
                free = grp.mem_total
                for k, size_gib in enumerate(sizes):
                    pool = size_gib * GIB
                    if pool > free or (k > 0 and self._rng.random() < 0.4):
                        break
                    free -= pool
                    a = GpuAssignment(
                        pod_key=f"preexisting/{grp.names[row]}-g{col}-s{k}",
                        gpu_indices=(col,),
                        milli=None,  # a pool without a compute share, as claim_of records one
                        memory_bytes=pool,
                    )
                    self._add(gi, row, a)

    # -- placements --------------------------------------------------------------------------------------------

    def _add(self, gi: int, row: int, a: GpuAssignment) -> None:
        grp = self._groups[gi]
        cols = tuple(i for i in a.gpu_indices if 0 <= i < grp.spec.gpus)
        if len(cols) != len(a.gpu_indices):
            raise ValueError(f"node {grp.names[row]} has no GPU {sorted(set(a.gpu_indices) - set(cols))}")
        share = charged_milli(a, grp.mem_total) / MILLI_PER_GPU  # a memory pool occupies at least its share
        intensity = float(self._rng.uniform(0.55, 1.0))
        util = share * intensity
        if a.memory_bytes is not None:
            mem = int(a.memory_bytes * self._rng.uniform(0.6, 1.0))
        else:
            mem = int(grp.mem_total * share * self._rng.uniform(0.5, 0.95))
        for c in cols:
            grp.load[row, c] += util
            grp.mem_used[row, c] = min(grp.mem_total, grp.mem_used[row, c] + mem)
        grp.assignments[row].append(a)
        self._placements[a.pod_key] = _Placement(gi, row, cols, util, mem, a)

    def record_binding(self, node: str, assignment: GpuAssignment) -> None:
        """The extender bound ``assignment`` to ``node``: from now on it loads those GPUs and shows in telemetry.
        Re-recording a pod moves it. Raises :class:`KeyError` for an unknown node."""
        with self._lock:
            where = self._where.get(node)
            if where is None:
                raise KeyError(f"the simulated fleet has no node {node!r}")
            self._remove(assignment.pod_key)
            self._add(where[0], where[1], assignment)

    def release(self, pod_key: str) -> bool:
        """The pod finished or was deleted: free its GPUs. True if it was placed."""
        with self._lock:
            return self._remove(pod_key)

    def _remove(self, pod_key: str) -> bool:
        p = self._placements.pop(pod_key, None)
        if p is None:
            return False
        grp = self._groups[p.group]
        for c in p.cols:
            grp.load[p.row, c] = max(0.0, grp.load[p.row, c] - p.util)
            grp.mem_used[p.row, c] = max(DRIVER_OVERHEAD_BYTES, grp.mem_used[p.row, c] - p.mem)
        grp.assignments[p.row] = [a for a in grp.assignments[p.row] if a.pod_key != pod_key]
        return True

    def placements(self) -> dict[str, tuple[str, GpuAssignment]]:
        """Pod key -> (node, assignment) for every pod the fleet runs."""
        with self._lock:
            return {k: (self._groups[p.group].names[p.row], p.assignment) for k, p in self._placements.items()}

    @property
    def node_names(self) -> list[str]:
        return [n for g in self._groups for n in g.names]

    # -- time --------------------------------------------------------------------------------------------------

    def advance(self, dt_s: float) -> None:
        """Advance simulated time by ``dt_s`` seconds: utilisation jitter, heating/cooling, drift, rare XIDs."""
        if dt_s <= 0:
            return
        with self._lock:
            for grp in self._groups:
                busy = grp.load > 0
                jitter = self._rng.normal(0.0, 0.03, grp.load.shape)
                grp.util = np.where(busy, np.clip(grp.load + jitter, 0.02, 1.0), 0.0)
                grp.state = tm.step(
                    grp.state, grp.util, grp.cooling[:, None], dt_s=dt_s, params=grp.params, rng=self._rng
                )
                grp.update_trend(self._sim_s + dt_s)
                p_xid = self.spec.xid_rate_per_gpu_hour * dt_s / 3600.0
                if p_xid > 0:
                    grp.xid += (self._rng.random(grp.xid.shape) < p_xid).astype(np.int64)
            self._sim_s += dt_s

    def snapshot_nodes(self, observed_at: float | None = None) -> list[GpuNode]:
        """The fleet as telemetry would report it now (no time passes)."""
        at = self._clock() if observed_at is None else observed_at
        with self._lock:
            views = [self._freeze(grp, at) for grp in self._groups]
        return [nd for v in views for nd in v.nodes(0, len(v.grp.names))]

    def _freeze(self, grp: _Group, at: float) -> _GroupReading:
        """What telemetry reads from a group at ``at``: copies, so placements made meanwhile do not tear it."""
        p = grp.params
        temps = grp.state.temp_c
        return _GroupReading(
            grp=grp,
            at=at,
            temps=np.round(temps, 1),
            bits=tm.throttle_bits(temps, grp.util, p),
            clocks=tm.sm_clock_mhz(temps, grp.util, p),
            power=tm.power_w(grp.util, p, tm.clock_ratio(temps, p)),  # a throttled GPU draws less, as in the model
            util=np.round(grp.util, 3),
            mem_util=np.round(np.clip(grp.util * 0.6, 0.0, 1.0), 3).astype(np.float64),
            mem_used=grp.mem_used.copy(),
            xid=grp.xid.copy(),
            trend=None if grp.trend is None else grp.trend.copy(),  # unrounded: the cache replaces exact zeros
            assignments=[tuple(a) for a in grp.assignments],
        )

    # -- TelemetrySource ---------------------------------------------------------------------------------------

    async def fetch(self) -> Sequence[GpuNode]:
        """Advance the simulation to now and read the fleet. The ``GpuNode`` objects are made on the event loop,
        ``FETCH_SLICE_NODES`` nodes per slice with :attr:`pause` awaited in between (in the extender, the request
        gate's: it lets requests in between turns of slices and guarantees the fetch its share of the loop)."""
        now = self._clock()
        dt = min(MAX_STEP_S, max(0.0, now - self._last) * self.spec.time_scale)
        self._last = now

        def read() -> list[_GroupReading]:
            self.advance(dt)
            with self._lock:
                return [self._freeze(grp, now) for grp in self._groups]

        views = await asyncio.to_thread(read)  # numpy only: a few milliseconds, mostly without the GIL
        out: list[GpuNode] = []
        for v in views:
            for lo in range(0, len(v.grp.names), FETCH_SLICE_NODES):
                out.extend(v.nodes(lo, lo + FETCH_SLICE_NODES))
                await self.pause()
        return out

    async def close(self) -> None:
        return None
