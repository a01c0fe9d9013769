"""Telemetry of the e2e suite as production gets it: one ``kelvin exporter --fake`` per fake GPU node and ONE real
Prometheus (Debian's ``/usr/bin/prometheus``) scraping them; kelvin's extender reads that Prometheus
(``source=prometheus``). All on 127.0.0.1 with free ports, each a process of its own stopped by PID.

API (stable: other scenarios build on it)::

    telemetry = start(workdir, logs, {"e2e-nvs-1": "H100-SXM-80GB", ...})   # exporters + Prometheus, scraped once
    telemetry.prometheus.url                       # http://127.0.0.1:PORT, for KELVIN_PROMETHEUS_URL
    telemetry.set_gpus("e2e-nvs-1", {"all": {"temperature": 95}})   # the fake's state file (docs/exporter.md)
    telemetry.reset("e2e-nvs-1")                   # back to the suite's start state (every GPU idle)
    telemetry.reset_all()
    telemetry.wait_query('max(kelvin_gpu_temperature_celsius{node="e2e-nvs-1"}) >= 95')   # until Prometheus has it
    telemetry.prometheus.stop(); telemetry.prometheus.start()        # an outage, then back on the same port/tsdb
    telemetry.stop()

Each exporter runs ``kelvin exporter --fake --no-fake-vary --node-name <node> --fake-model <model>
--fake-state-file <file>``. :meth:`Telemetry.set_gpus` writes that file atomically; the exporter applies it within
0.2 s, and Prometheus has it at its next scrape (every :data:`SCRAPE_INTERVAL_S`). The state is declarative, on top
of :data:`START_STATE` (every GPU idle: no process, 38 °C), so the placements of a scenario depend only on the pods it
creates (kelvin learns the pods' GPUs from their ``kelvin.dev/gpu-assigned`` annotations, not from the fake NVML).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from scheduler_plugin.nvml.fake_state import parse_state
from tests.e2e.api import wait_for
from tests.e2e.cluster import Process, free_port, spawn

PROMETHEUS = "prometheus"
PROMETHEUS_DEBIAN = "/usr/bin/prometheus"
SCRAPE_INTERVAL_S = 1
#: Every GPU idle: the fake's own start-up state runs a training pod on most GPUs.
START_STATE: dict[str, Any] = {"all": {"busy": False}}


class MissingPrometheus(RuntimeError):
    pass


def prometheus_binary() -> str:
    found = shutil.which(PROMETHEUS) or (PROMETHEUS_DEBIAN if os.access(PROMETHEUS_DEBIAN, os.X_OK) else None)
    if found is None:
        raise MissingPrometheus(
            "prometheus is not installed: `bash .ci/install-tools.sh` (Debian's prometheus package) or put it on PATH"
        )
    return found


def _kelvin() -> str:
    found = shutil.which("kelvin", path=str(Path(sys.executable).parent)) or shutil.which("kelvin")
    if found is None:
        raise RuntimeError("the kelvin command is not installed (pip install -e .)")
    return found


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_state(path: Path, node: str, gpus: Mapping[str, Mapping[str, Any]]) -> None:
    """A fake state file: :data:`START_STATE` overlaid with ``gpus``. Checked here first (the exporter's own
    parser), so that a scenario's typo fails in the test rather than being logged and ignored by the exporter."""
    merged: dict[str, dict[str, Any]] = {k: dict(v) for k, v in START_STATE.items()}
    for key, values in gpus.items():
        merged.setdefault(key, {}).update(values)
    doc = {"gpus": merged}
    parse_state(doc, f"state of {node}")
    _write_atomically(path, yaml.safe_dump(doc))


@dataclass
class FakeExporter:
    """One node's ``kelvin exporter --fake``."""

    node: str
    model: str
    port: int
    state_file: Path
    process: Process

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_gpus(self, gpus: Mapping[str, Mapping[str, Any]]) -> None:
        """Write the state file: :data:`START_STATE` overlaid with ``gpus`` (GPU index or ``all`` -> fields of
        docs/exporter.md's state file)."""
        write_state(self.state_file, self.node, gpus)

    def healthy(self) -> bool:
        if not self.process.alive():
            raise RuntimeError(
                f"exporter of {self.node} exited ({self.process.popen.returncode}):\n{self.process.tail()}"
            )
        try:
            return httpx.get(f"http://{self.target}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.process.stop()


@dataclass
class Prometheus:
    """One real Prometheus: static scrape targets (the exporters), tsdb in ``data``, on 127.0.0.1:``port``.
    :meth:`stop` and :meth:`start` keep the port and the tsdb (a restart, as a Pod's container restart)."""

    port: int
    config: Path
    data: Path
    logs: Path
    process: Process | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [
            prometheus_binary(),
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.data}",
            "--storage.tsdb.retention.time=2h",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-admin-api",  # delete_series: the series of nodes taken away (Telemetry.reload)
            "--log.level=info",
        ]

    def start(self, timeout: float = 60) -> None:
        """Start and wait for ``/-/ready``."""
        if self.process is not None and self.process.alive():
            raise RuntimeError("prometheus is already running")
        self.process = spawn(f"prometheus-{self.starts}", self.argv(), self.logs)
        self.starts += 1
        proc = self.process

        def ready() -> bool:
            if not proc.alive():
                raise RuntimeError(f"prometheus exited ({proc.popen.returncode}):\n{proc.tail()}")
            try:
                return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for("prometheus /-/ready", ready, timeout, 0.25)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=15)
            self.process = None

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def delete_series(self, matchers: Sequence[str]) -> None:
        """Delete the series matching any of ``matchers`` (the TSDB admin API): gone from queries at once."""
        resp = httpx.post(
            f"{self.url}/api/v1/admin/tsdb/delete_series", params=[("match[]", m) for m in matchers], timeout=30
        )
        if resp.status_code != 204:
            raise RuntimeError(f"prometheus delete_series {matchers}: HTTP {resp.status_code}: {resp.text:.300}")

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector of ``promql`` (``data.result``); RuntimeError for a failed query."""
        resp = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5)
        doc = orjson.loads(resp.content)
        if doc.get("status") != "success":
            raise RuntimeError(f"prometheus query {promql!r}: HTTP {resp.status_code}: {doc.get('error')}")
        return list(doc["data"]["result"])


#: Nodes one shared exporter serves at most: Prometheus keeps one connection per target, and the exporter answers
#: 503 past its ``--max-connections`` (64 by default).
MAX_NODES_PER_EXPORTER = 64
#: What an exporter whose port was taken before it bound it prints (click's error for ``--port``), and how many
#: times :meth:`Telemetry.add_shared` starts such an exporter.
PORT_TAKEN = "Address already in use"
PORT_TRIES = 3
#: The job of the exporters that serve several nodes each (:meth:`Telemetry.add_shared`).
SHARED_JOB = "kelvin-exporter-shared"
#: Its scrape interval: a few exporters serve ~100 nodes' targets, and Prometheus ingests every one's ~1,000 samples
#: per scrape (the chart's ServiceMonitor default is 15 s; the extender's ``telemetry.maxAgeSeconds`` 30 s).
SHARED_SCRAPE_INTERVAL_S = 5


def prometheus_config(
    targets: Mapping[str, str],
    shared: Mapping[str, str] | None = None,
    shared_interval_s: int = SHARED_SCRAPE_INTERVAL_S,
) -> dict[str, Any]:
    """Static scrape targets: job ``kelvin-exporter`` with one exporter per node (node -> ``host:port``; the series'
    ``node`` label is the exporter's own ``--node-name``), and, when ``shared`` (node -> ``host:port``) is given, job
    :data:`SHARED_JOB` with one target per node on exporters that serve several nodes: the target's ``node`` label
    names the node (``honor_labels: false``, so the exporter's own ``node`` label becomes ``exported_node``) and each
    ``uuid`` gets the node's name appended, so every node's GPUs have UUIDs of their own, as with one exporter each."""
    jobs: list[dict[str, Any]] = [
        {
            "job_name": "kelvin-exporter",
            "static_configs": [
                {"targets": [target], "labels": {"kubernetes_node": node}} for node, target in targets.items()
            ],
        }
    ]
    if shared:
        jobs.append(
            {
                "job_name": SHARED_JOB,
                "scrape_interval": f"{shared_interval_s}s",
                "scrape_timeout": f"{shared_interval_s}s",
                "honor_labels": False,
                "static_configs": [{"targets": [target], "labels": {"node": node}} for node, target in shared.items()],
                "metric_relabel_configs": [
                    {
                        "source_labels": ["uuid", "node"],
                        "separator": "@",
                        "regex": "(.+)@(.+)",
                        "target_label": "uuid",
                        "replacement": "${1}-${2}",
                    }
                ],
            }
        )
    return {
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": f"{SCRAPE_INTERVAL_S}s"},
        "scrape_configs": jobs,
    }


@dataclass
class SharedExporter:
    """One ``kelvin exporter --fake`` scraped as the target of each of ``nodes`` (:meth:`Telemetry.add_shared`)."""

    exporter: FakeExporter
    nodes: tuple[str, ...]


@dataclass
class Telemetry:
    exporters: dict[str, FakeExporter]
    prometheus: Prometheus
    workdir: Path
    logs: Path
    shared: list[SharedExporter] = field(default_factory=list)
    shared_scrape_interval_s: int = SHARED_SCRAPE_INTERVAL_S
    """The shared exporters' job's scrape interval, whole seconds (``bench/e2e_throughput.py --scrape-interval-s``)."""

    def targets(self) -> int:
        """Nodes Prometheus scrapes: one exporter each, and each node of the shared exporters."""
        return len(self.exporters) + sum(len(s.nodes) for s in self.shared)

    def reload(self, timeout: float = 60, removed: Sequence[str] = ()) -> None:
        """Write the scrape configuration of the exporters now registered, have Prometheus reload it (SIGHUP; a
        stopped Prometheus reads it at its next start) and wait until every node is scraped and no other is.

        ``removed``: nodes just taken away, whose series are deleted (admin API) once the reload is done: Prometheus
        2.42 writes no staleness markers for the targets of a removed job (their last samples were still answered
        80 s after the reload, and would be for the 5-minute lookback), so the next scenario would see them."""
        shared = {node: s.exporter.target for s in self.shared for node in s.nodes}
        targets = {n: e.target for n, e in self.exporters.items()}
        config = prometheus_config(targets, shared, self.shared_scrape_interval_s)
        _write_atomically(self.prometheus.config, yaml.safe_dump(config))
        if not self.prometheus.alive():
            return
        assert self.prometheus.process is not None
        os.kill(self.prometheus.process.popen.pid, signal.SIGHUP)
        if removed:
            want = len(targets) + len(shared)

            def applied() -> bool:
                resp = httpx.get(f"{self.prometheus.url}/api/v1/targets", params={"state": "active"}, timeout=5)
                return len(orjson.loads(resp.content)["data"]["activeTargets"]) == want

            wait_for(f"prometheus: {want} scrape targets", applied, timeout, 0.25)
            names = "|".join(removed)
            self.prometheus.delete_series([f'{{node=~"{names}"}}', f'{{kubernetes_node=~"{names}"}}'])
        self.wait_scraped(timeout)

    def add_exporter(self, node: str, model: str, *, seed: int | None = None, nvlink_islands: int = 1) -> FakeExporter:
        """One more node's exporter (``seed``: its fake backend's, for GPUs with the UUIDs of a device plugin started
        with the same ``--fake-seed``), scraped once this returns. :meth:`remove_exporter` takes it away."""
        if node in self.exporters:
            raise ValueError(f"{node} has an exporter already")
        exporter = start_exporter(node, model, self.workdir, self.logs, nvlink_islands, seed=seed)
        try:
            wait_for(f"exporter of {node} /healthz", exporter.healthy, 60, 0.25)
            self.exporters[node] = exporter
            self.reload()
        except BaseException:
            self.exporters.pop(node, None)
            exporter.stop()
            raise
        return exporter

    def remove_exporter(self, node: str) -> None:
        exporter = self.exporters.pop(node)
        try:
            self.reload(removed=[node])
        finally:
            exporter.stop()

    def add_shared(self, nodes: Sequence[str], model: str, per_exporter: int = 25) -> list[SharedExporter]:
        """Telemetry for many more nodes than one exporter process each fits on a small machine: ``kelvin exporter
        --fake`` processes serving ``per_exporter`` nodes each, Prometheus scraping one target per node (job
        :data:`SHARED_JOB`, see :func:`prometheus_config`); every GPU idle. Returns once every node is scraped;
        :meth:`remove_shared` takes them away."""
        if not 1 <= per_exporter <= MAX_NODES_PER_EXPORTER:
            raise ValueError(f"per_exporter: {per_exporter} is not in 1..{MAX_NODES_PER_EXPORTER}")
        added: list[SharedExporter] = []
        try:
            for i in range(0, len(nodes), per_exporter):
                group = tuple(nodes[i : i + per_exporter])
                name = f"shared-{len(self.shared) + len(added) + 1}-{group[0]}"
                added.append(SharedExporter(start_exporter(name, model, self.workdir, self.logs), group))
            for i, s in enumerate(added):
                added[i] = self._listening(s, model)
            self.shared.extend(added)
            self.reload(timeout=120)
        except BaseException:
            self.shared = [s for s in self.shared if s not in added]
            for s in added:
                s.exporter.stop()
            raise
        return added

    def _listening(self, shared: SharedExporter, model: str) -> SharedExporter:
        """``shared`` once its exporter answers /healthz; started again on another port (at most twice) when the
        port :func:`free_port` picked was taken before the exporter bound it: with a thousand fake nodes' and
        Prometheus's connections, an ephemeral port is soon some connection's."""
        current = shared
        try:
            for attempt in range(PORT_TRIES):
                try:
                    wait_for(f"exporter {current.exporter.node} /healthz", current.exporter.healthy, 120, 0.5)
                    return current
                except RuntimeError as e:
                    if PORT_TAKEN not in str(e) or attempt == PORT_TRIES - 1:
                        raise
                exporter = start_exporter(shared.exporter.node, model, self.workdir, self.logs)
                current = SharedExporter(exporter, shared.nodes)
        except BaseException:
            if current is not shared:  # add_shared stops the ones it started
                current.exporter.stop()
            raise
        raise AssertionError("unreachable: the last try returns or raises")

    def remove_shared(self, exporters: Sequence[SharedExporter]) -> None:
        self.shared = [s for s in self.shared if s not in exporters]
        try:
            self.reload(timeout=120, removed=[node for s in exporters for node in s.nodes])
        finally:
            for s in exporters:
                s.exporter.stop()

    def set_gpus(self, node: str, gpus: Mapping[str, Mapping[str, Any]]) -> None:
        self.exporters[node].set_gpus(gpus)

    def reset(self, node: str) -> None:
        self.exporters[node].set_gpus({})

    def reset_all(self) -> None:
        for exporter in self.exporters.values():
            exporter.set_gpus({})

    def wait_query(self, promql: str, timeout: float = 30) -> list[dict[str, Any]]:
        """Until ``promql`` returns a non-empty vector (e.g. a comparison that holds once scraped)."""

        def probe() -> list[dict[str, Any]] | None:
            try:
                return self.prometheus.query(promql) or None
            except (httpx.HTTPError, RuntimeError):
                return None

        return wait_for(f"prometheus: {promql}", probe, timeout, 0.25)

    def wait_scraped(self, timeout: float = 60) -> None:
        """Until Prometheus has every node's GPUs (all exporters up and scraped)."""
        want = self.targets()

        def probe() -> bool:
            try:
                up = self.prometheus.query('count(up{job=~"kelvin-exporter|kelvin-exporter-shared"} == 1)')
                nodes = self.prometheus.query("count(count by (node) (kelvin_gpu_memory_used_bytes))")
            except (httpx.HTTPError, RuntimeError):
                return False
            # count() of nothing is an empty vector: no node scraped
            return all((int(v[0]["value"][1]) if v else 0) == want for v in (up, nodes))

        wait_for(f"prometheus scraping {want} nodes", probe, timeout, 0.25)

    def stop(self) -> None:
        self.prometheus.stop()
        for exporter in [*self.exporters.values(), *(s.exporter for s in self.shared)]:
            exporter.stop()


def start_exporter(
    node: str, model: str, workdir: Path, logs: Path, nvlink_islands: int = 1, *, seed: int | None = None
) -> FakeExporter:
    """``seed``: the fake backend's (UUIDs); by default one of the node's name."""
    port = free_port()
    state = workdir / f"state-{node}.yaml"
    argv = [
        _kelvin(),
        "exporter",
        "--fake",
        "--no-fake-vary",
        f"--fake-model={model}",
        f"--fake-seed={sum(node.encode()) if seed is None else seed}",
        f"--fake-state-file={state}",
        f"--fake-nvlink-islands={nvlink_islands}",
        f"--node-name={node}",
        "--host=127.0.0.1",
        f"--port={port}",
        "--log-level=warning",
    ]
    write_state(state, node, {})
    env = {k: v for k, v in os.environ.items() if not k.startswith("KELVIN_") and k != "NODE_NAME"}
    return FakeExporter(node, model, port, state, spawn(f"exporter-{node}", argv, logs, env=env))


def start(
    workdir: Path, logs: Path, nodes: Mapping[str, str], nvlink_islands: Mapping[str, int] | None = None
) -> Telemetry:
    """Exporters for ``nodes`` (node -> fake model; ``nvlink_islands``: node -> NVLink islands of its board, 1 when
    absent) and Prometheus scraping them; returns once every node's GPUs are in Prometheus. On failure, whatever
    started is stopped."""
    workdir.mkdir(parents=True, exist_ok=True)
    prometheus_binary()
    exporters: dict[str, FakeExporter] = {}
    prometheus: Prometheus | None = None
    try:
        for node, model in nodes.items():
            exporters[node] = start_exporter(node, model, workdir, logs, (nvlink_islands or {}).get(node, 1))
        for exporter in exporters.values():
            wait_for(f"exporter of {exporter.node} /healthz", exporter.healthy, 60, 0.25)
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config({n: e.target for n, e in exporters.items()})))
        prometheus = Prometheus(free_port(), config, workdir / "prometheus-data", logs)
        prometheus.start()
        telemetry = Telemetry(exporters, prometheus, workdir, logs)
        telemetry.wait_scraped()
        return telemetry
    except BaseException:
        if prometheus is not None:
            prometheus.stop()
        for exporter in exporters.values():
            exporter.stop()
        raise


@contextlib.contextmanager
def running(
    workdir: Path, logs: Path, nodes: Mapping[str, str], nvlink_islands: Mapping[str, int] | None = None
) -> Iterator[Telemetry]:
    telemetry = start(workdir, logs, nodes, nvlink_islands)
    try:
        yield telemetry
    finally:
        telemetry.stop()
