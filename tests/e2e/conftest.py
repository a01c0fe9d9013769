"""The e2e suite's fixtures: one loopback control plane per session (tests/e2e/cluster.py), shared by every scenario,
with fake GPU nodes (tests/e2e/fakenodes.py).

The Kubernetes binaries come from ``bash hack/build-kube.sh`` (cached outside the clone). Without them the e2e tests
skip, naming that command; under CI (``CI=true``) they fail instead, so a green CI never hides a skipped suite.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster, running, spawn
from tests.e2e.fleet import (
    ALL_NODES,
    GPU_NODES,
    GPUS_PER_NODE,
    ISLANDS_NODE,
    ISLANDS_SHARED_SLOTS,
    ISLANDS_TAINT,
    NODE_MODELS,
    NODE_NVLINK_ISLANDS,
)
from tests.e2e.install import KOPF_CRDS, Step, documented_manifest_install, run_documented
from tests.e2e.kelvin_scheduler import KelvinScheduler
from tests.e2e.kelvin_scheduler import start as kelvin_scheduler_start
from tests.e2e.kubebin import ROOT, KubeBinaries, MissingBinaries, find
from tests.e2e.telemetry import MissingPrometheus, Telemetry, prometheus_binary
from tests.e2e.telemetry import running as telemetry_running

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}  # as tests/conftest.py


def _minor(version: str) -> int:
    match = re.search(r"v?1\.(\d+)\.", version)
    if match is None:
        raise ValueError(f"not a Kubernetes version: {version!r}")
    return int(match.group(1))


@pytest.fixture(scope="session")
def kube_binaries() -> KubeBinaries:
    try:
        bins = find()
    except MissingBinaries as exc:
        if IN_CI:
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    # kubectl must be within one minor of the API server (Kubernetes' version skew policy)
    out = subprocess.run([str(bins.kubectl), "version", "--client", "-o", "json"], capture_output=True, text=True)
    client = re.search(r'"gitVersion":\s*"([^"]+)"', out.stdout)
    if client is None or abs(_minor(client.group(1)) - _minor(bins.version)) > 1:
        msg = (
            f"{bins.kubectl} ({client.group(1) if client else out.stderr.strip()}) is more than one minor from "
            f"{bins.version}: run `bash hack/build-kube.sh` (it builds kubectl {bins.version} too)"
        )
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return bins


@pytest.fixture(scope="session")
def cluster(kube_binaries: KubeBinaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackCluster]:
    workdir = tmp_path_factory.mktemp("cluster")
    with running(kube_binaries, workdir) as c:
        yield c


@pytest.fixture(scope="session")
def gpu_nodes(cluster: LoopbackCluster) -> Iterator[tuple[str, ...]]:
    """The fake GPU nodes every scenario shares (:data:`GPU_NODES`), registered and Ready, their pods reported
    Running by the agent; the preemption scenario's tainted node (``fleet.ISLANDS_NODE``) is registered too."""
    p = cluster.pki
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    agent = spawn(
        "fakenodes",
        [
            sys.executable,
            "-m",
            "tests.e2e.fakenodes",
            f"--server={cluster.server}",
            f"--ca={p.ca.cert}",
            f"--cert={p.admin.cert}",
            f"--key={p.admin.key}",
            f"--nodes={','.join(ALL_NODES)}",
            f"--gpus={GPUS_PER_NODE}",
            f"--taint={ISLANDS_NODE}:{ISLANDS_TAINT['key']}={ISLANDS_TAINT['value']}:{ISLANDS_TAINT['effect']}",
            f"--shared-gpu-slots={ISLANDS_NODE}={ISLANDS_SHARED_SLOTS}",
            f"--kubelet-version={cluster.bins.version}",
        ],
        cluster.logs,
        env=env,
    )
    try:

        def all_ready() -> bool:
            if not agent.alive():
                raise RuntimeError(f"fakenodes exited ({agent.popen.returncode}):\n{agent.tail()}")
            return all(cluster.node_ready(name) for name in ALL_NODES)

        wait_for("fake GPU nodes Ready", all_ready, 60)
        yield GPU_NODES
    finally:
        agent.stop()


@pytest.fixture
def namespace(cluster: LoopbackCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (not waited for)."""
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") + f"-{os.getpid() % 10000}"
    cluster.api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for(
        f"ServiceAccount {name}/default",
        lambda: cluster.api.get_or_none(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        60,
    )
    yield name
    cluster.api.delete(f"/api/v1/namespaces/{name}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def manifests_install(cluster: LoopbackCluster, gpu_nodes: tuple[str, ...]) -> list[Step]:
    """kelvin installed from manifests/ exactly as docs/install.md says, on the fresh cluster (kopf's CRDs absent:
    every fixture that installs anything else of kelvin depends on this one, so it runs first). The steps' outcome is
    asserted by test_install.py; the scenarios that need kelvin's RBAC (ServiceAccounts, roles) depend on it too.
    With the fake nodes: the documented `rollout status` waits for the operator's pods to be placed and Ready."""
    present = [name for name in KOPF_CRDS if cluster.api.get_or_none(f"{CRD_PATH}/{name}") is not None]
    assert not present, f"not a fresh cluster: {present} exist before the install"
    return run_documented(cluster, documented_manifest_install())


@pytest.fixture(scope="session")
def kelvin_installed(manifests_install: list[Step]) -> None:
    failed = [s for s in manifests_install if s.returncode != 0]
    if failed:
        pytest.fail(f"kelvin's documented install failed: {failed[0].command}: {failed[0].output}")


@pytest.fixture(scope="session")
def telemetry(cluster: LoopbackCluster) -> Iterator[Telemetry]:
    """One fake-NVML ``kelvin exporter`` per fake GPU node and one real Prometheus scraping them
    (tests/e2e/telemetry.py). Without prometheus the e2e tests that need it skip naming the fix; under CI they fail."""
    try:
        prometheus_binary()
    except MissingPrometheus as exc:
        if IN_CI:
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    with telemetry_running(cluster.workdir / "telemetry", cluster.logs, NODE_MODELS, NODE_NVLINK_ISLANDS) as t:
        yield t


@pytest.fixture
def fresh_telemetry(telemetry: Telemetry) -> Iterator[Telemetry]:
    """The suite's telemetry, every fake GPU back to the start state (idle) before and after the test, Prometheus
    running."""
    if not telemetry.prometheus.alive():
        telemetry.prometheus.start()
    telemetry.reset_all()
    yield telemetry
    if not telemetry.prometheus.alive():
        telemetry.prometheus.start()
    telemetry.reset_all()


@pytest.fixture(scope="session")
def kelvin_scheduler(
    cluster: LoopbackCluster, kelvin_installed: None, gpu_nodes: tuple[str, ...], telemetry: Telemetry
) -> Iterator[KelvinScheduler]:
    """kube-scheduler with the installed kelvin-scheduler configuration, and kelvin's extender beside it reading the
    suite's Prometheus."""
    running = kelvin_scheduler_start(cluster, cluster.workdir / "kelvin-scheduler", telemetry.prometheus.url)
    try:
        yield running
    finally:
        running.stop()
