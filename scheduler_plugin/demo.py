"""``kelvin demo``: the extender on a simulated fleet, with pods streamed through it over HTTP as kube-scheduler would.

The extender runs in-process under uvicorn on a free loopback port, on a :class:`SimulatedFleetSource` whose clock
runs ``time_scale`` times faster than the wall clock (so placed load heats nodes within the demo). For each pod of a
realistic mix the demo does what kube-scheduler does with an extender (``nodeCacheCapable: true``): ``POST /filter``
with every node name, ``POST /prioritize`` with the survivors when two or more remain, picks the highest score (ties
broken at random, seeded), then ``POST /bind``. Bound pods load the simulated GPUs; some finish later and free them.

At the end it prints a summary: pods placed and failed (with the most common reasons), GPUs stranded (free capacity
too small for the smallest pod of the mix), placements on hot nodes, and pods and GPUs throttling at the end; by
default the same pods are then run through a GPU-blind baseline (random placement, no thermal limits) for comparison.
"""

from __future__ import annotations

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
from rich.panel import Panel
from rich.table import Table

from .config import Settings
from .extender.app import build_extender, create_app
from .extender.server import ServerThread
from .extender.service import Extender
from .model import GIB, MILLI_PER_GPU, Snapshot
from .model import annotations as ann
from .policies import baselines as _baselines  # noqa: F401  (registers the comparison policies)
from .policies.config import PolicyConfig
from .telemetry.simulated import FleetSpec, SimulatedFleetSource

#: A node with a GPU within this many degrees of its slowdown threshold counts as hot.
HOT_MARGIN_C = 10.0
#: The smallest GPU memory any pod of the mix asks for; free capacity below it is stranded.
SMALLEST_REQUEST_BYTES = 10 * GIB


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
    ms: float = 0.0


@dataclass(slots=True)
class DemoSummary:
    pods: int
    placed: int
    failed: int
    failure_reasons: Counter[str]
    hot_placements: int
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


def _pick_best(scores: list[dict[str, Any]], rng: random.Random) -> tuple[str, int]:
    best = max(int(s["Score"]) for s in scores)
    top = [s["Host"] for s in scores if int(s["Score"]) == best]
    return rng.choice(top), best


def _short_reason(reason: str) -> str:
    """Group rejection texts: numbers about the node (before the first ';') become N; the pod's need is kept."""
    head, sep, tail = reason.partition(";")
    return re.sub(r"\d+(\.\d+)?", "N", head) + sep + tail


def fleet_state(snap: Snapshot) -> tuple[int, int, int, int]:
    """(stranded GPUs, stranded bytes, whole free GPUs, GPUs thermally throttling) of a snapshot."""
    a = snap.arrays
    partial = a.gpu_present & (a.free_milli > 0) & (a.free_milli < MILLI_PER_GPU)
    stranded = partial & (a.free_mem < SMALLEST_REQUEST_BYTES)
    whole = a.gpu_present & (a.free_milli >= MILLI_PER_GPU)
    throttling = a.gpu_present & ((a.throttle & 0x60) != 0)
    return int(stranded.sum()), int(a.free_mem[stranded].sum()), int(whole.sum()), int(throttling.sum())


def pods_throttled(snap: Snapshot) -> int:
    """Pods (of any origin) with at least one GPU thermally throttling: the jobs running slower right now."""
    n = 0
    for nd in snap.nodes:
        hot = {g.index for g in nd.gpus if g.throttle_reasons & 0x60}
        if hot:
            n += sum(1 for a in nd.assignments if hot.intersection(a.gpu_indices))
    return n


class Demo:
    def __init__(
        self,
        *,
        pods: int = 200,
        nodes: int = 48,
        gpus: int = 8,
        seed: int = 0,
        interval_s: float = 0.05,
        time_scale: float = 60.0,
        mean_lifetime: float | None = None,
        policy_file: str | None = None,
        policy: PolicyConfig | None = None,
    ) -> None:
        self.pods = pods
        self.interval_s = interval_s
        self.rng = random.Random(seed)
        self.mean_lifetime = mean_lifetime if mean_lifetime is not None else max(10.0, pods / 3)
        settings = Settings(
            source="simulated",
            fleet_nodes=nodes,
            fleet_gpus_per_node=gpus,
            fleet_seed=seed,
            refresh_interval_s=0.5,
            policy_file=policy_file,
            bind_enabled=True,
        )
        self.source = SimulatedFleetSource(FleetSpec.uniform(nodes, gpus, seed=seed, time_scale=time_scale))
        self.ext: Extender = build_extender(settings, source=self.source, policy=policy)
        self.names = self.source.node_names
        self.rows: list[Row] = []
        self.latencies: list[float] = []
        self.reasons: Counter[str] = Counter()
        self.finish_at: list[tuple[int, str]] = []
        self.finished = 0

    def _schedule_one(self, client: httpx.Client, n: int) -> Row:
        shape = self.rng.choices(MIX, weights=[s.weight for s in MIX])[0]
        name = f"job-{n:04d}-{shape.label.split()[0]}"
        pod = make_pod(name, shape, uid=f"00000000-0000-4000-8000-{n:012d}")
        row = Row(n=n, pod=name, shape=shape.label)
        t0 = time.perf_counter()
        res = client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": self.names}).json()
        passed: list[str] = res.get("NodeNames") or []
        row.candidates = len(passed)
        if res.get("Error"):
            row.note = res["Error"]
        elif not passed:
            why = Counter(
                _short_reason(r)
                for d in ("FailedNodes", "FailedAndUnresolvableNodes")
                for r in (res.get(d) or {}).values()
            )
            top = why.most_common(1)[0][0] if why else "no nodes"
            row.note = top
            self.reasons[top] += 1
        else:
            if len(passed) == 1:  # kube-scheduler skips prioritize with one feasible node
                node, score = passed[0], None
            else:
                scores = client.post("/prioritize", json={"Pod": pod, "Nodes": None, "NodeNames": passed}).json()
                node, score = _pick_best(scores, self.rng)
            snap = self.ext.cache.snapshot
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
                    row.hot = any(g.temperature_celsius >= g.slowdown_celsius - HOT_MARGIN_C for g in nd.gpus)
                life = max(1, int(self.rng.expovariate(1.0 / self.mean_lifetime)))
                self.finish_at.append((n + life, f"demo/{name}"))
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

    def _table(self, elapsed: float) -> Group:
        placed = sum(1 for r in self.rows if r.node)
        failed = len(self.rows) - placed
        hot = sum(1 for r in self.rows if r.hot)
        stranded, _, whole, thr = fleet_state(self.ext.cache.snapshot)
        head = (
            f"[b]{len(self.rows)}/{self.pods}[/b] pods  placed [green]{placed}[/]  failed [red]{failed}[/]  "
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
                r.shape,
                r.node or "[red]unschedulable[/]",
                r.gpus,
                "" if r.score is None else str(r.score),
                temp,
                str(r.candidates),
                f"{r.ms:.1f}",
                r.note,
            )
        return Group(Panel(head, title="kelvin demo: simulated fleet, real HTTP"), t)

    def run(self, console: Console | None = None, live: bool = True, progress: bool = True) -> DemoSummary:
        console = console or Console()
        started = time.perf_counter()
        app = create_app(self.ext)
        with ServerThread(app) as url, httpx.Client(base_url=url, timeout=30.0) as client:
            if live:
                with Live(self._table(0.0), console=console, refresh_per_second=8, transient=False) as lv:
                    for n in range(1, self.pods + 1):
                        self._finish_due(n)
                        self.rows.append(self._schedule_one(client, n))
                        lv.update(self._table(time.perf_counter() - started))
                        time.sleep(self.interval_s)
            else:
                step = max(1, self.pods // 10)
                for n in range(1, self.pods + 1):
                    self._finish_due(n)
                    self.rows.append(self._schedule_one(client, n))
                    if progress and (n % step == 0 or n == self.pods):
                        placed = sum(1 for r in self.rows if r.node)
                        console.print(f"{n}/{self.pods} pods: {placed} placed, {n - placed} failed")
                    time.sleep(self.interval_s)
            time.sleep(0.6)  # one more refresh, so the summary sees the last binds
            snap = self.ext.cache.snapshot
        stranded, stranded_bytes, whole, thr = fleet_state(snap)
        lat = np.asarray(self.latencies or [0.0])
        return DemoSummary(
            pods=self.pods,
            placed=sum(1 for r in self.rows if r.node),
            failed=sum(1 for r in self.rows if not r.node),
            failure_reasons=self.reasons,
            hot_placements=sum(1 for r in self.rows if r.hot),
            stranded_gpus=stranded,
            stranded_bytes=stranded_bytes,
            free_whole_gpus=whole,
            throttling_gpus=thr,
            pods_throttled=pods_throttled(snap),
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
        ("failed (no feasible node)", f"[red]{s.failed}[/]"),
        ("placements on hot nodes (a GPU within 10 °C of slowdown)", f"[yellow]{s.hot_placements}[/]"),
        ("pods on thermally throttling GPUs at the end", f"[yellow]{s.pods_throttled}[/]"),
        ("GPUs stranded (free capacity < 10 GiB)", f"{s.stranded_gpus} ({s.stranded_bytes / GIB:.0f} GiB)"),
        ("whole GPUs free at the end", str(s.free_whole_gpus)),
        ("GPUs thermally throttling at the end", str(s.throttling_gpus)),
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
        console.print("baseline: the same pods and fleet, random feasible node and GPUs, no thermal limits")
    if s.failure_reasons:
        console.print("[b]why pods failed under kelvin[/b] (most common rejection per pod):")
        for reason, n in s.failure_reasons.most_common(5):
            console.print(f"  {n:4d}  {reason}")


#: The comparison run: what a GPU-blind scheduler does (random feasible node and GPUs, no thermal limits).
BASELINE_POLICY: dict[str, Any] = {
    "filters": {"thermalHardLimits": False, "throttleHardLimit": False},
    "scoring": {"random": {"weight": 1, "args": {"seed": 0}}},
    "picker": "random",
    "pickerArgs": {"seed": 0},
}


def run_demo(
    *,
    pods: int = 200,
    nodes: int = 48,
    gpus: int = 8,
    seed: int = 0,
    live: bool = True,
    interval_s: float = 0.05,
    policy_file: str | None = None,
    compare: bool = True,
    console: Console | None = None,
) -> tuple[DemoSummary, DemoSummary | None]:
    """Run the demo; with ``compare``, run the same pod stream again under :data:`BASELINE_POLICY` (no live table)."""
    console = console or Console()
    logging.getLogger("scheduler_plugin").setLevel(logging.ERROR)
    common: dict[str, Any] = {"pods": pods, "nodes": nodes, "gpus": gpus, "seed": seed, "interval_s": interval_s}
    summary = Demo(policy_file=policy_file, **common).run(console, live=live and console.is_terminal)
    baseline = None
    if compare:
        console.print("running the same pods through a GPU-blind baseline (random placement, no thermal limits)...")
        policy = PolicyConfig.from_mapping(BASELINE_POLICY, source="baseline policy")
        baseline = Demo(policy=policy, **common).run(console, live=False, progress=False)
    print_summary(summary, console, baseline)
    return summary, baseline
