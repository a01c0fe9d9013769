"""What the operator scenarios (tests/e2e/test_operator_*.py) run beside the loopback control plane:

* fake GPU nodes of their own (``e2e-op-*``, a second tests/e2e/fakenodes.py agent), so that no taint or eviction
  of theirs touches the fleet the placement scenarios share; their Node objects are deleted afterwards;
* their GPUs' telemetry, changed at run time: one kelvin exporter per node (``scheduler_plugin.exporter``, the real
  exporter code) on the fake NVML backend, served on 127.0.0.1 by this process, scraped every second by a real
  Prometheus; the operator reads it with ``source=prometheus``, the telemetry path of a production install. A test
  heats a GPU or gives a fake process GPU memory by changing the :class:`FakeGpu` fields, as the fake NVML's own tests
  do. (The scrape source cannot be used here: the API server refuses loopback addresses in EndpointSlices.)
* ``kelvin operator`` replicas as local processes with the installed Deployment's settings, on the operator
  ServiceAccount's token (the chart's RBAC), each with its own ``HOSTNAME`` (the Events' ``reportingInstance``) and
  kopf identity (``POD_ID``), as two pods of the Deployment would have.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from scheduler_plugin.exporter.app import Exporter
from scheduler_plugin.exporter.fake_nvml import FakeGpu, FakeNvml, FakeProcess, write_proc
from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster, Process, free_port, spawn
from tests.e2e.fleet import GPU_MODEL, GPUS_PER_NODE
from tests.e2e.kubebin import ROOT
from tests.e2e.test_operator_events import installed_operator_env

NAMESPACE = "kelvin-system"
OPERATOR_SA = "kelvin-operator"
#: No scheduler has this name: pods the scenarios create stay Pending until the test binds them (a replacement
#: created after an eviction stays Pending too, and never lands on the shared fleet).
NO_SCHEDULER = "e2e-operator-none"
PEERING = "/apis/kopf.dev/v1/clusterkopfpeerings"


def _kelvin() -> str:
    found = shutil.which("kelvin", path=str(Path(sys.executable).parent)) or shutil.which("kelvin")
    if found is None:
        raise RuntimeError("the kelvin command is not installed (pip install -e .)")
    return found


# ---- fake nodes ----------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def fake_nodes(cluster: LoopbackCluster, names: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    """Nodes of the scenario's own, Ready, their pods reported Running (tests/e2e/fakenodes.py); deleted after."""
    p = cluster.pki
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    argv = [
        sys.executable, "-m", "tests.e2e.fakenodes", f"--server={cluster.server}", f"--ca={p.ca.cert}",
        f"--cert={p.admin.cert}", f"--key={p.admin.key}", f"--nodes={','.join(names)}", f"--gpus={GPUS_PER_NODE}",
        f"--kubelet-version={cluster.bins.version}",
    ]  # fmt: skip
    agent = spawn(f"fakenodes-{names[0]}", argv, cluster.logs, env=env)
    try:

        def all_ready() -> bool:
            if not agent.alive():
                raise RuntimeError(f"fakenodes exited ({agent.popen.returncode}):\n{agent.tail()}")
            return all(cluster.node_ready(name) for name in names)

        wait_for(f"fake nodes {names} Ready", all_ready, 60)
        yield names
    finally:
        agent.stop()
        for name in names:
            cluster.api.delete(f"/api/v1/nodes/{name}")


# ---- telemetry -----------------------------------------------------------------------------------------------------
@dataclass
class GpuBox:
    """One node's GPUs: the fake NVML the test changes, and the kelvin exporter serving it on 127.0.0.1."""

    node: str
    nvml: FakeNvml
    exporter: Exporter
    port: int
    proc_root: Path
    pods_dir: Path
    next_pid: int = 4000

    def gpu(self, index: int) -> FakeGpu:
        return self.nvml.gpus[index]

    def heat(self, index: int, celsius: int) -> None:
        self.gpu(index).temperature_celsius = celsius

    def run(self, index: int, pod: Mapping[str, Any], used_bytes: int) -> FakeProcess:
        """A process of ``pod`` on GPU ``index`` holding ``used_bytes``, attributed to the pod as on a real node
        (the fake ``/proc`` cgroup and the kubelet's pod directory)."""
        meta = pod["metadata"]
        self.next_pid += 1
        proc = FakeProcess(self.next_pid, used_bytes, meta["uid"], meta["namespace"], meta["name"])
        self.gpu(index).processes.append(proc)
        write_proc(self.nvml, self.proc_root, self.pods_dir)
        return proc


@dataclass
class Telemetry:
    """Exporters for ``boxes`` and the Prometheus scraping them (``url``)."""

    url: str
    boxes: dict[str, GpuBox]
    prometheus: Process

    def value(self, query: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": query}, timeout=5)
        r.raise_for_status()
        return list(r.json()["data"]["result"])

    def shows(self, query: str, timeout: float = 30) -> None:
        """Wait until the PromQL ``query`` has a result: a change made to the fake GPUs reached Prometheus."""
        wait_for(f"Prometheus showing {query}", lambda: self.value(query), timeout, 0.5)

    def temperature(self, node: str, index: int, celsius: int, timeout: float = 30) -> None:
        """Set GPU ``index`` of ``node`` to ``celsius`` and wait until Prometheus has scraped it."""
        self.boxes[node].heat(index, celsius)
        self.shows(f'kelvin_gpu_temperature_celsius{{node="{node}",gpu="{index}"}} == {celsius}', timeout)


@contextlib.contextmanager
def telemetry(prometheus_bin: str, workdir: Path, logs: Path, nodes: tuple[str, ...]) -> Iterator[Telemetry]:
    workdir.mkdir(parents=True, exist_ok=True)
    boxes: dict[str, GpuBox] = {}
    prometheus: Process | None = None
    try:
        for i, node in enumerate(nodes):
            nvml = FakeNvml(GPUS_PER_NODE, GPU_MODEL, seed=100 + i, vary=False)
            proc_root, pods_dir = workdir / node / "proc", workdir / node / "pods"
            proc_root.mkdir(parents=True)
            pods_dir.mkdir(parents=True)
            exporter = Exporter(nvml, node, proc_root=proc_root, pods_dir=pods_dir, watch_xid=False)
            boxes[node] = GpuBox(node, nvml, exporter, exporter.start("127.0.0.1", 0), proc_root, pods_dir)
        targets = [f"127.0.0.1:{b.port}" for b in boxes.values()]
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": "kelvin-exporter", "honor_labels": True, "static_configs": [{"targets": targets}]}
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        argv = [
            prometheus_bin, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
        ]  # fmt: skip
        prometheus = spawn("prometheus-operator-e2e", argv, logs)
        found = Telemetry(f"http://127.0.0.1:{port}", boxes, prometheus)

        def all_up() -> bool:
            if not prometheus.alive():
                raise RuntimeError(f"prometheus exited:\n{prometheus.tail()}")
            try:
                up = found.value("count(up == 1)")
            except httpx.HTTPError:
                return False
            return bool(up) and up[0]["value"][1] == str(len(targets))

        wait_for("Prometheus scraping every exporter", all_up, 60, 0.5)
        yield found
    finally:
        if prometheus is not None:
            prometheus.stop(timeout=10)
        for box in boxes.values():
            box.exporter.stop()


# ---- the operator --------------------------------------------------------------------------------------------------
@dataclass
class Replica:
    """One ``kelvin operator`` process: ``name`` is its HOSTNAME (Events' reportingInstance) and kopf identity."""

    name: str
    process: Process
    settings: dict[str, str] = field(default_factory=dict)

    def alive(self) -> bool:
        return self.process.alive()

    def check_alive(self) -> None:
        if not self.process.alive():
            raise RuntimeError(f"kelvin operator {self.name} exited ({self.process.popen.returncode}):\n{self.tail()}")

    def tail(self, lines: int = 60) -> str:
        return self.process.tail(lines)

    def kill(self) -> None:
        """SIGKILL, as a crashed container: no goodbye to the peering object."""
        os.killpg(self.process.popen.pid, 9)
        self.process.popen.wait(10)

    def stop(self) -> None:
        self.process.stop(timeout=20)  # kopf's cleanup takes a few seconds after SIGTERM


#: The scenarios' timing: a cycle every 2 s over each node, telemetry refreshed every second, pods old enough at
#: once, a cool node leaves hot after 3 s below coolCelsius, a checkpoint request times out after 15 s.
FAST = {
    "KELVIN_REFRESH_INTERVAL_S": "1",
    "KELVIN_OPERATOR_PROTECTION__MIN_POD_AGE_S": "0",
    "KELVIN_OPERATOR_HOTNESS__HOLD_S": "3",
    "KELVIN_OPERATOR_CHECKPOINT__TIMEOUT_S": "15",
    "KELVIN_OPERATOR_LIMITS__MAX_PER_NAMESPACE": "10",
    "KELVIN_OPERATOR_LIMITS__MAX_TOTAL": "20",
}


def start_operator(
    cluster: LoopbackCluster,
    tel: Telemetry,
    workdir: Path,
    name: str,
    *,
    interval_s: float = 2.0,
    settings: Mapping[str, str] | None = None,
) -> Replica:
    """``kelvin operator`` as the installed Deployment runs it (its KELVIN_OPERATOR_* settings, the policy ConfigMap,
    the operator ServiceAccount's token, peering on), telemetry from ``tel``'s Prometheus; webhooks off (the
    admission scenario covers them), /metrics and the liveness probe on free loopback ports. ``settings``: more
    KELVIN_* variables (over :data:`FAST`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    policy = workdir / "policy.yaml"
    cm = cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/kelvin-policy")
    policy.write_text(cm["data"]["policy.yaml"])
    installed = installed_operator_env(cluster)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KELVIN_") and k not in ("KUBECONFIG", "POD_ID")}
    env.update({k: v for k, v in installed.items() if k.startswith("KELVIN_OPERATOR_")})
    env.update(
        {
            "HOSTNAME": name,
            "POD_ID": name,
            "KELVIN_POLICY_FILE": str(policy),
            "KELVIN_SOURCE": "prometheus",
            "KELVIN_PROMETHEUS_URL": tel.url,
            "KELVIN_KUBECONFIG": str(cluster.token_kubeconfig(NAMESPACE, OPERATOR_SA)),
            "KELVIN_OPERATOR_WEBHOOK__ENABLED": "false",
            "KELVIN_OPERATOR_METRICS_ADDR": "127.0.0.1",
            "KELVIN_OPERATOR_METRICS_PORT": str(free_port()),
            **FAST,
            **(settings or {}),
        }
    )
    argv = [
        _kelvin(), "operator", f"--liveness=http://127.0.0.1:{free_port()}/healthz", f"--interval={interval_s:g}",
    ]  # fmt: skip
    replica = Replica(name, spawn(f"kelvin-operator-{name}", argv, cluster.logs, env=env), env)
    time.sleep(0.5)
    replica.check_alive()
    return replica


def peers(cluster: LoopbackCluster, peering: str = "kelvin") -> dict[str, dict[str, Any]]:
    """The live entries of the ClusterKopfPeering ``peering``: identity -> {priority, lifetime, lastseen}."""
    obj = cluster.api.get(f"{PEERING}/{peering}")
    return {k: dict(v) for k, v in (obj.get("status") or {}).items() if isinstance(v, dict)}


# ---- pods ----------------------------------------------------------------------------------------------------------
def replica_set(name: str, replicas: int, *, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A ReplicaSet of one-GPU pods that no scheduler places (the test binds them): a controller owns them, so the
    operator may evict them, and a replacement stays Pending."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations or {}},
                "spec": {
                    "schedulerName": NO_SCHEDULER,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox:e2e",
                            "command": ["sleep", "infinity"],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def bind(cluster: LoopbackCluster, pod: Mapping[str, Any], node: str, gpu: int) -> dict[str, Any]:
    """Bind ``pod`` to GPU ``gpu`` of ``node`` as kelvin-scheduler would (the assignment annotations, then a
    Binding); returns the pod once the fake kubelet reports it Running."""
    meta = pod["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
    annotations = {"kelvin.dev/gpu-assigned": str(gpu), "kelvin.dev/gpu-assigned-node": node}
    cluster.api.merge_patch(path, {"metadata": {"annotations": annotations}})
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"]},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
    cluster.api.create(f"{path}/binding", binding)

    def running() -> dict[str, Any] | None:
        p = dict(cluster.api.get(path))
        return p if p.get("status", {}).get("phase") == "Running" else None

    return wait_for(f"pod {meta['name']} Running on {node}", running, 30)


def pods_of(cluster: LoopbackCluster, namespace: str, app: str) -> list[dict[str, Any]]:
    listing = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"app={app}")
    return sorted(listing["items"], key=lambda p: p["metadata"]["name"])


def events(
    cluster: LoopbackCluster, *, namespace: str | None = None, name: str | None = None, reason: str | None = None
) -> list[dict[str, Any]]:
    """Events (all namespaces unless ``namespace``) about the object ``name`` with ``reason``."""
    selector = ",".join(f"{k}={v}" for k, v in (("involvedObject.name", name), ("reason", reason)) if v is not None)
    path = f"/api/v1/namespaces/{namespace}/events" if namespace else "/api/v1/events"
    return list(cluster.api.get(path, fieldSelector=selector)["items"])


def taints(cluster: LoopbackCluster, node: str) -> list[dict[str, Any]]:
    return list(cluster.api.get(f"/api/v1/nodes/{node}")["spec"].get("taints") or [])


def thermal_taint(cluster: LoopbackCluster, node: str) -> dict[str, Any] | None:
    found = [t for t in taints(cluster, node) if t["key"] == "kelvin.dev/thermal"]
    return found[0] if found else None
