"""kelvin-scheduler on the loopback cluster, as the chart deploys it but as local processes: the real kube-scheduler
with the KubeSchedulerConfiguration the install put in the ConfigMap ``kelvin-system/kelvin-scheduler``, and
``kelvin extender`` with the installed policy (ConfigMap ``kelvin-policy``) and the installed Deployment's settings
(its ``extender`` container's environment), with ``source: prometheus`` (``helm --set extender.source=prometheus``)
reading the suite's real Prometheus, which scrapes one fake-NVML ``kelvin exporter`` per fake node
(tests/e2e/telemetry.py). Both authenticate with a token of the ServiceAccount ``kelvin-system/kelvin-scheduler``: they
have exactly the rights the chart gives that pod."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster, Process, free_port, spawn

NAMESPACE = "kelvin-system"
SERVICE_ACCOUNT = "kelvin-scheduler"
SCHEDULER_NAME = "kelvin-scheduler"


@dataclass
class KelvinScheduler:
    extender: Process
    scheduler: Process
    extender_port: int
    extender_metrics_port: int
    workdir: Path
    extender_env: dict[str, str]
    logs: Path
    scheduler_argv: list[str]
    scheduler_restarts: int = 0

    def stop(self) -> None:
        self.scheduler.stop()
        self.extender.stop()

    def restart_extender(self, while_down: Callable[[], None] | None = None) -> None:
        """Kill the extender (SIGTERM to its process group), run ``while_down``, start it again on the same ports."""
        self.extender.stop()
        if while_down is not None:
            while_down()
        self.extender = start_extender(self.extender_env, self.logs)

    def supervise(self) -> None:
        """Restart kube-scheduler if it exited, as the kubelet restarts the container: kube-scheduler exits by design
        when it loses its leader Lease (e.g. the API server was away longer than renewDeadline)."""
        if not self.scheduler.alive():
            self.scheduler.stop()
            self.scheduler = spawn("kelvin-kube-scheduler", self.scheduler_argv, self.logs)
            self.scheduler_restarts += 1
        self.check_alive()

    def explain(self, pod: dict[str, Any], node: str) -> dict[str, Any]:
        """kelvin's own ``/explain`` of ``pod`` on ``node`` over its current snapshot (``fits``, each filter's
        verdict): how a scenario knows the extender has seen a telemetry change before it creates pods."""
        resp = httpx.post(f"http://127.0.0.1:{self.extender_port}/explain", json={"pod": pod, "node": node}, timeout=10)
        resp.raise_for_status()
        return dict(resp.json())

    def telemetry_nodes(self, state: str = "fresh") -> int:
        """The extender's own ``kelvin_telemetry_nodes{state=...}`` (its snapshot's nodes in that state; 0 when the
        series is absent), from its metrics port."""
        return int(self.metric("kelvin_telemetry_nodes", state=state))

    def metric(self, name: str, **labels: str) -> float:
        """One sample of the extender's metrics (``name`` with these labels; 0 when the series is absent), from its
        metrics port."""
        text = httpx.get(f"http://127.0.0.1:{self.extender_metrics_port}/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return float(sample.value)
        return 0.0

    def check_alive(self) -> None:
        for proc in (self.extender, self.scheduler):
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")


def _configmap(cluster: LoopbackCluster, name: str, key: str) -> str:
    cm = cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{name}")
    return str(cm["data"][key])


def scheduler_config(installed: str, extender_port: int, kubeconfig: Path) -> dict[str, Any]:
    """The installed KubeSchedulerConfiguration with its two out-of-pod differences: the extender on this port
    (in the pod: the sidecar's port on 127.0.0.1) and the ServiceAccount's kubeconfig (in the pod: in-cluster)."""
    config = yaml.safe_load(installed)
    (extender,) = config["extenders"]
    assert extender["urlPrefix"].startswith("http://127.0.0.1:"), extender["urlPrefix"]
    extender["urlPrefix"] = f"http://127.0.0.1:{extender_port}"
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    return dict(config)


def count_preemption_config(config: dict[str, Any], scheduler_name: str) -> dict[str, Any]:
    """``config`` (from :func:`scheduler_config`) as a second kube-scheduler beside kelvin-scheduler: its one profile
    named ``scheduler_name``, the extender's ``preemptVerb`` removed (as ``scheduler.extender.preempt: false``: the
    count-based preemption of kube-scheduler alone), no leader election (the chart's Role grants only the
    ``kelvin-scheduler`` Lease, which the first one holds)."""
    out = yaml.safe_load(yaml.safe_dump(config))
    (profile,) = out["profiles"]
    profile["schedulerName"] = scheduler_name
    (extender,) = out["extenders"]
    assert extender.pop("preemptVerb") == "preempt", extender
    out["leaderElection"] = {"leaderElect": False}
    return dict(out)


@dataclass
class SecondScheduler:
    """A second kube-scheduler process on kelvin-scheduler's extender (:func:`start_count_preemption`)."""

    process: Process
    scheduler_name: str

    def stop(self) -> None:
        self.process.stop()

    def check_alive(self) -> None:
        if not self.process.alive():
            raise RuntimeError(f"{self.process.name} exited ({self.process.popen.returncode}):\n{self.process.tail()}")


def _scheduler_argv(cluster: LoopbackCluster, config: Path, kubeconfig: Path, workdir: Path, healthz: int) -> list[str]:
    """kube-scheduler's command line on loopback: ``config``, its secure (healthz) port ``healthz``."""
    return [
        str(cluster.bins["kube-scheduler"]),
        f"--config={config}",
        # in the pod these come from the in-cluster config; the chart grants the delegated authn/authz reads
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={healthz}",
        f"--cert-dir={workdir / 'scheduler-certs'}",
        "--v=2",
    ]


def start_count_preemption(cluster: LoopbackCluster, running: KelvinScheduler, scheduler_name: str) -> SecondScheduler:
    """kube-scheduler with the installed configuration minus ``preemptVerb``, for pods of ``scheduler_name``, on the
    running extender of ``running`` and the ``kelvin-scheduler`` ServiceAccount's token; returned once healthy."""
    workdir = running.workdir / scheduler_name
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = cluster.token_kubeconfig(NAMESPACE, SERVICE_ACCOUNT)
    installed = scheduler_config(_configmap(cluster, SCHEDULER_NAME, "scheduler-config.yaml"), running.extender_port,
                                 kubeconfig)  # fmt: skip
    config = workdir / "scheduler-config.yaml"
    config.write_text(yaml.safe_dump(count_preemption_config(installed, scheduler_name)))
    healthz = free_port()
    argv = _scheduler_argv(cluster, config, kubeconfig, workdir, healthz)
    second = SecondScheduler(spawn(scheduler_name, argv, cluster.logs), scheduler_name)

    def healthy() -> bool:
        second.check_alive()
        try:
            return httpx.get(f"https://127.0.0.1:{healthz}/healthz", verify=False, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(f"{scheduler_name} /healthz", healthy, 90, 0.5)
    except BaseException:
        second.stop()
        raise
    return second


def _kelvin() -> str:
    found = shutil.which("kelvin", path=str(Path(sys.executable).parent)) or shutil.which("kelvin")
    if found is None:
        raise RuntimeError("the kelvin command is not installed (pip install -e .)")
    return found


def start_extender(env: dict[str, str], logs: Path) -> Process:
    """``kelvin extender`` with these settings, once its /readyz answers 200 (a snapshot is in)."""
    extender = spawn("kelvin-extender", [_kelvin(), "extender"], logs, env=env)
    metrics_port = env["KELVIN_METRICS_PORT"]

    def ready() -> bool:
        if not extender.alive():
            raise RuntimeError(f"kelvin extender exited ({extender.popen.returncode}):\n{extender.tail()}")
        return httpx.get(f"http://127.0.0.1:{metrics_port}/readyz", timeout=5).status_code == 200

    try:
        wait_for("kelvin extender /readyz", ready, 90, 0.5)
    except BaseException:
        extender.stop()
        raise
    return extender


def installed_extender_env(cluster: LoopbackCluster) -> dict[str, str]:
    """The ``KELVIN_*`` environment of the installed Deployment's ``extender`` container (plain values only)."""
    deployment = cluster.api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{SCHEDULER_NAME}")
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"]
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


def extender_env(installed: Mapping[str, str], *, port: int, metrics_port: int, policy: Path, prometheus_url: str,
                 kubeconfig: Path) -> dict[str, str]:  # fmt: skip
    """The installed extender's settings with the out-of-pod differences: loopback ports of this test session, the
    policy file's local copy, the ServiceAccount's kubeconfig, and telemetry from the suite's Prometheus (the chart
    with ``extender.source=prometheus``: ``KELVIN_PROMETHEUS_URL``, ``KELVIN_PROMETHEUS_METRICS`` its default)."""
    env = {k: v for k, v in installed.items() if not k.startswith("KELVIN_SCRAPE_")}
    env.update(
        {
            "KELVIN_PORT": str(port),
            "KELVIN_METRICS_HOST": "127.0.0.1",
            "KELVIN_METRICS_PORT": str(metrics_port),
            "KELVIN_POLICY_FILE": str(policy),
            "KELVIN_SOURCE": "prometheus",
            "KELVIN_PROMETHEUS_URL": prometheus_url,
            "KELVIN_PROMETHEUS_METRICS": installed.get("KELVIN_PROMETHEUS_METRICS", "auto"),
            "KELVIN_KUBECONFIG": str(kubeconfig),
        }
    )
    assert env["KELVIN_HOST"] == "127.0.0.1", env
    return env


def start(
    cluster: LoopbackCluster, workdir: Path, prometheus_url: str, settings: Mapping[str, str] | None = None
) -> KelvinScheduler:
    """``settings``: ``KELVIN_*`` variables that replace the ones above, e.g. a simulated fleet of more fake nodes
    than the suite's exporters serve (``KELVIN_SOURCE=simulated``, ``KELVIN_FLEET_FILE``: the burst scenario, the
    throughput benchmark)."""
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = cluster.token_kubeconfig(NAMESPACE, SERVICE_ACCOUNT)
    policy = workdir / "policy.yaml"
    policy.write_text(_configmap(cluster, "kelvin-policy", "policy.yaml"))
    port, metrics_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KELVIN_") and k not in ("KUBECONFIG",)}
    env.update(
        extender_env(
            installed_extender_env(cluster),
            port=port,
            metrics_port=metrics_port,
            policy=policy,
            prometheus_url=prometheus_url,
            kubeconfig=kubeconfig,
        )
    )
    env.update(settings or {})
    extender = start_extender(env, cluster.logs)
    scheduler: Process | None = None
    try:
        config = workdir / "scheduler-config.yaml"
        config.write_text(
            yaml.safe_dump(scheduler_config(_configmap(cluster, SCHEDULER_NAME, "scheduler-config.yaml"), port,
                                            kubeconfig))
        )  # fmt: skip
        scheduler_argv = _scheduler_argv(cluster, config, kubeconfig, workdir, free_port())
        scheduler = spawn("kelvin-kube-scheduler", scheduler_argv, cluster.logs)
        running = KelvinScheduler(extender, scheduler, port, metrics_port, workdir, env, cluster.logs, scheduler_argv)

        def leader() -> bool:
            running.check_alive()
            lease = cluster.api.get_or_none(
                f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{SCHEDULER_NAME}"
            )
            return bool(lease and lease["spec"].get("holderIdentity"))

        wait_for("kelvin-scheduler leader Lease", leader, 90, 0.5)
        return running
    except BaseException:
        if scheduler is not None:
            scheduler.stop()
        extender.stop()
        raise
