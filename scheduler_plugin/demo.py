"""``kelvin demo``: the extender on a simulated fleet, with pods streamed through it over HTTP as kube-scheduler would.

The extender runs in-process under uvicorn on a free loopback port, on a :class:`SimulatedFleetSource`. For each pod
of a realistic mix the demo does what kube-scheduler does with an extender (``nodeCacheCapable: true``):
``POST /filter`` with every node name, ``POST /prioritize`` with the survivors when two or more remain, picks the
highest score (ties broken at random, seeded), then ``POST /bind``. Bound pods load the simulated GPUs (they heat
up); some finish later and free them.

The scenario is built to show what a GPU-blind scheduler cannot see: the fleet starts part-full with scattered
memory-pool shares (fragmentation) and has poorly cooled nodes that throttle under load (``hot_nodes``). The same
pods then run through a GPU-blind baseline (random feasible node and GPUs, no thermal limits) for comparison.

Repeatable: the demo drives the fleet's clock itself (``step_s`` simulated seconds per pod, not the wall clock) and
refreshes the extender's snapshot before each pod, and the pod stream (shapes and lifetimes) is drawn up front from
``seed``; the same seed gives the same numbers, and kelvin and the baseline see the same pods.

The summary compares pods placed and refused, pods refused although the fleet had enough free GPUs in total
(fragmentation), GPUs stranded (free capacity too small for the smallest pod of the mix), placements on hot nodes
and GPU-minutes the placed pods spent on thermally throttling GPUs.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from .config import Settings
from .console import console as make_console
from .extender.app import build_extender, create_app
from .extender.binder import LocalBinder
from .extender.server import ServerThread
from .extender.service import Extender
from .model import GIB, MILLI_PER_GPU, THERMAL_THROTTLE_MASK, GpuAssignment, Snapshot
from .model import annotations as ann
from .policies.config import PolicyConfig
from .policies.plugins import PRODUCTION
from .policies.registry import Registry
from .simulator.baselines import SIMULATOR
from .telemetry.simulated import FleetSpec, SimulatedFleetSource

#: A node with a GPU within this many degrees of its slowdown threshold (or throttling) counts as hot.
HOT_MARGIN_C = 5.0
#: The smallest GPU memory any pod of the mix asks for; free capacity below it is stranded.
SMALLEST_REQUEST_BYTES = 10 * GIB
#: GPUs of each hot node busy at full power when the demo starts (a pre-existing job kelvin did not place).
HOT_NODE_BUSY_GPUS = 6
#: Where the demo's simulated clock starts (any fixed instant: only differences matter).
DEMO_EPOCH_S = 1_750_000_000.0


@dataclass(frozen=True, slots=True)
class PodShape:
    label: str
    gpus: int
    weight: float
    annotations: tuple[tuple[str, str], ...] = ()


MIX: tuple[PodShape, ...] = (
    PodShape("shared 10Gi", 1, 0.10, ((ann.GPU_MEMORY, "10Gi"),)),
    PodShape("shared 20Gi", 1, 0.12, ((ann.GPU_MEMORY, "20Gi"),)),
    PodShape("shared 40Gi", 1, 0.06, ((ann.GPU_MEMORY, "40Gi"),)),
    PodShape("1 GPU", 1, 0.26),
    PodShape("1 GPU <=75C", 1, 0.05, ((ann.MAX_TEMPERATURE, "75"),)),
    PodShape("2 GPU", 2, 0.14),
    PodShape("4 GPU nvlink", 4, 0.08, ((ann.TOPOLOGY, "nvlink-required"),)),
    PodShape("4 GPU", 4, 0.06),
    PodShape("8 GPU", 8, 0.08, ((ann.TOPOLOGY, "nvlink-preferred"),)),
)


@dataclass(frozen=True, slots=True)
class PodSpec:
    """One pod of the stream: its shape and how many pods later it finishes."""

    n: int
    shape: PodShape
    lifetime: int


def pod_stream(pods: int, seed: int, mean_lifetime: float) -> list[PodSpec]:
    """The demo's pods, drawn from ``seed`` alone: kelvin and the baseline get the very same stream."""
    rng = random.Random(seed)
    weights = [s.weight for s in MIX]
    out = []
    for n in range(1, pods + 1):
        shape = rng.choices(MIX, weights=weights)[0]
        out.append(PodSpec(n, shape, max(1, int(rng.expovariate(1.0 / mean_lifetime)))))
    return out


def demo_fleet(
    nodes: int, gpus: int, hot_nodes: int, seed: int, initial_load: float = 0.1, ambient_c: float = 30.0
) -> FleetSpec:
    """``nodes`` nodes of ``gpus`` H100s (NVSwitch), the last ``hot_nodes`` of them poorly cooled (they throttle
    under sustained load), part-full at start with whole GPUs and scattered memory-pool shares."""
    groups: list[dict[str, Any]] = [{"count": nodes - hot_nodes, "gpus": gpus, "topology": "nvswitch"}]
    if hot_nodes:
        groups.append({"count": hot_nodes, "gpus": gpus, "topology": "nvswitch", "poorCoolingFraction": 1.0})
    return FleetSpec.parse(
        {"seed": seed, "initialLoad": initial_load, "ambientC": ambient_c, "groups": groups}, source="demo fleet"
    )


def make_pod(name: str, shape: PodShape, uid: str) -> dict[str, Any]:
    """A Pod as kube-scheduler sends it (API JSON): one container requesting ``nvidia.com/gpu``."""
    return {
        "metadata": {
            "name": name,
            "namespace": "demo",
            "uid": uid,
            "annotations": dict(shape.annotations),
            "labels": {"app": "kelvin-demo", "shape": shape.label.replace(" ", "-").replace("<=", "max")},
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "resources": {
                        "limits": {ann.GPU_RESOURCE: str(shape.gpus)},
                        "requests": {ann.GPU_RESOURCE: str(shape.gpus), "cpu": "4", "memory": "32Gi"},
                    },
                }
            ],
            "schedulerName": "default-scheduler",
            "priority": 0,
        },
        "status": {"phase": "Pending"},
    }


@dataclass(slots=True)
class Row:
    n: int
    pod: str
    shape: str
    node: str | None = None
    gpus: str = ""
    score: int | None = None
    temp: float | None = None
    hot: bool = False
    candidates: int = 0
    note: str = ""
    demand: float = 0.0
    """GPUs the pod asks for (a memory-pool share counts as its share of one GPU)."""
    fragmented: bool = False
    """Refused although the fleet had as many whole GPUs free as the pod needs, only not on one node."""
    ms: float = 0.0


@dataclass(slots=True)
class DemoSummary:
    pods: int
    placed: int
    placed_gpus: float
    """GPUs' worth of pods placed (a memory-pool share counts as its share of one GPU)."""
    failed: int
    failed_fragmented: int
    failure_reasons: Counter[str]
    failure_examples: dict[str, str]
    hot_placements: int
    throttled_gpu_minutes: float
    stranded_gpus: int
    stranded_bytes: int
    free_whole_gpus: int
    throttling_gpus: int
    pods_throttled: int
    finished: int
    elapsed_s: float
    p50_ms: float
    p99_ms: float
    rows: list[Row] = field(default_factory=list)

    def headline(self) -> dict[str, float]:
        """The numbers the demo is about (same seed, same numbers): for the comparison and for tests."""
        return {
            "placed": self.placed,
            "placed_gpus": round(self.placed_gpus, 1),
            "refused": self.failed,
            "refused_fragmented": self.failed_fragmented,
            "stranded_gpus": self.stranded_gpus,
            "hot_placements": self.hot_placements,
            "throttled_gpu_minutes": round(self.throttled_gpu_minutes, 1),
        }


def _pick_best(scores: list[dict[str, Any]], rng: random.Random) -> tuple[str, int]:
    best = max(int(s["Score"]) for s in scores)
    top = [s["Host"] for s in scores if int(s["Score"]) == best]
    return rng.choice(top), best


def _reason_key(reason: str) -> str:
    """Group rejection texts by what the pod needed: the node's own numbers (before the first ';') are dropped from
    the key, and one real example is shown next to it (see :meth:`Demo._schedule_one`)."""
    head, sep, tail = reason.partition(";")
    return tail.strip() if sep else re.sub(r"\d+(\.\d+)?", "#", head)


def _closest_miss(node_reason: tuple[str, str]) -> int:
    """The first number of a rejection (``6 of 8 usable GPUs are free``): the node with the most left came nearest."""
    m = re.search(r"\d+", node_reason[1])
    return int(m.group()) if m else -1


def fleet_state(snap: Snapshot) -> tuple[int, int, int, int]:
    """(stranded GPUs, stranded bytes, whole free GPUs, GPUs thermally throttling) of a snapshot."""
    a = snap.arrays
    partial = a.gpu_present & (a.free_milli > 0) & (a.free_milli < MILLI_PER_GPU)
    stranded = partial & (a.free_mem < SMALLEST_REQUEST_BYTES)
    whole = a.gpu_present & (a.free_milli >= MILLI_PER_GPU)
    throttling = a.gpu_present & ((a.throttle & THERMAL_THROTTLE_MASK) != 0)
    return int(stranded.sum()), int(a.free_mem[stranded].sum()), int(whole.sum()), int(throttling.sum())


def throttled_gpus_of(snap: Snapshot, prefix: str = "") -> int:
    """GPUs thermally throttling that run a pod whose key starts with ``prefix`` (each GPU counted once)."""
    n = 0
    for nd in snap.nodes:
        hot = {g.index for g in nd.gpus if g.throttle_reasons & THERMAL_THROTTLE_MASK}
        if hot:
            used = {i for a in nd.assignments if a.pod_key.startswith(prefix) for i in a.gpu_indices}
            n += len(hot & used)
    return n


def pods_throttled(snap: Snapshot, prefix: str = "") -> int:
    """Pods (whose key starts with ``prefix``) with at least one GPU thermally throttling: jobs running slower now."""
    n = 0
    for nd in snap.nodes:
        hot = {g.index for g in nd.gpus if g.throttle_reasons & THERMAL_THROTTLE_MASK}
        if hot:
            n += sum(1 for a in nd.assignments if a.pod_key.startswith(prefix) and hot.intersection(a.gpu_indices))
    return n


def _demand(shape: PodShape) -> float:
    """GPUs' worth of a pod: whole GPUs, or a memory pool's share of one 80 GiB GPU."""
    pool = dict(shape.annotations).get(ann.GPU_MEMORY)
    if pool is None:
        return float(shape.gpus)
    return min(1.0, int(pool.removesuffix("Gi")) / 80)


class SimClock:
    """The demo's clock: simulated seconds, moved only by :meth:`advance` (the fleet and the extender share it)."""

    def __init__(self, start: float = DEMO_EPOCH_S) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Demo:
    def __init__(  # noqa: PLR0913
        self,
        *,
        pods: int = 200,
        nodes: int = 16,
        gpus: int = 8,
        hot_nodes: int = 2,
        seed: int = 0,
        interval_s: float = 0.05,
        step_s: float = 30.0,
        mean_lifetime: float | None = None,
        policy_file: str | None = None,
        policy: PolicyConfig | None = None,
        plugins: Registry = PRODUCTION,
    ) -> None:
        self.pods = pods
        self.interval_s = interval_s
        self.step_s = step_s
        self.rng = random.Random(seed + 1)  # tie-breaks among equal scores, as kube-scheduler does
        lifetime = mean_lifetime if mean_lifetime is not None else max(10.0, pods / 4)
        self.stream = pod_stream(pods, seed, lifetime)
        self.clock = SimClock()
        settings = Settings(
            source="simulated",
            fleet_nodes=nodes,
            fleet_gpus_per_node=gpus,
            fleet_seed=seed,
            # the demo refreshes the snapshot itself, once per pod; the background refresh never fires
            refresh_interval_s=3600,
            max_telemetry_age_s=7200,
            policy_file=policy_file,
            bind_enabled=True,
        )
        hot = min(hot_nodes, nodes - 1) if nodes > 1 else 0
        self.source = SimulatedFleetSource(demo_fleet(nodes, gpus, hot, seed), clock=self.clock)
        self.hot_nodes = self._heat_hot_nodes(hot, min(HOT_NODE_BUSY_GPUS, gpus - 1))
        self.ext: Extender = build_extender(
            settings, source=self.source, policy=policy, binder=LocalBinder(), clock=self.clock, plugins=plugins
        )
        self.names = self.source.node_names
        self.rows: list[Row] = []
        self.latencies: list[float] = []
        self.reasons: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        self.finish_at: list[tuple[int, str]] = []
        self.finished = 0
        self.throttled_gpu_s = 0.0
        self._loop = asyncio.new_event_loop()

    def _heat_hot_nodes(self, count: int, busy: int) -> list[str]:
        """The poorly cooled nodes (the last ``count``) run a pre-existing job flat out on ``busy`` of their GPUs, so
        they are hot when the stream starts; their other GPUs are free. (Two processes per GPU: the simulated load
        is the sum of its pods' utilisation, so the GPU runs at 100 % whatever each one's draw.)"""
        names = self.source.node_names[len(self.source.node_names) - count :] if count else []
        for node in names:
            for g in range(busy):
                for k in range(2):
                    key = f"preexisting/{node}-burn-g{g}-{k}"
                    self.source.record_binding(node, GpuAssignment(pod_key=key, gpu_indices=(g,)))
        if names:  # let them settle at that load (an hour before the demo starts; no pods arrive meanwhile)
            self.source.advance(3600.0)
        return names

    def _refresh(self) -> Snapshot:
        """One telemetry refresh at the demo's clock (the fleet advances by the time since the last one)."""
        self._loop.run_until_complete(self.ext.cache.refresh_once())
        return self.ext.cache.snapshot

    def _schedule_one(self, client: httpx.Client, spec: PodSpec, snap: Snapshot) -> Row:
        n, shape = spec.n, spec.shape
        name = f"job-{n:04d}-{shape.label.split()[0]}"
        pod = make_pod(name, shape, uid=f"00000000-0000-4000-8000-{n:012d}")
        row = Row(n=n, pod=name, shape=shape.label, demand=_demand(shape))
        t0 = time.perf_counter()
        res = client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": self.names}).json()
        passed: list[str] = res.get("NodeNames") or []
        row.candidates = len(passed)
        if res.get("Error"):
            row.note = res["Error"]
        elif not passed:
            failed = {**(res.get("FailedNodes") or {}), **(res.get("FailedAndUnresolvableNodes") or {})}
            why = Counter(_reason_key(r) for r in failed.values())
            top = why.most_common(1)[0][0] if why else "no nodes"
            alike = [(nd, r) for nd, r in sorted(failed.items()) if _reason_key(r) == top]
            example = max(alike, key=_closest_miss) if alike else None  # the node that came nearest
            row.note = f"{example[0]}: {example[1]}" if example else top
            self.reasons[top] += 1
            if example:
                self.examples.setdefault(top, row.note)
            if shape.gpus > 1 or not shape.annotations:  # whole GPUs: would they have fit if pooled?
                _, _, whole, _ = fleet_state(snap)
                row.fragmented = whole >= shape.gpus
        else:
            if len(passed) == 1:  # kube-scheduler skips prioritize with one feasible node
                node, score = passed[0], None
            else:
                scores = client.post("/prioritize", json={"Pod": pod, "Nodes": None, "NodeNames": passed}).json()
                node, score = _pick_best(scores, self.rng)
            bound = client.post(
                "/bind", json={"PodName": name, "PodNamespace": "demo", "PodUID": pod["metadata"]["uid"], "Node": node}
            ).json()
            if bound.get("Error"):
                row.note = "bind: " + bound["Error"]
                self.reasons["bind failed"] += 1
            else:
                row.node, row.score = node, score
                placed = self.source.placements().get(f"demo/{name}")
                gpus = placed[1].gpu_indices if placed else ()
                row.gpus = ",".join(map(str, gpus))
                nd = snap.node(node)
                if nd is not None and nd.gpus:  # the node's hottest GPU when the pod was placed
                    row.temp = max(g.temperature_celsius for g in nd.gpus)
                    row.hot = any(
                        g.temperature_celsius >= g.slowdown_celsius - HOT_MARGIN_C
                        or g.throttle_reasons & THERMAL_THROTTLE_MASK
                        for g in nd.gpus
                    )
                self.finish_at.append((n + spec.lifetime, f"demo/{name}"))
        row.ms = (time.perf_counter() - t0) * 1000
        self.latencies.append(row.ms)
        return row

    def _finish_due(self, n: int) -> None:
        due = [k for t, k in self.finish_at if t <= n]
        self.finish_at = [(t, k) for t, k in self.finish_at if t > n]
        for key in due:
            if self.source.release(key):
                self.ext.ledger.forget(key)
                self.finished += 1

    def _step(self, client: httpx.Client, spec: PodSpec) -> None:
        """One pod: time passes, due pods finish, telemetry refreshes, the pod is scheduled."""
        self.clock.advance(self.step_s)
        self._finish_due(spec.n)
        snap = self._refresh()
        self.throttled_gpu_s += throttled_gpus_of(snap, "demo/") * self.step_s
        self.rows.append(self._schedule_one(client, spec, snap))

    def _table(self, elapsed: float) -> Group:
        placed = sum(1 for r in self.rows if r.node)
        failed = len(self.rows) - placed
        hot = sum(1 for r in self.rows if r.hot)
        stranded, _, whole, thr = fleet_state(self.ext.cache.snapshot)
        head = (
            f"[b]{len(self.rows)}/{self.pods}[/b] pods  placed [green]{placed}[/]  refused [red]{failed}[/]  "
            f"on hot nodes [yellow]{hot}[/]  finished {self.finished}   fleet: {whole} whole GPUs free, "
            f"{stranded} stranded, {thr} throttling   {elapsed:.1f}s"
        )
        t = Table(expand=True, show_edge=False, pad_edge=False)
        t.add_column("pod", no_wrap=True, min_width=8)
        t.add_column("request", no_wrap=True, min_width=12)
        t.add_column("node", no_wrap=True, min_width=11)
        t.add_column("gpus", no_wrap=True, max_width=15)
        for col, width in (("score", 5), ("°C", 3), ("fits", 4), ("ms", 5)):
            t.add_column(col, justify="right", no_wrap=True, min_width=width)
        t.add_column("note", no_wrap=True, overflow="ellipsis", ratio=1)
        for r in self.rows[-18:]:
            temp = "" if r.temp is None else (f"[yellow]{r.temp:.0f}[/]" if r.hot else f"{r.temp:.0f}")
            t.add_row(
                f"job-{r.n:04d}",
                escape(r.shape),
                r.node or "[red]unschedulable[/]",
                r.gpus,
                "" if r.score is None else str(r.score),
                temp,
                str(r.candidates),
                f"{r.ms:.1f}",
                escape(r.note),
            )
        return Group(Panel(head, title="kelvin demo: simulated fleet, real HTTP"), t)

    def run(self, console: Console | None = None, live: bool = True, progress: bool = True) -> DemoSummary:
        console = console or make_console()
        started = time.perf_counter()
        app = create_app(self.ext)
        try:
            with ServerThread(app) as url, httpx.Client(base_url=url, timeout=30.0) as client:
                if live:
                    with Live(self._table(0.0), console=console, refresh_per_second=8, transient=False) as lv:
                        for spec in self.stream:
                            self._step(client, spec)
                            lv.update(self._table(time.perf_counter() - started))
                            time.sleep(self.interval_s)
                else:
                    step = max(1, self.pods // 10)
                    for spec in self.stream:
                        self._step(client, spec)
                        n = spec.n
                        if progress and (n % step == 0 or n == self.pods):
                            placed = sum(1 for r in self.rows if r.node)
                            console.print(f"{n}/{self.pods} pods: {placed} placed, {n - placed} refused")
                self.clock.advance(self.step_s)
                snap = self._refresh()  # the summary sees the last binds
                self.throttled_gpu_s += throttled_gpus_of(snap, "demo/") * self.step_s
        finally:
            self._loop.close()
        stranded, stranded_bytes, whole, thr = fleet_state(snap)
        lat = np.asarray(self.latencies or [0.0])
        return DemoSummary(
            pods=self.pods,
            placed=sum(1 for r in self.rows if r.node),
            placed_gpus=sum(r.demand for r in self.rows if r.node),
            failed=sum(1 for r in self.rows if not r.node),
            failed_fragmented=sum(1 for r in self.rows if r.fragmented),
            failure_reasons=self.reasons,
            failure_examples=self.examples,
            hot_placements=sum(1 for r in self.rows if r.hot),
            throttled_gpu_minutes=self.throttled_gpu_s / 60.0,
            stranded_gpus=stranded,
            stranded_bytes=stranded_bytes,
            free_whole_gpus=whole,
            throttling_gpus=thr,
            pods_throttled=pods_throttled(snap, "demo/"),
            finished=self.finished,
            elapsed_s=time.perf_counter() - started,
            p50_ms=float(np.percentile(lat, 50)),
            p99_ms=float(np.percentile(lat, 99)),
            rows=self.rows,
        )


def _summary_rows(s: DemoSummary) -> list[tuple[str, str]]:
    return [
        ("pods streamed", str(s.pods)),
        ("placed", f"[green]{s.placed}[/]"),
        ("GPUs' worth of pods placed (a memory share counts as its part of a GPU)", f"[green]{s.placed_gpus:.0f}[/]"),
        ("refused (no feasible node)", f"[red]{s.failed}[/]"),
        ("  of which refused with enough whole GPUs free fleet-wide (fragmentation)", f"[red]{s.failed_fragmented}[/]"),
        (
            "GPUs stranded at the end (partly used, < 10 GiB free)",
            f"{s.stranded_gpus} ({s.stranded_bytes / GIB:.0f} GiB)",
        ),
        (
            f"placements on hot nodes (a GPU throttling or within {HOT_MARGIN_C:g} °C of slowdown)",
            f"[yellow]{s.hot_placements}[/]",
        ),
        ("GPU-minutes of placed pods on thermally throttling GPUs", f"[yellow]{s.throttled_gpu_minutes:.0f}[/]"),
        ("placed pods on thermally throttling GPUs at the end", str(s.pods_throttled)),
        ("whole GPUs free at the end", str(s.free_whole_gpus)),
        ("pods finished during the run", str(s.finished)),
        ("round-trip p50 / p99 (filter+prioritize+bind)", f"{s.p50_ms:.1f} / {s.p99_ms:.1f} ms"),
        ("elapsed", f"{s.elapsed_s:.1f} s"),
    ]


def print_summary(s: DemoSummary, console: Console, baseline: DemoSummary | None = None) -> None:
    t = Table(title="kelvin demo summary", show_header=baseline is not None)
    t.add_column("")
    t.add_column("kelvin", justify="right")
    if baseline is not None:
        t.add_column("GPU-blind baseline", justify="right")
        for (what, mine), (_, theirs) in zip(_summary_rows(s), _summary_rows(baseline), strict=True):
            t.add_row(what, mine, theirs)
    else:
        for what, mine in _summary_rows(s):
            t.add_row(what, mine)
    console.print(t)
    if baseline is not None:
        console.print(
            "baseline: the same pods and fleet, random feasible node and GPUs, no thermal or hot-node filters"
        )
    if s.failure_reasons:
        console.print("[b]why pods were refused under kelvin[/b] (most common reason per pod, with an example):")
        for reason, n in s.failure_reasons.most_common(5):
            example = s.failure_examples.get(reason, reason)
            console.print(f"  {n:4d}  {escape(reason)}  [dim](e.g. {escape(example)})[/dim]")


#: The comparison run: what a GPU-blind scheduler does (random feasible node and GPUs, no thermal limits); its
#: ``random`` policy is one of the simulator's baselines, built through the simulator's registry.
BASELINE_POLICY: dict[str, Any] = {
    "filters": {"thermalHardLimits": False, "throttleHardLimit": False, "hotNodes": False},
    "scoring": {"random": {"weight": 1, "args": {"seed": 0}}},
    "picker": "random",
    "pickerArgs": {"seed": 0},
}


def baseline_policy(seed: int) -> PolicyConfig:
    """:data:`BASELINE_POLICY` with its random choices seeded from the demo's seed."""
    data: dict[str, Any] = {
        **BASELINE_POLICY,
        "scoring": {"random": {"weight": 1, "args": {"seed": seed}}},
        "pickerArgs": {"seed": seed},
    }
    return PolicyConfig.from_mapping(data, source="baseline policy")


def run_demo(  # noqa: PLR0913
    *,
    pods: int = 200,
    nodes: int = 16,
    gpus: int = 8,
    hot_nodes: int = 2,
    seed: int = 0,
    live: bool = True,
    interval_s: float = 0.05,
    policy_file: str | None = None,
    compare: bool = True,
    console: Console | None = None,
) -> tuple[DemoSummary, DemoSummary | None]:
    """Run the demo; with ``compare``, run the same pod stream again under :data:`BASELINE_POLICY` (no live table,
    no pauses)."""
    console = console or make_console()
    quiet = logging.getLogger("scheduler_plugin")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the extender's per-pod log lines would drown the table; restored below
    try:
        common: dict[str, Any] = {"pods": pods, "nodes": nodes, "gpus": gpus, "hot_nodes": hot_nodes, "seed": seed}
        live = live and console.is_terminal
        summary = Demo(policy_file=policy_file, interval_s=interval_s, **common).run(console, live=live)
        baseline = None
        if compare:
            console.print("running the same pods through a GPU-blind baseline (random placement, no thermal limits)...")
            baseline = Demo(policy=baseline_policy(seed), plugins=SIMULATOR, interval_s=0.0, **common).run(
                console, live=False, progress=False
            )
        print_summary(summary, console, baseline)
    finally:
        quiet.setLevel(level)
    return summary, baseline
