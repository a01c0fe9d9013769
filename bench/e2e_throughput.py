"""Scheduling throughput on the real control plane: kelvin-scheduler against the default scheduler, in one run.

Starts the e2e suite's loopback control plane (tests/e2e/cluster.py: etcd, kube-apiserver, kube-controller-manager
and the default kube-scheduler of the pinned release), ``--nodes`` fake 8-GPU nodes (tests/e2e/fakenodes.py), kelvin
installed as docs/install.md gives it (tests/e2e/install.py), and kelvin-scheduler as the e2e suite runs it
(tests/e2e/kelvin_scheduler.py: the real kube-scheduler with the installed KubeSchedulerConfiguration, and ``kelvin
extender`` with the installed policy and settings). The extender's telemetry (``--telemetry``): ``prometheus`` (the
default) is kelvin's fake-NVML exporters scraped by a real Prometheus, as the e2e suite's burst scenario reads them
(tests/e2e/telemetry.py's ``add_shared``: ``--nodes-per-exporter`` nodes per exporter process, one Prometheus target
per node); ``simulated`` a simulated fleet with the fake nodes' names.
Then alternating rounds, kelvin-scheduler first: a burst of ``--pods`` one-GPU pods
(``schedulerName: kelvin-scheduler``, then ``default-scheduler``) in a fresh namespace, created behind a scheduling
gate; the clock starts when the gates are removed (as fast as the API server takes it, ``--create-concurrency``
requests in flight) and stops when a watch on the namespace has seen every pod bound (``spec.nodeName`` set).
pods/s = pods / that time (``--no-gates``: pods created without a gate, timed from the first create). Each round's
pods are deleted (``gracePeriodSeconds: 0``) before the next one; with ``--telemetry simulated`` the extender is
restarted before each kelvin round after the first (the simulated fleet never learns of deleted pods: their GPUs would
stay loaded).

Prints, per round, pods/s, the time to release the burst and the time to bind (p50 / p99 from each pod's release),
the CPU seconds each process used in the round, and (``--breakdown``, on by default) where the time went: the mean
of kube-scheduler's own histograms over the round (``scheduler_scheduling_attempt_duration_seconds``,
``scheduler_framework_extension_point_duration_seconds``, ...) and of the extender's per-verb histogram. Then the
median pods/s of each scheduler and their ratio kelvin / default, with the machine (nproc, CPU model) and its load.

    python bench/e2e_throughput.py                          # 100 nodes, 500 pods, 2 rounds each
    python bench/e2e_throughput.py --nodes 1000 --pods 5000 --rounds 1

Needs the binaries of ``bash hack/build-kube.sh`` (docs/e2e.md). Every process it starts is stopped by PID at the end
(also on Ctrl-C); the run is bounded by ``--round-timeout-s`` per round and at most 10 rounds per scheduler.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml
from harness import load_line
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.e2e.api import wait_for  # noqa: E402
from tests.e2e.cluster import LoopbackCluster, running  # noqa: E402
from tests.e2e.install import documented_manifest_install, run_documented  # noqa: E402
from tests.e2e.kelvin_scheduler import SCHEDULER_NAME, KelvinScheduler  # noqa: E402
from tests.e2e.kelvin_scheduler import start as start_kelvin_scheduler  # noqa: E402
from tests.e2e.kubebin import MissingBinaries, find  # noqa: E402
from tests.e2e.nodeagent import fake_nodes  # noqa: E402
from tests.e2e.pods import gpu_pod  # noqa: E402
from tests.e2e.telemetry import MAX_NODES_PER_EXPORTER, SHARED_SCRAPE_INTERVAL_S, Telemetry  # noqa: E402
from tests.e2e.telemetry import running as telemetry_running  # noqa: E402

DEFAULT_SCHEDULER = "default-scheduler"
NODE_PREFIX = "bench-gpu-"
GPUS_PER_NODE = 8
GPU_MODEL = "H100-SXM-80GB"
MAX_ROUNDS = 10
UNUSED_PROMETHEUS = "http://127.0.0.1:9090"
#: kube-scheduler's histograms whose mean over a round says where a scheduling attempt spends its time.
SCHEDULER_HISTOGRAMS = (
    "scheduler_scheduling_attempt_duration_seconds",
    "scheduler_scheduling_algorithm_duration_seconds",
    "scheduler_framework_extension_point_duration_seconds",
    "scheduler_pod_scheduling_sli_duration_seconds",
)
EXTENDER_HISTOGRAMS = ("kelvin_extender_request_duration_seconds",)


def node_names(count: int) -> list[str]:
    return [f"{NODE_PREFIX}{i}" for i in range(1, count + 1)]


def bench_fleet(count: int) -> dict[str, object]:
    """The extender's simulated fleet for exactly the fake nodes (no initial load, no random XID errors)."""
    return {
        "seed": 20,
        "initialLoad": 0,
        "xidRatePerGpuHour": 0,
        "groups": [
            {"count": count, "gpus": GPUS_PER_NODE, "model": GPU_MODEL, "topology": "nvswitch",
             "namePrefix": NODE_PREFIX},
        ],
    }  # fmt: skip


def _py_spy() -> str:
    found = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if found is None:
        raise SystemExit("error: --py-spy: py-spy is not installed (pip install py-spy)")
    return found


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process and its waited-for children (/proc/<pid>/stat), in seconds."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = stat.rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


# -- metrics ---------------------------------------------------------------------------------------------------------


Histograms = dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, float]]


def histograms(text: str, names: tuple[str, ...]) -> Histograms:
    """(family, labels without ``le``) -> (sum, count) of each histogram series of ``names``."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in names:
            continue
        for sample in family.samples:
            if sample.name.endswith("_sum") or sample.name.endswith("_count"):
                key = (family.name, tuple(sorted(sample.labels.items())))
                pair = out.setdefault(key, [0.0, 0.0])
                pair[0 if sample.name.endswith("_sum") else 1] = sample.value
    return {k: (v[0], v[1]) for k, v in out.items()}


def delta(after: Histograms, before: Histograms) -> Histograms:
    out: Histograms = {}
    for key, (s, c) in after.items():
        s0, c0 = before.get(key, (0.0, 0.0))
        if c - c0 > 0:
            out[key] = (s - s0, c - c0)
    return out


@dataclass
class Scrapes:
    """Where each scheduler's and the extender's /metrics are, and how to read them."""

    cluster: LoopbackCluster
    kelvin: KelvinScheduler

    def _kube(self, port: int) -> str:
        p = self.cluster.pki
        # the component's self-signed serving certificate; the admin (system:masters) may read /metrics
        with httpx.Client(verify=False, cert=(str(p.admin.cert), str(p.admin.key)), timeout=10) as client:
            r = client.get(f"https://127.0.0.1:{port}/metrics")
            r.raise_for_status()
            return r.text

    def kelvin_scheduler_port(self) -> int:
        (flag,) = (a for a in self.kelvin.scheduler_argv if a.startswith("--secure-port="))
        return int(flag.split("=", 1)[1])

    def read(self, scheduler: str) -> Histograms:
        if scheduler == SCHEDULER_NAME:
            text = self._kube(self.kelvin_scheduler_port())
            found = histograms(text, SCHEDULER_HISTOGRAMS)
            ext = httpx.get(f"http://127.0.0.1:{self.kelvin.extender_metrics_port}/metrics", timeout=10)
            ext.raise_for_status()
            found.update(histograms(ext.text, EXTENDER_HISTOGRAMS))
            return found
        return histograms(self._kube(self.cluster.ports["kube-scheduler"]), SCHEDULER_HISTOGRAMS)


# -- one burst -------------------------------------------------------------------------------------------------------


@dataclass
class Round:
    scheduler: str
    index: int
    pods: int
    nodes: int
    bound: int = 0
    create_s: float = float("nan")
    release_s: float = float("nan")
    elapsed_s: float = float("nan")
    to_bind_s: list[float] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)
    breakdown: Histograms = field(default_factory=dict)
    load: str = ""

    @property
    def pods_per_s(self) -> float:
        return self.pods / self.elapsed_s if self.bound == self.pods and self.elapsed_s > 0 else float("nan")


def _ssl(cluster: LoopbackCluster) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(cluster.pki.ca.cert))
    context.load_cert_chain(str(cluster.pki.admin.cert), str(cluster.pki.admin.key))
    return context


async def _watch_bound(
    client: httpx.AsyncClient, namespace: str, rv: str, bound_at: dict[str, float], want: int, done: asyncio.Event
) -> None:
    """Record when each pod of the namespace is first seen bound; set ``done`` once ``want`` are."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    last = [rv]  # the newest resourceVersion seen: a dropped watch starts again from there
    drops = 0
    while len(bound_at) < want:
        try:
            await _watch_once(client, path, namespace, last, bound_at, want, done)
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            drops += 1
            if drops > 10 * SEND_ATTEMPTS:
                raise RuntimeError(f"pod watch of {namespace}: dropped {drops} times") from exc


async def _watch_once(
    client: httpx.AsyncClient,
    path: str,
    namespace: str,
    last: list[str],
    bound_at: dict[str, float],
    want: int,
    done: asyncio.Event,
) -> None:
    params = {"watch": "1", "resourceVersion": last[0], "allowWatchBookmarks": "true", "timeoutSeconds": "300"}
    async with client.stream("GET", path, params=params, timeout=httpx.Timeout(30, read=330)) as stream:
        stream.raise_for_status()
        async for line in stream.aiter_lines():
            if not line:
                continue
            event = orjson.loads(line)
            obj = event["object"]
            if event["type"] == "ERROR":
                raise RuntimeError(f"pod watch of {namespace}: {obj}")
            last[0] = obj["metadata"].get("resourceVersion", last[0])
            name = obj["metadata"].get("name")
            if event["type"] in ("ADDED", "MODIFIED") and obj.get("spec", {}).get("nodeName"):
                bound_at.setdefault(name, time.monotonic())
                if len(bound_at) >= want:
                    done.set()
                    return


GATE = "kelvin.dev/bench-burst"
#: a loaded API server drops kept-alive connections (httpx: "Server disconnected without sending a response"); a
#: request that met that is sent again on a fresh connection, this many times at most
SEND_ATTEMPTS = 3


async def _send(client: httpx.AsyncClient, method: str, url: str, **kwargs: Any) -> tuple[httpx.Response, bool]:
    """The response, and whether an earlier attempt may have reached the server (dropped on the way back)."""
    for attempt in range(SEND_ATTEMPTS):
        try:
            return await client.request(method, url, **kwargs), attempt > 0
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
            if attempt == SEND_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


async def _burst(
    cluster: LoopbackCluster, rnd: Round, namespace: str, concurrency: int, timeout_s: float, gated: bool
) -> None:
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    path = f"/api/v1/namespaces/{namespace}/pods"
    names = _pod_names(rnd.pods)
    async with httpx.AsyncClient(base_url=cluster.server, verify=_ssl(cluster), timeout=60, limits=limits) as client:
        slots = asyncio.Semaphore(concurrency)
        released_at: dict[str, float] = {}

        async def create(name: str) -> None:
            pod = gpu_pod(name, 1)
            pod["spec"]["schedulerName"] = rnd.scheduler
            if gated:
                pod["spec"]["schedulingGates"] = [{"name": GATE}]
            async with slots:
                if not gated:
                    released_at[name] = time.monotonic()
                r, resent = await _send(
                    client, "POST", path, content=orjson.dumps(pod), headers={"Content-Type": "application/json"}
                )
            if r.status_code != 201 and not (resent and r.status_code == 409):  # 409: the first attempt created it
                raise RuntimeError(f"create pod {namespace}/{name}: {r.status_code} {r.text[:500]}")

        async def release(name: str) -> None:
            patch = orjson.dumps([{"op": "remove", "path": "/spec/schedulingGates"}])
            async with slots:
                released_at[name] = time.monotonic()
                r, resent = await _send(client, "PATCH", f"{path}/{name}", content=patch,
                                        headers={"Content-Type": "application/json-patch+json"})  # fmt: skip
            if r.status_code == 422 and resent:  # the first attempt may have removed the gate already
                r, _ = await _send(client, "GET", f"{path}/{name}")
                if r.status_code == 200 and not r.json()["spec"].get("schedulingGates"):
                    return
            if r.status_code != 200:
                raise RuntimeError(f"remove the scheduling gate of {namespace}/{name}: {r.status_code} {r.text[:500]}")

        if gated:  # the burst exists before the clock starts: only scheduling is timed, not pod creation
            started = time.monotonic()
            await asyncio.wait_for(asyncio.gather(*(create(n) for n in names)), timeout_s)
            rnd.create_s = time.monotonic() - started
        listing = await client.get(path, params={"limit": "1"})
        listing.raise_for_status()
        rv = listing.json()["metadata"]["resourceVersion"]
        bound_at: dict[str, float] = {}
        done = asyncio.Event()
        watcher = asyncio.create_task(_watch_bound(client, namespace, rv, bound_at, rnd.pods, done))
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(asyncio.gather(*((release if gated else create)(n) for n in names)), timeout_s)
            rnd.release_s = time.monotonic() - t0
            waiter = asyncio.create_task(done.wait())
            remaining = max(1.0, timeout_s - rnd.release_s)
            await asyncio.wait({waiter, watcher}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if watcher.done() and not watcher.cancelled() and watcher.exception() is not None:
                raise RuntimeError(f"the pod watch of {namespace} failed") from watcher.exception()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        rnd.bound = len(bound_at)
        if bound_at:
            rnd.elapsed_s = max(bound_at.values()) - t0
        rnd.to_bind_s = sorted(bound_at[n] - released_at[n] for n in bound_at if n in released_at)


def _delete_pods(cluster: LoopbackCluster, namespace: str, pods: int, concurrency: int, timeout_s: float) -> None:
    """Delete the burst's pods (``concurrency`` in flight), wait until they are gone, then the namespace. One
    DeleteCollection is one worker on the API server (``--delete-collection-workers``), deleting a pod at a time:
    thousands took longer than its 60 s request timeout, then minutes more."""
    asyncio.run(asyncio.wait_for(_delete_each(cluster, namespace, pods, concurrency), timeout_s))
    wait_for(
        f"the pods of {namespace} deleted",
        lambda: not cluster.api.get(f"/api/v1/namespaces/{namespace}/pods", limit=1)["items"],
        timeout_s,
        0.5,
    )
    cluster.api.delete(f"/api/v1/namespaces/{namespace}")


async def _delete_each(cluster: LoopbackCluster, namespace: str, pods: int, concurrency: int) -> None:
    body = orjson.dumps({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=cluster.server, verify=_ssl(cluster), timeout=60, limits=limits) as client:
        slots = asyncio.Semaphore(concurrency)

        async def delete(name: str) -> None:
            async with slots:
                r, _ = await _send(
                    client, "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", content=body,
                    headers={"Content-Type": "application/json"},
                )  # fmt: skip
            if r.status_code not in (200, 202, 404):  # 404: gone already (an earlier attempt, or never created)
                raise RuntimeError(f"delete pod {namespace}/{name}: {r.status_code} {r.text[:500]}")

        await asyncio.gather(*(delete(name) for name in _pod_names(pods)))


def _pod_names(pods: int) -> list[str]:
    return [f"p{i:05d}" for i in range(pods)]


def run_round(
    cluster: LoopbackCluster,
    scrapes: Scrapes | None,
    processes: Mapping[str, int],
    rnd: Round,
    concurrency: int,
    timeout_s: float,
    profile: Path | None = None,
    gated: bool = True,
) -> None:
    namespace = f"bench-{rnd.scheduler}-{rnd.index}"
    cluster.api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    wait_for(
        f"ServiceAccount {namespace}/default",
        lambda: cluster.api.get_or_none(f"/api/v1/namespaces/{namespace}/serviceaccounts/default"),
        60,
    )
    time.sleep(2.0)  # let the previous round's deletions and status writes settle
    rnd.load = load_line()
    before = scrapes.read(rnd.scheduler) if scrapes else {}
    cpu_before = {name: cpu_seconds(pid) for name, pid in processes.items()}
    spy = None
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        out = profile / f"extender-round-{rnd.index}.txt"
        argv = [_py_spy(), "record", "--pid", str(processes["kelvin extender"]), "--rate", "200", "--format", "raw",
                "--nonblocking", "--output", str(out)]  # fmt: skip
        spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        asyncio.run(_burst(cluster, rnd, namespace, concurrency, timeout_s, gated))
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait(5)
        rnd.cpu_s = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in processes.items()}
        if scrapes:
            rnd.breakdown = delta(scrapes.read(rnd.scheduler), before)
        _delete_pods(cluster, namespace, rnd.pods, concurrency, max(60.0, timeout_s))


# -- output ------------------------------------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def print_round(rnd: Round, breakdown: bool) -> None:
    what = "created" if math.isnan(rnd.create_s) else "gates removed"  # create_s: the untimed gated creation
    status = "" if rnd.bound == rnd.pods else f"  ONLY {rnd.bound}/{rnd.pods} BOUND before the timeout"
    print(
        f"round {rnd.index} {rnd.scheduler:>17}: {rnd.pods_per_s:6.1f} pods/s  ({rnd.pods} pods bound in "
        f"{rnd.elapsed_s:.2f} s; {what} in {rnd.release_s:.2f} s; released->bound p50 {_pct(rnd.to_bind_s, 0.5):.2f} s "
        f"p99 {_pct(rnd.to_bind_s, 0.99):.2f} s){status}",
        flush=True,
    )
    print(f"    load at start: {rnd.load}")
    print("    CPU s in the round: " + ", ".join(f"{k} {v:.1f}" for k, v in rnd.cpu_s.items()))
    if not breakdown:
        return
    for (family, labels), (total, count) in sorted(rnd.breakdown.items()):
        shown = ",".join(f"{k}={v}" for k, v in labels if k not in ("profile",))
        print(f"    {family}{{{shown}}}: {count:.0f} x mean {1000 * total / count:.2f} ms = {total:.2f} s")


def summary(rounds: list[Round], nodes: int, pods: int) -> None:
    def rates(name: str) -> list[float]:
        return [r.pods_per_s for r in rounds if r.scheduler == name]

    kelvin, default = rates(SCHEDULER_NAME), rates(DEFAULT_SCHEDULER)
    print()
    print(f"machine: {os.cpu_count()} CPUs ({cpu_model()}), {platform.system()} {platform.release()}")
    print(f"load at the end: {load_line()}")
    print(f"workload: bursts of {pods} one-GPU pods on {nodes} fake nodes x {GPUS_PER_NODE} GPUs, rounds alternating")
    for name, values in ((SCHEDULER_NAME, kelvin), (DEFAULT_SCHEDULER, default)):
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name:>17}: median {statistics.median(values):.1f} pods/s  (rounds: {shown})")
    ratio = statistics.median(kelvin) / statistics.median(default)
    per_pair = ", ".join(f"{k / d:.2f}" for k, d in zip(kelvin, default, strict=False))
    print(f"ratio kelvin / default: {ratio:.2f}  (per round pair: {per_pair})")


# -- setup -----------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100, help="fake 8-GPU nodes (default 100)")
    parser.add_argument("--pods", type=int, default=0, help="one-GPU pods per burst (default: 5 per node)")
    parser.add_argument("--rounds", type=int, default=2, help=f"rounds per scheduler, alternating (1..{MAX_ROUNDS})")
    parser.add_argument("--round-timeout-s", type=float, default=300.0, help="give up on a round after this long")
    parser.add_argument("--create-concurrency", type=int, default=16, help="pod creates in flight (default 16)")
    parser.add_argument(
        "--no-gates",
        action="store_true",
        help="time from the first create instead (pods created without a scheduling gate: creation is timed too)",
    )
    parser.add_argument("--no-breakdown", action="store_true", help="skip the schedulers' and extender's histograms")
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="record the extender with py-spy (on PATH or beside this Python) in each kelvin round: collapsed stacks "
        "in DIR/extender-round-N.txt",
    )
    parser.add_argument(
        "--telemetry",
        choices=("prometheus", "simulated"),
        default="prometheus",
        help="the extender's source: fake-NVML exporters through a real Prometheus (default), or a simulated fleet",
    )
    parser.add_argument(
        "--nodes-per-exporter", type=int, default=25, help="with --telemetry prometheus: nodes per exporter process"
    )
    parser.add_argument(
        "--scrape-interval-s",
        type=int,  # whole seconds: Prometheus reads "1.5s" as no duration at all
        default=SHARED_SCRAPE_INTERVAL_S,
        help=f"with --telemetry prometheus: Prometheus's scrape interval of every node (default "
        f"{SHARED_SCRAPE_INTERVAL_S:g}, the e2e suite's; the chart's ServiceMonitor scrapes every 15 s)",
    )
    parser.add_argument(
        "--prometheus-timeout-s",
        type=float,
        default=None,
        help="with --telemetry prometheus: the extender's prometheus_timeout_s (default: the installed chart's, 5)",
    )
    parser.add_argument(
        "--default-scheduler-qps",
        type=int,
        default=None,
        metavar="QPS",
        help="the default kube-scheduler's client rate (--kube-api-qps QPS, burst 2 x QPS; default: its own, 50): "
        "at its default its binds are held to ~50/s, while kelvin-scheduler's go through the extender's client",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="where the cluster's files and logs go")
    args = parser.parse_args(argv)
    if args.py_spy is not None:
        _py_spy()
    args.pods = args.pods or 5 * args.nodes
    if not 1 <= args.nodes <= 5000:
        parser.error("--nodes must be 1..5000")
    if not 1 <= args.pods <= args.nodes * GPUS_PER_NODE:
        parser.error(f"--pods must be 1..{args.nodes * GPUS_PER_NODE} (the fleet's GPUs)")
    if not 1 <= args.rounds <= MAX_ROUNDS:
        parser.error(f"--rounds must be 1..{MAX_ROUNDS}")
    if not 1 <= args.create_concurrency <= 256:
        parser.error("--create-concurrency must be 1..256")
    if not 1 <= args.nodes_per_exporter <= MAX_NODES_PER_EXPORTER:
        parser.error(
            f"--nodes-per-exporter must be 1..{MAX_NODES_PER_EXPORTER} (one connection per target: the exporter's "
            "--max-connections)"
        )
    if not 10 <= args.round_timeout_s <= 3600:
        parser.error("--round-timeout-s must be 10..3600")
    if not 1 <= args.scrape_interval_s <= 300:
        parser.error("--scrape-interval-s must be 1..300")
    if args.prometheus_timeout_s is not None and not 0 < args.prometheus_timeout_s <= 120:
        parser.error("--prometheus-timeout-s must be more than 0 and at most 120 (the extender's limit)")
    if args.default_scheduler_qps is not None and not 1 <= args.default_scheduler_qps <= 10_000:
        parser.error("--default-scheduler-qps must be 1..10000")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (RuntimeError, TimeoutError, OSError, httpx.HTTPError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    try:
        bins = find()
    except MissingBinaries as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kelvin-e2e-throughput."))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"kelvin e2e throughput: Kubernetes {bins.version}, {args.nodes} nodes, bursts of {args.pods} pods, "
          f"{args.rounds} round(s) each; logs in {workdir / 'logs'}", flush=True)  # fmt: skip
    rounds: list[Round] = []
    started = time.monotonic()
    qps = args.default_scheduler_qps
    flags = [] if qps is None else [f"--kube-api-qps={qps}", f"--kube-api-burst={2 * qps}"]
    if flags:
        print(f"default kube-scheduler: {' '.join(flags)}", flush=True)
    nodes = node_names(args.nodes)
    with running(bins, workdir, flags) as cluster, fake_nodes(cluster, nodes, gpus=GPUS_PER_NODE) as agent:
        print(f"control plane up in {cluster.started_in_s:.1f} s; {args.nodes} fake nodes Ready", flush=True)
        steps = run_documented(cluster, documented_manifest_install())
        failed = [s for s in steps if s.returncode != 0]
        if failed:
            print(
                f"error: kelvin's documented install failed: {failed[0].command}: {failed[0].output}", file=sys.stderr
            )
            return 1
        with contextlib.ExitStack() as stack:
            telemetry: Telemetry | None = None
            if args.telemetry == "simulated":
                fleet = workdir / "bench-fleet.yaml"
                fleet.write_text(yaml.safe_dump(bench_fleet(args.nodes)))
                # the installed Deployment's extender settings, telemetry from a simulated fleet of the fake nodes;
                # the Prometheus URL is then never read
                settings = {"KELVIN_SOURCE": "simulated", "KELVIN_FLEET_FILE": str(fleet)}
                prometheus_url = UNUSED_PROMETHEUS
            else:
                telemetry = stack.enter_context(telemetry_running(workdir / "telemetry", cluster.logs, {}))
                telemetry.shared_scrape_interval_s = args.scrape_interval_s
                telemetry.add_shared(node_names(args.nodes), GPU_MODEL, args.nodes_per_exporter)
                settings, prometheus_url = {}, telemetry.prometheus.url
                if args.prometheus_timeout_s is not None:
                    settings["KELVIN_PROMETHEUS_TIMEOUT_S"] = f"{args.prometheus_timeout_s:g}"
                print(f"{args.nodes} nodes scraped by Prometheus from {len(telemetry.shared)} exporters", flush=True)
            kelvin = start_kelvin_scheduler(cluster, workdir / "kelvin-scheduler", prometheus_url, settings)
            try:
                rounds.extend(_rounds(args, cluster, kelvin, telemetry, agent.popen.pid, started))
            finally:
                kelvin.stop()
    summary(rounds, args.nodes, args.pods)
    print(f"total wall time {time.monotonic() - started:.0f} s")
    return 0 if all(r.bound == r.pods for r in rounds) else 1


def _rounds(
    args: argparse.Namespace,
    cluster: LoopbackCluster,
    kelvin: KelvinScheduler,
    telemetry: Telemetry | None,
    agent_pid: int,
    started: float,
) -> list[Round]:
    rounds: list[Round] = []
    if telemetry is not None:

        def fresh() -> bool:
            kelvin.check_alive()
            return kelvin.telemetry_nodes("fresh") == args.nodes

        wait_for(f"extender: {args.nodes} nodes fresh from prometheus", fresh, 120 + args.nodes / 10, 1.0)
    shown = ", ".join(f"{k}={kelvin.extender_env[k]}" for k in ("KELVIN_SOURCE", "KELVIN_REFRESH_INTERVAL_S"))
    print(f"kelvin installed, kelvin-scheduler leading ({time.monotonic() - started:.0f} s); {shown}", flush=True)
    scrapes = None if args.no_breakdown else Scrapes(cluster, kelvin)
    for index in range(1, args.rounds + 1):
        for scheduler in (SCHEDULER_NAME, DEFAULT_SCHEDULER):
            if scheduler == SCHEDULER_NAME and index > 1 and telemetry is None:
                kelvin.restart_extender()  # a fresh simulated fleet: the last round's GPUs free again
            processes = {
                "kube-apiserver": cluster.processes["kube-apiserver"].popen.pid,
                "etcd": cluster.processes["etcd"].popen.pid,
                "kube-controller-manager": cluster.processes["kube-controller-manager"].popen.pid,
                "default kube-scheduler": cluster.processes["kube-scheduler"].popen.pid,
                "kelvin kube-scheduler": kelvin.scheduler.popen.pid,
                "kelvin extender": kelvin.extender.popen.pid,
                "fakenodes": agent_pid,
                "this bench": os.getpid(),
            }
            if telemetry is not None and telemetry.prometheus.process is not None:
                processes["prometheus"] = telemetry.prometheus.process.popen.pid
                for shared in telemetry.shared:
                    processes[f"exporter {shared.exporter.node}"] = shared.exporter.process.popen.pid
            rnd = Round(scheduler, index, args.pods, args.nodes)
            profile = args.py_spy if scheduler == SCHEDULER_NAME else None
            run_round(
                cluster, scrapes, processes, rnd, args.create_concurrency, args.round_timeout_s, profile,
                not args.no_gates,
            )  # fmt: skip
            kelvin.check_alive()
            rounds.append(rnd)
            print_round(rnd, not args.no_breakdown)
    return rounds


if __name__ == "__main__":
    sys.exit(main())
