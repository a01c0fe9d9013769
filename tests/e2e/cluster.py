"""A loopback Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager and kube-scheduler on
127.0.0.1 with free ports, generated PKI and a temporary data directory. Started and stopped by PID; no kubelet
(fake GPU nodes come from :mod:`tests.e2e.fakenodes`).

    cluster = LoopbackCluster(binaries, workdir)
    cluster.start()
    cluster.kubectl("get", "nodes")
    kubeconfig = cluster.token_kubeconfig("kelvin-system", "kelvin-scheduler")   # only that SA's rights
    cluster.stop()
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from tests.e2e import pki
from tests.e2e.api import Api, wait_for
from tests.e2e.kubebin import KubeBinaries

SERVICE_CIDR = "10.96.0.0/16"
START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Process:
    """One process this fixture started: stopped by its PID (its own process group), its output in ``log``."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    _log_file: IO[bytes] = field(repr=False)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout)
        self._log_file.close()


def spawn(
    name: str, argv: Sequence[str | os.PathLike[str]], log_dir: Path, env: dict[str, str] | None = None
) -> Process:
    log = log_dir / f"{name}.log"
    out = log.open("ab")
    popen = subprocess.Popen(
        [str(a) for a in argv],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: stop() signals it and nothing else
        env=env,
    )
    with (log_dir / "pids").open("a") as pids:  # what to kill by hand if the session itself was SIGKILLed
        pids.write(f"{popen.pid} {name}\n")
    return Process(name, popen, log, out)


def write_kubeconfig(path: Path, server: str, ca: Path, user: dict[str, Any], name: str = "e2e") -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": "e2e", "user": name}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


class LoopbackCluster:
    def __init__(self, binaries: KubeBinaries, workdir: Path, scheduler_flags: Sequence[str] = ()) -> None:
        self.bins = binaries
        self.scheduler_flags = list(scheduler_flags)
        """Extra flags of the default kube-scheduler (e.g. ``--kube-api-qps``: bench/e2e_throughput.py)."""
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.processes: dict[str, Process] = {}
        self.etcd_port = free_port()
        self.apiserver_port = free_port()
        self.server = f"https://127.0.0.1:{self.apiserver_port}"
        self._api: Api | None = None
        self.ports: dict[str, int] = {}
        self.etcd_data: Path | None = None
        self.started_in_s = 0.0

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pki = pki.generate(self.workdir / "pki")
        self.admin_kubeconfig = write_kubeconfig(
            self.workdir / "admin.kubeconfig",
            self.server,
            self.pki.ca.cert,
            {"client-certificate": str(self.pki.admin.cert), "client-key": str(self.pki.admin.key)},
            name="admin",
        )
        try:
            self._start_etcd()
            self._start_apiserver()
            # the controller manager and the scheduler exit at once when the API server does not answer yet (on a
            # loaded machine it can take longer to listen than they take to start): they start after /readyz
            self._wait_apiserver_ready()
            self._start_controller_manager()
            self._start_scheduler()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None
        for name in reversed(list(self.processes)):
            self.processes.pop(name).stop()

    def restart(self, name: str) -> None:
        """Stop one component and start it again with the same flags and ports (fault scenarios); returns once the
        control plane is ready again."""
        starts = {
            "kube-apiserver": self._start_apiserver,
            "kube-controller-manager": self._start_controller_manager,
            "kube-scheduler": self._start_scheduler,
        }
        self.processes.pop(name).stop()
        starts[name]()
        self._wait_ready()

    def check_alive(self) -> None:
        for proc in self.processes.values():
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")

    # ---- components --------------------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: Sequence[str | os.PathLike[str]]) -> None:
        self.processes[name] = spawn(name, argv, self.logs)

    def _start_etcd(self) -> None:
        # etcd's data on tmpfs when there is one: Debian's etcd 3.4 has no --unsafe-no-fsync, and fsyncs dominate
        shm = Path("/dev/shm")
        data_root = shm if shm.is_dir() and os.access(shm, os.W_OK) else self.workdir
        self.etcd_data = Path(tempfile.mkdtemp(prefix="kelvin-e2e-etcd.", dir=data_root))
        peer = free_port()
        client = f"http://127.0.0.1:{self.etcd_port}"
        self._spawn(
            "etcd",
            [
                self.bins.etcd,
                "--name=e2e",
                f"--data-dir={self.etcd_data}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=e2e=http://127.0.0.1:{peer}",
                "--log-level=warn",
            ],
        )

    def _start_apiserver(self) -> None:
        p = self.pki
        self._spawn(
            "kube-apiserver",
            [
                self.bins["kube-apiserver"],
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--tls-cert-file={p.apiserver.cert}",
                f"--tls-private-key-file={p.apiserver.key}",
                f"--client-ca-file={p.ca.cert}",
                f"--service-account-key-file={p.sa_pub}",
                f"--service-account-signing-key-file={p.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                # the Endpoints of the "kubernetes" Service may not hold a loopback address
                "--endpoint-reconciler-type=none",
                # webhooks with a service clientConfig are resolved to the Service's endpoints, not looked up in DNS
                # (off-cluster the name is not ours: a resolver may answer it, and the call would leave loopback)
                "--enable-aggregator-routing=true",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                "--profiling=false",
                "--v=1",
            ],
        )

    def _component_flags(self, name: str) -> list[str]:
        self.ports[name] = free_port()
        return [
            f"--kubeconfig={self.admin_kubeconfig}",
            f"--authentication-kubeconfig={self.admin_kubeconfig}",
            f"--authorization-kubeconfig={self.admin_kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports[name]}",
            f"--cert-dir={self.workdir / (name + '-certs')}",
            "--leader-elect=false",
            "--v=1",
        ]

    def _start_controller_manager(self) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                self.bins["kube-controller-manager"],
                *self._component_flags("kube-controller-manager"),
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--root-ca-file={self.pki.ca.cert}",
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allocate-node-cidrs=false",
                # each controller's client is held to 20 requests/s by default: with 1,000 fake nodes the node
                # lifecycle controller then lifts the registration taint of ~4 nodes a second (minutes)
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ],
        )

    def _start_scheduler(self) -> None:
        flags = [*self._component_flags("kube-scheduler"), *self.scheduler_flags]
        self._spawn("kube-scheduler", [self.bins["kube-scheduler"], *flags])

    def _wait_apiserver_ready(self) -> None:
        api = self.api

        def ready() -> bool:
            self.check_alive()
            return api.request("GET", "/readyz").status_code == 200

        wait_for("kube-apiserver /readyz", ready, START_TIMEOUT_S, interval=0.5)

    def _wait_ready(self) -> None:
        api = self.api
        self._wait_apiserver_ready()

        def default_sa() -> bool:
            self.check_alive()
            return api.get_or_none("/api/v1/namespaces/default/serviceaccounts/default") is not None

        # the controller manager's serviceaccount controller creates it: pods can be created from then on
        wait_for("ServiceAccount default/default (kube-controller-manager)", default_sa, START_TIMEOUT_S, 0.5)

        for name in ("kube-controller-manager", "kube-scheduler"):
            wait_for(f"{name} /healthz", functools.partial(self._healthz, name), START_TIMEOUT_S, 0.5)

    def _healthz(self, name: str) -> bool:
        """The component's own /healthz (its self-signed serving certificate; /healthz needs no credentials)."""
        self.check_alive()
        with httpx.Client(verify=False, timeout=5) as client:
            return client.get(f"https://127.0.0.1:{self.ports[name]}/healthz").status_code == 200

    # ---- clients -----------------------------------------------------------------------------------------------
    @property
    def api(self) -> Api:
        """The admin client (system:masters)."""
        if self._api is None:
            self._api = Api(self.server, self.pki.ca.cert, cert=(self.pki.admin.cert, self.pki.admin.key))
        return self._api

    def node_ready(self, name: str) -> bool:
        """Ready, and untainted by the node lifecycle controller (it taints a node not-ready until it sees it Ready)."""
        node = self.api.get_or_none(f"/api/v1/nodes/{name}")
        if node is None:
            return False
        conditions = node.get("status", {}).get("conditions", [])
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        lifecycle = [t for t in node["spec"].get("taints", []) if t["key"].startswith("node.kubernetes.io/")]
        return ready and not lifecycle

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        check: bool = True,
        input: str | None = None,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bins.kubectl), f"--kubeconfig={kubeconfig or self.admin_kubeconfig}", *args]
        result = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr}{result.stdout}")
        return result

    def token(self, namespace: str, service_account: str, expiration_s: int = 7200) -> str:
        """A bound token of the ServiceAccount (TokenRequest API)."""
        review = self.api.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_s},
            },
        )
        return str(review["status"]["token"])

    def token_kubeconfig(self, namespace: str, service_account: str) -> Path:
        """A kubeconfig that authenticates as the ServiceAccount and nothing more: a component run with it has
        exactly the rights the chart's RBAC gives that account."""
        path = self.workdir / f"sa-{namespace}-{service_account}.kubeconfig"
        return write_kubeconfig(
            path,
            self.server,
            self.pki.ca.cert,
            {"token": self.token(namespace, service_account)},
            name=f"{namespace}-{service_account}",
        )

    def token_api(self, namespace: str, service_account: str) -> Api:
        return Api(self.server, self.pki.ca.cert, token=self.token(namespace, service_account))


@contextlib.contextmanager
def running(binaries: KubeBinaries, workdir: Path, scheduler_flags: Sequence[str] = ()) -> Iterator[LoopbackCluster]:
    cluster = LoopbackCluster(binaries, workdir, scheduler_flags)
    started = time.monotonic()
    try:
        cluster.start()
        cluster.started_in_s = time.monotonic() - started
        yield cluster
    finally:
        cluster.stop()
        if cluster.etcd_data is not None:
            shutil.rmtree(cluster.etcd_data, ignore_errors=True)
