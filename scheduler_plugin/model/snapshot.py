"""An immutable snapshot of the fleet, and its columnar (numpy) view that every policy scores over.

Policies are vectorised over nodes: the extender scores 5,000 nodes per request and the simulator replays ten
thousand arrivals, so per-node Python loops are kept off the hot path. ``FleetArrays`` holds one row per node and one
column per GPU slot (padded to the largest node; ``gpu_present`` masks the padding).
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field, fields, replace
from typing import Any, Generic, TypeVar, cast

import numpy as np
import numpy.typing as npt

from .claim import SlotCharges
from .gpu import GIB, MILLI_PER_GPU, GpuAssignment, GpuNode
from .gpu_models import matches_any

BoolA = npt.NDArray[np.bool_]
IntA = npt.NDArray[np.int64]
I32A = npt.NDArray[np.int32]
FloatA = npt.NDArray[np.float64]
T = TypeVar("T")

#: Memory in use below this is treated as driver overhead, not a tenant.
DEFAULT_IDLE_USED_BYTES = 1 * GIB


def assigned_memory(a: GpuAssignment, memory_total: int) -> int:
    """GPU memory an assignment holds on one of its GPUs: its pool, else its share of the GPU's memory (a whole GPU
    holds all of it; a compute-only share of ``milli`` thousandths holds that share of the memory). The scalar form of
    what :class:`~.claim.SlotCharges` computes over arrays (used by the preemption overlay)."""
    if a.memory_bytes is not None:
        return a.memory_bytes
    return memory_total * min(a.milli or 0, MILLI_PER_GPU) // MILLI_PER_GPU


@dataclass(frozen=True, slots=True)
class Lineage:
    """How a ledger overlay's capacity was made from the overlay before it (:meth:`FleetArrays.with_assumed_on`):
    its ``own`` columns (:data:`LINEAGE_COLUMNS`, in that order) hold the ``parent``'s columns' content but at
    ``rows``, and neither set is ever written (read-only arrays owning their data). A reader that knows the parent's
    content compares these rows instead of the whole columns
    (:mod:`~scheduler_plugin.policies.fragmentation.row_stamps`)."""

    parent: tuple[npt.NDArray[Any], ...]
    own: tuple[npt.NDArray[Any], ...]
    rows: IntA


LINEAGE_COLUMNS = ("free_milli", "free_mem", "tenants")
"""The per-GPU columns a :class:`Lineage` names (written by :meth:`FleetArrays.charge`, read by the row memos)."""


def sealed(a: npt.NDArray[Any]) -> bool:
    """Whether ``a`` can no longer change: read-only and owning its data (so not a view of a writable array)."""
    return not a.flags.writeable and bool(a.flags.owndata)


@dataclass(slots=True)
class FleetArrays:
    """Columnar view of a fleet. Row ``i`` is node ``names[i]``; column ``j`` is ``nodes[i].gpus[j]``."""

    names: tuple[str, ...]
    index: dict[str, int]
    gpu_present: BoolA  # (N, G)
    gpu_index: I32A  # (N, G) the GPU's own index (-1 for padding)
    mem_total: IntA  # (N, G) bytes
    mem_used: IntA  # (N, G) bytes, from telemetry
    assigned_milli: I32A  # (N, G) thousandths assigned by kelvin (records + ledger)
    assigned_mem: IntA  # (N, G) bytes of memory pools assigned by kelvin
    free_milli: I32A  # (N, G) thousandths still free (0 for padding)
    free_mem: IntA  # (N, G) bytes still free (0 for padding)
    tenants: I32A  # (N, G) kelvin assignments sharing the GPU
    temp: FloatA  # (N, G) Celsius
    slowdown: FloatA  # (N, G) Celsius
    shutdown: FloatA  # (N, G) Celsius
    trend: FloatA  # (N, G) Celsius per minute
    throttle: IntA  # (N, G) reason bitmask
    util: FloatA  # (N, G) 0..1
    mem_util: FloatA  # (N, G) 0..1
    clock_ratio: FloatA  # (N, G) 0..1
    power: FloatA  # (N, G) watts, NaN when unknown
    thermal_resistance: FloatA  # (N, G) Celsius per watt above idle (cooling quality), NaN when unknown
    cooling_samples: I32A  # (N, G) readings thermal_resistance was learned from: 0 assumed, -1 reported
    cooling_since: FloatA  # (N, G) unix time of the first of them, NaN when not learned
    xid: I32A  # (N, G)
    numa: I32A  # (N, G)
    switch: I32A  # (N, G) interned PCIe switch id (-1 unknown)
    nvlink: BoolA  # (N, G, G) slot j reaches slot k over NVLink
    model_id: I32A  # (N, G) index into ``models`` (-1 padding)
    models: tuple[str, ...]
    gpu_count: I32A  # (N,)
    cpu_free: IntA  # (N,) millicores
    mem_free_host: IntA  # (N,) bytes
    observed_at: FloatA  # (N,) unix time, NaN when never seen
    mps: BoolA  # (N,)
    derived: SnapshotIndex = field(default_factory=lambda: SnapshotIndex(), repr=False, compare=False)
    """What policies derive from the telemetry columns, computed once per snapshot (:meth:`derive`)."""
    lineage: Lineage | None = field(default=None, repr=False, compare=False)
    """Set on a ledger overlay made from the one before it (:meth:`with_assumed_on`); ``None`` otherwise."""

    @property
    def n_nodes(self) -> int:
        return len(self.names)

    @property
    def max_gpus(self) -> int:
        return int(self.gpu_present.shape[1])

    def model_ids(self, models: Iterable[str]) -> set[int]:
        """Ids of the fleet's models that one of ``models`` (items of ``kelvin.dev/gpu-models``) matches, by the
        rules of :mod:`.gpu_models` (``A100`` matches ``NVIDIA A100-SXM4-80GB``)."""
        items = frozenset(models)
        return {i for i, m in enumerate(self.models) if matches_any(items, m)}

    def copy(self) -> FleetArrays:
        """A deep copy whose arrays can be mutated (the simulator places pods into it)."""
        kwargs: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "derived":
                continue
            v = getattr(self, f.name)
            kwargs[f.name] = v.copy() if isinstance(v, np.ndarray) else (dict(v) if isinstance(v, dict) else v)
        out = FleetArrays(**kwargs)
        out.derived = self.derived.rebound(out)
        return out

    def derive(self, key: IndexKey[T], compute: Callable[[FleetArrays], T], param: Hashable = None) -> T:
        """``compute(self)``, once per snapshot: kept in the snapshot index under (``key``, ``param``) while the
        columns ``key`` names are the same array objects. Overlays (:meth:`with_assumed`) share the index; copies
        (:meth:`copy`) take its entries over; a fleet of other rows (a preemption variant built field by field)
        gets an index of its own."""
        index = self.derived
        if index.rows is None:
            index.rows = self.names
        elif index.rows is not self.names:
            index = self.derived = SnapshotIndex(self.names)
        return index.get(self, key, compute, param)

    def with_assumed(self, assumed: Mapping[str, Sequence[GpuAssignment]]) -> FleetArrays:
        """A view with extra (assumed, not yet visible) assignments subtracted from free capacity.

        Only the capacity arrays are copied; everything else is shared with ``self``. Vectorised over the
        assignments' GPUs (the extender rebuilds this view after every bind, with every assignment of the ledger's
        TTL in it): charged by :meth:`charge`; nodes the fleet does not hold are skipped.
        """
        if not assumed:
            return self
        out = replace(self, lineage=None)
        for name in _CAPACITY_COLUMNS:
            setattr(out, name, getattr(self, name).copy())
        index = self.index
        out.charge((index[node], a) for node, entries in assumed.items() if node in index for a in entries)
        out._seal()
        return out

    def _seal(self) -> None:
        """Make the capacity columns an overlay owns read-only: a view is never written after it is made (a write
        raises), which is what lets readers trust an unchanged column object (:func:`sealed`)."""
        for name in _CAPACITY_COLUMNS:
            getattr(self, name).flags.writeable = False

    def with_assumed_on(
        self, base: FleetArrays, assumed: Mapping[str, Sequence[GpuAssignment]], nodes: Iterable[str]
    ) -> FleetArrays:
        """This view of ``base`` (``base.with_assumed(old)``) after the assumed lists of ``nodes`` changed to their
        lists in ``assumed`` (a node missing there: none left): the same arrays as ``base.with_assumed(assumed)``
        when no other node's list changed, at the cost of those nodes only. Their rows are taken back to ``base``'s
        capacity and charged their whole lists (a charge touches its own row only, and one clamp after each row's
        sum is what the full rebuild does)."""
        index = base.index
        known = [n for n in nodes if n in index]
        if not known:
            return self
        rows = np.fromiter(map(index.__getitem__, known), dtype=np.int64, count=len(known))
        out = replace(self, lineage=None)
        for name in _CAPACITY_COLUMNS:
            col = getattr(self, name).copy()
            col[rows] = getattr(base, name)[rows]
            setattr(out, name, col)
        out.charge((index[n], a) for n in known for a in assumed.get(n, ()))
        out._seal()
        parent = tuple(getattr(self, c) for c in LINEAGE_COLUMNS)
        if all(map(sealed, parent)):
            out.lineage = Lineage(parent, tuple(getattr(out, c) for c in LINEAGE_COLUMNS), np.unique(rows))
        return out

    def charge(self, claims: Iterable[tuple[int, GpuAssignment]], sign: int = 1) -> int:
        """Charge ``claims`` ((row, record) pairs) against this fleet's capacity in place: kelvin's assigned share,
        memory and tenants up, free share and memory down, by :class:`~.claim.SlotCharges` (the one charge of a
        claim, as the snapshot builder records it). ``sign=-1`` gives them back. Returns the thousandths charged.

        The simulators place pods into their mutable copy of the fleet with it; the extender's overlay is
        :meth:`with_assumed`."""
        c = SlotCharges.of(self.gpu_index, self.mem_total, claims)
        if len(c):
            c.record(self.assigned_milli, self.assigned_mem, self.tenants, sign)
            c.take(self.free_milli, self.free_mem, self.mem_total, sign)
        return int(c.milli.sum())


_CAPACITY_COLUMNS = ("free_milli", "free_mem", "assigned_milli", "assigned_mem", "tenants")
"""The columns :meth:`FleetArrays.charge` writes."""

_GPU_COLUMNS: tuple[tuple[str, str], ...] = (
    # (FleetArrays field, GpuInfo attribute) copied as they are
    ("gpu_index", "index"),
    ("mem_total", "memory_total_bytes"),
    ("mem_used", "memory_used_bytes"),
    ("temp", "temperature_celsius"),
    ("slowdown", "slowdown_celsius"),
    ("shutdown", "shutdown_celsius"),
    ("trend", "temperature_trend_c_per_min"),
    ("throttle", "throttle_reasons"),
    ("util", "utilization"),
    ("mem_util", "memory_utilization"),
    ("xid", "xid_errors"),
    ("numa", "numa_node"),
)
_GPU_ATTRS = tuple(operator.attrgetter(attr) for _, attr in _GPU_COLUMNS)
_SM_CLOCK = operator.attrgetter("sm_clock_mhz")
_SM_CLOCK_MAX = operator.attrgetter("sm_clock_max_mhz")
_SWITCH = operator.attrgetter("pcie_switch")
_MODEL = operator.attrgetter("model")
_NVLINK = operator.attrgetter("nvlink_peers")
_INDEX = operator.attrgetter("index")
_POWER = operator.attrgetter("power_watts")
_RESISTANCE = operator.attrgetter("thermal_resistance_c_per_w")


def _unfit(nodes: Sequence[GpuNode], attr: str, dtype: np.dtype[Any]) -> str:
    """Which GPU's ``attr`` does not fit the snapshot's ``dtype`` column (the error path of a build: a source passed
    a value its own checks should have refused), for a message that names it."""
    for nd in nodes:
        for gp in nd.gpus:
            value = getattr(gp, attr)
            try:
                np.array([value], dtype=dtype)
            except (OverflowError, TypeError, ValueError):
                return f"node {nd.name} GPU {gp.index}: {attr} {value!r} does not fit the snapshot ({dtype})"
    return f"a value of {attr} does not fit the snapshot ({dtype})"


class ArraysBuilder:
    """Builds the :class:`FleetArrays` of ``nodes`` a slice of rows at a time (:meth:`fill`), then :meth:`finish`.

    Each slice is vectorised over its GPUs (one C-level attribute sweep per column), so the cost is a few
    microseconds per GPU; the snapshot cache fills a few hundred nodes per event-loop turn, so that building a
    40,000-GPU snapshot never holds up a request for more than about a millisecond. Interned ids (models, PCIe
    switches) are numbered in order of first appearance, whatever the slicing.
    """

    def __init__(self, nodes: Sequence[GpuNode], idle_used_bytes: int = DEFAULT_IDLE_USED_BYTES) -> None:
        self.nodes = nodes
        self.idle_used_bytes = idle_used_bytes
        self.filled = 0
        """Rows filled so far (``fill`` goes in order)."""
        n = len(nodes)
        g = max(max((len(nd.gpus) for nd in nodes), default=0), 1)
        shape = (n, g)
        self.cols: dict[str, npt.NDArray[Any]] = {
            "gpu_index": np.full(shape, -1, dtype=np.int32),
            "mem_total": np.zeros(shape, dtype=np.int64),
            "mem_used": np.zeros(shape, dtype=np.int64),
            "temp": np.zeros(shape, dtype=np.float64),
            "slowdown": np.full(shape, np.inf, dtype=np.float64),
            "shutdown": np.full(shape, np.inf, dtype=np.float64),
            "trend": np.zeros(shape, dtype=np.float64),
            "throttle": np.zeros(shape, dtype=np.int64),
            "util": np.zeros(shape, dtype=np.float64),
            "mem_util": np.zeros(shape, dtype=np.float64),
            "xid": np.zeros(shape, dtype=np.int32),
            "numa": np.full(shape, -1, dtype=np.int32),
        }
        self.present = np.zeros(shape, dtype=np.bool_)
        self.clock_ratio = np.ones(shape, dtype=np.float64)
        self.power = np.full(shape, np.nan, dtype=np.float64)
        self.thermal_resistance = np.full(shape, np.nan, dtype=np.float64)
        self.cooling_samples = np.full(shape, -1, dtype=np.int32)
        self.cooling_since = np.full(shape, np.nan, dtype=np.float64)
        self.switch = np.full(shape, -1, dtype=np.int32)
        self.model_id = np.full(shape, -1, dtype=np.int32)
        self.nvlink = np.zeros((n, g, g), dtype=np.bool_)
        self.assigned_milli = np.zeros(shape, dtype=np.int32)
        self.assigned_mem = np.zeros(shape, dtype=np.int64)
        self.tenants = np.zeros(shape, dtype=np.int32)
        self.gpu_count = np.zeros(n, dtype=np.int32)
        self.cpu_free = np.zeros(n, dtype=np.int64)
        self.mem_free_host = np.zeros(n, dtype=np.int64)
        self.observed_at = np.full(n, np.nan, dtype=np.float64)
        self.mps = np.zeros(n, dtype=np.bool_)
        self.models: dict[str, int] = {}
        self.switches: dict[str, int] = {}
        self._links: dict[tuple[tuple[int, ...], tuple[frozenset[int], ...]], BoolA | None] = {}

    def _nvlink_of(self, nd: GpuNode) -> BoolA | None:
        """(k, k) NVLink matrix of the node's slots (None without links); one per distinct wiring (nodes share a
        few)."""
        key = (tuple(map(_INDEX, nd.gpus)), tuple(map(_NVLINK, nd.gpus)))
        if key in self._links:
            return self._links[key]
        col_of = {gi: j for j, gi in enumerate(key[0])}
        m = np.zeros((len(nd.gpus), len(nd.gpus)), dtype=np.bool_)
        for j, peers in enumerate(key[1]):
            for peer in peers:
                k = col_of.get(peer)
                if k is not None:
                    m[j, k] = m[k, j] = True
        links = m if m.any() else None
        self._links[key] = links
        return links

    def fill(self, lo: int, hi: int) -> None:
        """Fill rows ``lo`` to ``hi`` (exclusive); slices must come in order, without gaps."""
        if lo != self.filled:
            raise ValueError(f"rows must be filled in order: next is {self.filled}, got {lo}")
        hi = min(hi, len(self.nodes))
        if hi <= lo:
            return
        nodes = self.nodes[lo:hi]
        counts = np.fromiter(map(len, (nd.gpus for nd in nodes)), dtype=np.int64, count=len(nodes))
        self.gpu_count[lo:hi] = counts
        for i, nd in enumerate(nodes, start=lo):
            self.cpu_free[i] = nd.cpu_free_milli
            self.mem_free_host[i] = nd.memory_free_bytes
            if nd.observed_at is not None:
                self.observed_at[i] = nd.observed_at
            self.mps[i] = nd.mps_enabled
            m = self._nvlink_of(nd)
            if m is not None:
                k = m.shape[0]
                self.nvlink[i, :k, :k] = m
        gpus = [gp for nd in nodes for gp in nd.gpus]
        total = len(gpus)
        self.filled = hi
        if total == 0:
            return
        starts = np.cumsum(counts) - counts
        rows = np.repeat(np.arange(lo, hi, dtype=np.int64), counts)
        cols = np.arange(total, dtype=np.int64) - np.repeat(starts, counts)
        self.present[rows, cols] = True
        for (name, attr), get in zip(_GPU_COLUMNS, _GPU_ATTRS, strict=True):
            arr = self.cols[name]
            try:
                arr[rows, cols] = np.fromiter(map(get, gpus), dtype=arr.dtype, count=total)
            except (OverflowError, TypeError, ValueError):
                raise ValueError(_unfit(nodes, attr, arr.dtype)) from None
        clock = np.fromiter(map(_SM_CLOCK, gpus), dtype=np.float64, count=total)
        clock_max = np.fromiter(map(_SM_CLOCK_MAX, gpus), dtype=np.float64, count=total)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.clock_ratio[rows, cols] = np.where(clock_max > 0, np.minimum(1.0, clock / clock_max), 1.0)
        self.power[rows, cols] = [np.nan if w is None else w for w in map(_POWER, gpus)]
        self.thermal_resistance[rows, cols] = [np.nan if r is None else r for r in map(_RESISTANCE, gpus)]
        sw, mo = self.switches, self.models
        self.switch[rows, cols] = [sw.setdefault(s, len(sw)) if s else -1 for s in map(_SWITCH, gpus)]
        self.model_id[rows, cols] = [mo.setdefault(m, len(mo)) for m in map(_MODEL, gpus)]
        self._fill_assignments(nodes, lo)

    def _fill_assignments(self, nodes: Sequence[GpuNode], lo: int) -> None:
        claims = ((i, a) for i, nd in enumerate(nodes, start=lo) for a in nd.assignments)
        charges = SlotCharges.of(self.cols["gpu_index"], self.cols["mem_total"], claims)
        charges.record(self.assigned_milli, self.assigned_mem, self.tenants)

    def finish(self) -> FleetArrays:
        """The arrays, once every row is filled."""
        if self.filled != len(self.nodes):
            raise ValueError(f"{len(self.nodes) - self.filled} rows are not filled yet")
        c = self.cols
        present, mem_total, mem_used = self.present, c["mem_total"], c["mem_used"]
        # Telemetry occupancy: memory in use beyond driver overhead occupies that share of the GPU even when kelvin
        # did not place it (pods of another scheduler, leaks). Capacity is the tighter of kelvin's record and
        # telemetry.
        used_counted = np.where(mem_used > self.idle_used_bytes, mem_used, 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            used_milli = np.where(mem_total > 0, np.ceil(used_counted * MILLI_PER_GPU / np.maximum(mem_total, 1)), 0)
        occupied = np.maximum(self.assigned_milli, used_milli.astype(np.int32))
        free_milli = np.where(present, np.clip(MILLI_PER_GPU - occupied, 0, MILLI_PER_GPU), 0).astype(np.int32)
        free_mem = np.where(present, np.clip(mem_total - np.maximum(used_counted, self.assigned_mem), 0, None), 0)
        names = tuple(nd.name for nd in self.nodes)
        models = self.models
        return FleetArrays(
            names=names,
            index={nm: i for i, nm in enumerate(names)},
            gpu_present=present,
            gpu_index=c["gpu_index"],
            mem_total=mem_total,
            mem_used=mem_used,
            assigned_milli=self.assigned_milli,
            assigned_mem=self.assigned_mem,
            free_milli=free_milli,
            free_mem=free_mem.astype(np.int64),
            tenants=self.tenants,
            temp=c["temp"],
            slowdown=c["slowdown"],
            shutdown=c["shutdown"],
            trend=c["trend"],
            throttle=c["throttle"],
            util=c["util"],
            mem_util=c["mem_util"],
            clock_ratio=self.clock_ratio,
            power=self.power,
            thermal_resistance=self.thermal_resistance,
            cooling_samples=self.cooling_samples,
            cooling_since=self.cooling_since,
            xid=c["xid"],
            numa=c["numa"],
            switch=self.switch,
            nvlink=self.nvlink,
            model_id=self.model_id,
            models=tuple(sorted(models, key=lambda m: models[m])),
            gpu_count=self.gpu_count,
            cpu_free=self.cpu_free,
            mem_free_host=self.mem_free_host,
            observed_at=self.observed_at,
            mps=self.mps,
        )


def _no_columns(_: FleetArrays) -> tuple[object, ...]:
    return ()


def _columns_reader(columns: tuple[str, ...]) -> Callable[[FleetArrays], tuple[object, ...]]:
    """A function giving the tuple of a fleet's ``columns`` (``attrgetter`` of one name gives the bare value)."""
    if not columns:
        return _no_columns
    get = operator.attrgetter(*columns)
    if len(columns) == 1:
        return lambda fleet: (get(fleet),)
    return cast(Callable[[FleetArrays], tuple[object, ...]], get)


class IndexKey(Generic[T]):
    """A kind of entry of the :class:`SnapshotIndex`: its name (for counts and messages), the telemetry columns its
    value is derived from, and how many parametrised entries (``param`` of :meth:`FleetArrays.derive`) it may keep
    per snapshot (``None``: unbounded; a bound keeps request-shaped parameters from growing the index without end).

    Keys compare by identity: a plugin whose values depend on its arguments makes a key of its own."""

    __slots__ = ("columns", "limit", "name", "read")

    def __init__(self, name: str, columns: tuple[str, ...], limit: int | None = None) -> None:
        self.name = name
        self.columns = columns
        self.limit = limit
        self.read: Callable[[FleetArrays], tuple[object, ...]] = _columns_reader(columns)
        """The tuple of ``columns`` of a fleet (one C-level ``attrgetter``: the index is looked up ~15 times per
        simulated arrival, and a generator over the names cost a third of a lookup)."""

    def __repr__(self) -> str:
        return f"IndexKey({self.name!r})"


class SnapshotIndex:
    """Per-snapshot derived data: what policies compute from the telemetry columns of a :class:`FleetArrays` (masks
    of GPUs that break a thermal limit, static eligibility per request shape, wiring patterns, thermal quality ...),
    computed once per published snapshot and attached to it (``FleetArrays.derived``).

    Each entry remembers the column arrays it was computed from and is recomputed when one of them is a different
    object (a column replaced). Telemetry columns are never written in place (the simulator writes only the
    capacity columns of its working copy), so an entry stays valid for every cycle on the snapshot, its ledger
    overlays and its copies. ``computed`` counts the computations per key name (tests and benchmarks read it)."""

    __slots__ = ("_entries", "computed", "rows")

    def __init__(self, rows: tuple[str, ...] | None = None) -> None:
        self.rows = rows
        """The ``names`` tuple of the fleet the index describes (bound on first use)."""
        self._entries: dict[IndexKey[Any], dict[Hashable, tuple[tuple[object, ...], object]]] = {}
        self.computed: Counter[str] = Counter()

    def get(self, fleet: FleetArrays, key: IndexKey[T], compute: Callable[[FleetArrays], T], param: Hashable) -> T:
        cols = key.read(fleet)
        family = self._entries.get(key)
        if family is None:
            family = self._entries[key] = {}
        hit = family.get(param)
        if hit is not None and all(map(operator.is_, hit[0], cols)):  # same length: both read by ``key.read``
            return cast(T, hit[1])
        value = compute(fleet)
        self.computed[key.name] += 1
        if hit is None and key.limit is not None and len(family) >= key.limit:
            family.clear()
        family[param] = (cols, value)
        return value

    def rebound(self, fleet: FleetArrays) -> SnapshotIndex:
        """The entries, for ``fleet``: a copy whose columns hold the same content (``FleetArrays.copy``)."""
        out = SnapshotIndex(fleet.names)
        for key, family in self._entries.items():
            cols = key.read(fleet)
            out._entries[key] = {p: (cols, v) for p, (_, v) in family.items()}
        return out

    def __len__(self) -> int:
        return sum(map(len, self._entries.values()))

    def __reduce__(self) -> tuple[type[SnapshotIndex], tuple[()]]:
        """Pickled empty: keys compare by identity, so entries would not be found in another process anyway."""
        return (SnapshotIndex, ())


def stale_mask(observed_at: FloatA, now: float, max_age_s: float) -> BoolA:
    """Per node: telemetry older than ``max_age_s`` at ``now``, or never seen (``observed_at`` NaN). The one
    definition of staleness (the framework's cycle context and the snapshot's reports)."""
    age = now - observed_at
    return np.asarray(~(age <= max_age_s), dtype=np.bool_)  # NaN compares False -> stale


def build_arrays(nodes: Sequence[GpuNode], idle_used_bytes: int = DEFAULT_IDLE_USED_BYTES) -> FleetArrays:
    """Build the columnar view of ``nodes``. Cost is linear in GPUs; done once per snapshot, off the hot path."""
    b = ArraysBuilder(nodes, idle_used_bytes)
    b.fill(0, len(nodes))
    return b.finish()


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What scoring reads: the fleet at one moment. Never mutated; a refresh publishes a new one."""

    nodes: tuple[GpuNode, ...]
    taken_at: float
    source: str = "unknown"
    source_healthy: bool = True
    arrays: FleetArrays = field(init=False, repr=False, compare=False)
    by_name: Mapping[str, GpuNode] = field(init=False, repr=False, compare=False)

    prebuilt: InitVar[FleetArrays | None] = None
    """Arrays already built from ``nodes`` (the snapshot cache builds them in slices); default: built here."""

    def __post_init__(self, prebuilt: FleetArrays | None) -> None:
        if prebuilt is not None and prebuilt.names != tuple(nd.name for nd in self.nodes):
            raise ValueError("prebuilt arrays do not match the snapshot's nodes")
        object.__setattr__(self, "arrays", prebuilt if prebuilt is not None else build_arrays(self.nodes))
        object.__setattr__(self, "by_name", {nd.name: nd for nd in self.nodes})

    def node(self, name: str) -> GpuNode | None:
        return self.by_name.get(name)

    def stale_mask(self, now: float, max_age_s: float) -> BoolA:
        """Per node: telemetry older than ``max_age_s`` or never seen."""
        return stale_mask(self.arrays.observed_at, now, max_age_s)

    def stale_nodes(self, now: float, max_age_s: float) -> list[str]:
        mask = self.stale_mask(now, max_age_s)
        return [self.arrays.names[i] for i in np.nonzero(mask)[0]]

    def age_seconds(self, now: float) -> float:
        return max(0.0, now - self.taken_at) if math.isfinite(self.taken_at) else math.inf


def empty_snapshot(source: str = "none") -> Snapshot:
    return Snapshot(nodes=(), taken_at=float("-inf"), source=source, source_healthy=False)
