"""The demo's driver: the extender in-process under uvicorn on a free loopback port, on a
:class:`SimulatedFleetSource`, and each pod of the stream through it as kube-scheduler does with an extender
(``nodeCacheCapable: true``): ``POST /filter`` with every node name, ``POST /prioritize`` with the survivors when two
or more remain, the highest score (ties broken at random, seeded), then ``POST /bind``. Bound pods load the simulated
GPUs (they heat up); each finishes after its lifetime and frees them.

The driver moves the fleet's clock itself (``step_s`` simulated seconds per pod, not the wall clock) and refreshes the
extender's snapshot before each pod. When no node passes, it asks the extender's framework for the typed
:class:`Rejection` of each node (the same snapshot and clock the ``/filter`` answer was computed on), which the
summary groups by what the pod needed.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

import httpx
import numpy as np
from rich.console import Console, Group
from rich.live import Live

from ..console import console as make_console
from ..extender.app import build_extender, create_app
from ..extender.binder import LocalBinder
from ..extender.server import ServerThread
from ..extender.service import Extender
from ..model import THERMAL_THROTTLE_MASK, GpuAssignment, Snapshot, parse_pod
from ..policies.base import Rejection
from ..policies.plugins import PRODUCTION
from ..policies.policy_file import PolicyConfig
from ..policies.registry import Registry
from ..settings import Settings
from ..simulator.baselines import SIMULATOR
from ..simulator.simulated_fleet import SimulatedFleetSource
from .scenario import (
    DEMO_EPOCH_S,
    HOT_MARGIN_C,
    HOT_NODE_BUSY_GPUS,
    PodSpec,
    baseline_policy,
    demand,
    demo_fleet,
    make_pod,
    pod_stream,
)
from .summary import (
    DemoSummary,
    Refusals,
    Row,
    fleet_state,
    live_table,
    pods_throttled,
    print_summary,
    throttled_gpus_of,
)


class SimClock:
    """The demo's clock: simulated seconds, moved only by :meth:`advance` (the fleet and the extender share it)."""

    def __init__(self, start: float = DEMO_EPOCH_S) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _pick_best(scores: list[dict[str, Any]], rng: random.Random) -> tuple[str, int]:
    best = max(int(s["Score"]) for s in scores)
    top = [s["Host"] for s in scores if int(s["Score"]) == best]
    return rng.choice(top), best


class Demo:
    """One run of the stream through one policy (kelvin's, or the baseline's)."""

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
        self.refusals = Refusals()
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

    def rejections(self, pod: dict[str, Any], nodes: list[str]) -> dict[str, Rejection]:
        """The typed rejection of each of ``nodes`` for ``pod``, in their order, from the extender's framework on the
        snapshot and clock its ``/filter`` answer came from (the ``FailedNodes`` texts are their words)."""
        fleet = self.ext.cache.snapshot.arrays
        rows = np.array([fleet.index[n] for n in nodes], dtype=np.int64)
        fw = self.ext.framework
        rejected = fw.filter(parse_pod(pod), fleet, rows, fw.context(fleet, self.clock())).rejected
        return {n: rejected[r] for n, r in zip(nodes, rows.tolist(), strict=True)}

    def _schedule_one(self, client: httpx.Client, spec: PodSpec, snap: Snapshot) -> Row:
        n, shape = spec.n, spec.shape
        name = f"job-{n:04d}-{shape.label.split()[0]}"
        pod = make_pod(name, shape, uid=f"00000000-0000-4000-8000-{n:012d}")
        row = Row(n=n, pod=name, shape=shape.label, demand=demand(shape))
        t0 = time.perf_counter()
        res = client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": self.names}).json()
        passed: list[str] = res.get("NodeNames") or []
        row.candidates = len(passed)
        if res.get("Error"):
            row.note = res["Error"]
        elif not passed:
            failed = [*(res.get("FailedNodes") or {}), *(res.get("FailedAndUnresolvableNodes") or {})]
            row.note = self.refusals.record(self.rejections(pod, failed))
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
                self.refusals.reasons["bind failed"] += 1
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
        return live_table(self.rows, self.pods, self.finished, self.ext.cache.snapshot, elapsed)

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
        return self._summary(snap, time.perf_counter() - started)

    def _summary(self, snap: Snapshot, elapsed_s: float) -> DemoSummary:
        stranded, stranded_bytes, whole, thr = fleet_state(snap)
        lat = np.asarray(self.latencies or [0.0])
        return DemoSummary(
            pods=self.pods,
            placed=sum(1 for r in self.rows if r.node),
            placed_gpus=sum(r.demand for r in self.rows if r.node),
            failed=sum(1 for r in self.rows if not r.node),
            failed_fragmented=sum(1 for r in self.rows if r.fragmented),
            failure_reasons=self.refusals.reasons,
            failure_examples=self.refusals.examples,
            hot_placements=sum(1 for r in self.rows if r.hot),
            throttled_gpu_minutes=self.throttled_gpu_s / 60.0,
            stranded_gpus=stranded,
            stranded_bytes=stranded_bytes,
            free_whole_gpus=whole,
            throttling_gpus=thr,
            pods_throttled=pods_throttled(snap, "demo/"),
            finished=self.finished,
            elapsed_s=elapsed_s,
            p50_ms=float(np.percentile(lat, 50)),
            p99_ms=float(np.percentile(lat, 99)),
            rows=self.rows,
        )


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
    """Run the demo; with ``compare``, run the same pod stream again under the GPU-blind baseline
    (:data:`~.scenario.BASELINE_POLICY`; no live table, no pauses)."""
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
