"""What the operator scenarios (tests/e2e/test_operator_*.py) run beside the loopback control plane:

* fake GPU nodes of their own (``e2e-op-*``, a second tests/e2e/fakenodes.py agent), so that no taint or eviction
  of theirs touches the fleet the placement scenarios share; their Node objects are deleted afterwards;
* their GPUs' telemetry, changed at run time: tests/e2e/telemetry.py's ``kelvin exporter --fake`` per node and a
  real Prometheus of their own (:class:`GpuState`); the operator reads it with ``source=prometheus``, the telemetry
  path of a production install. (The chart's default ``source=scrape`` cannot be used here: the API server refuses
  loopback addresses in EndpointSlices.)
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

import pytest

from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster, Process, free_port, spawn
from tests.e2e.fleet import GPU_MODEL, GPUS_PER_NODE
from tests.e2e.kubebin import ROOT
from tests.e2e.telemetry import Telemetry
from tests.e2e.telemetry import running as telemetry_running
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
            # kopf's finalizer (its node timers put one on every GPU node, docs/operator.md) holds a deleted Node
            # while no operator runs: removed as the docs tell an admin to, so the next scenarios never see these nodes
            if cluster.api.get_or_none(f"/api/v1/nodes/{name}") is not None:
                cluster.api.merge_patch(f"/api/v1/nodes/{name}", {"metadata": {"finalizers": None}})
        wait_for(
            f"fake nodes {names} deleted",
            lambda: all(cluster.api.get_or_none(f"/api/v1/nodes/{n}") is None for n in names),
            30,
        )


# ---- telemetry -----------------------------------------------------------------------------------------------------
@dataclass
class GpuState:
    """The scenario's fake GPUs over tests/e2e/telemetry.py (one ``kelvin exporter --fake`` per node, a real
    Prometheus): the state-file overlay of each node kept here, so that a test changes one GPU field at a time."""

    telemetry: Telemetry
    overlay: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.telemetry.prometheus.url

    def update(self, node: str, gpu: int, **fields: Any) -> None:
        """Change GPU ``gpu`` of ``node`` (the state file's fields: temperature, processes, ...)."""
        self.overlay.setdefault(node, {}).setdefault(str(gpu), {}).update(fields)
        self.telemetry.set_gpus(node, self.overlay[node])

    def temperature(self, node: str, gpu: int, celsius: int, timeout: float = 30) -> None:
        """Set GPU ``gpu`` of ``node`` to ``celsius`` and wait until Prometheus has scraped it."""
        self.update(node, gpu, temperature=celsius)
        self.telemetry.wait_query(f'kelvin_gpu_temperature_celsius{{node="{node}",gpu="{gpu}"}} == {celsius}', timeout)

    def run(self, node: str, gpu: int, pod: Mapping[str, Any], used: str, pid: int) -> None:
        """A process of ``pod`` on GPU ``gpu`` holding ``used`` (a quantity), attributed to the pod as on a real node
        (through the fake's ``/proc``); waits until Prometheus has it."""
        meta = pod["metadata"]
        procs = list(self.overlay.get(node, {}).get(str(gpu), {}).get("processes", []))
        procs.append({"pid": pid, "used": used, "podUid": meta["uid"], "namespace": meta["namespace"],
                      "pod": meta["name"]})  # fmt: skip
        self.update(node, gpu, processes=procs)
        self.telemetry.wait_query(f'kelvin_gpu_process_memory_used_bytes{{node="{node}",pod_uid="{meta["uid"]}"}}')

    def reset(self) -> None:
        self.overlay.clear()
        self.telemetry.reset_all()


@contextlib.contextmanager
def gpu_telemetry(cluster: LoopbackCluster, workdir: Path, nodes: tuple[str, ...]) -> Iterator[GpuState]:
    """Exporters for ``nodes`` (the suite's GPU model) and a Prometheus of the scenario's own: the operator reads
    only these nodes' telemetry, never the shared fleet's."""
    with telemetry_running(workdir, cluster.logs, dict.fromkeys(nodes, GPU_MODEL)) as t:
        yield GpuState(t)


def nodes_with_telemetry(nodes: tuple[str, ...], name: str) -> Any:
    """A module-scoped fixture ``tel``: the scenario's own fake nodes (``nodes``) with their exporters and Prometheus
    (:func:`gpu_telemetry`), removed at the end of the module. Skips without prometheus (fails under CI). Use it as
    ``tel = nodes_with_telemetry((NODE,), "peering")`` at the top of a test module."""

    @pytest.fixture(scope="module", name="tel")
    def tel(
        cluster: LoopbackCluster,
        kelvin_installed: None,
        prometheus_bin: str,
        tmp_path_factory: pytest.TempPathFactory,
    ) -> Iterator[GpuState]:
        with (
            fake_nodes(cluster, nodes),
            gpu_telemetry(cluster, tmp_path_factory.mktemp(f"{name}-telemetry"), nodes) as t,
        ):
            yield t

    return tel


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
    # the simulated GPUs heat without throttling: every pod on a hot node's warm GPU moves (the default rule, pays,
    # moves only pods whose throttled clocks cost more than a restart)
    "KELVIN_OPERATOR_THERMAL_EVICTION__RULE": "warm",
}


def start_operator(
    cluster: LoopbackCluster,
    tel: GpuState,
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
