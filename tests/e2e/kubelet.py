"""One real kubelet node beside the fake ones: containerd and the pinned release's kubelet, started by the test session
against the loopback cluster, with kelvin's device plugin registering on it.

Everything lives under one work folder: containerd's config, root, state and socket (no system containerd is used or
touched), the CNI config, the kubelet's root folder (``<root>/device-plugins`` holds ``kubelet.sock``), its
certificates and its pod logs (``podLogsDir``). The kubelet authenticates with a client certificate for
``system:node:<name>`` (group ``system:nodes``) issued by the cluster's CA, so the API server's Node authorizer gives it
a node's rights and nothing more.

What these machines take (docs/e2e.md, "The kubelet node"):

* cgroup v1: the kubelet runs with ``failCgroupV1: false``; the cgroupfs driver on both sides (``SystemdCgroup =
  false``: there is no systemd);
* root lacks CAP_SYS_RESOURCE: runc cannot lower a process's ``oom_score_adj`` and every sandbox fails (``can't get
  final child's PID from pipe: EOF``) unless containerd's CRI plugin sets ``restrict_oom_score_adj = true``;
* the node stays NotReady without a CNI config: a loopback-only conflist (hostNetwork pods need nothing more);
* no registry is reachable: the images are built here (tests/e2e/images/busybox.py) and imported with ``ctr -n k8s.io
  images import``; ``sandbox_image`` is a ``sleep infinity`` image; pods use ``imagePullPolicy: Never``;
* the kubelet refuses a loopback ``--node-ip``, so the Node's address is the machine's own and ``kubectl logs/exec``
  cannot reach the kubelet: the scenarios read the containers' output from ``podLogsDir``.

The node carries the taint :data:`TAINT` (and the label :data:`LABEL`): no pod of the other scenarios lands on it, and
no DaemonSet of the chart (none tolerates it).

Stopping (by PID, in order): the node's pods deleted, the kubelet, every container of containerd's ``k8s.io``
namespace killed and deleted, containerd, any shim of this containerd left, then every mount under the work folder
(the containers' root filesystems, the sandboxes' /dev/shm, the pods' volumes) unmounted, and the Node deleted.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.api import wait_for
from tests.e2e.cluster import LoopbackCluster, Process, free_port, spawn, write_kubeconfig
from tests.e2e.images import busybox
from tests.e2e.pki import CertificateAuthority

NODE_NAME = "e2e-kubelet-1"
LABEL = "kelvin.dev/e2e-kubelet"
TAINT = {"key": LABEL, "value": "true", "effect": "NoSchedule"}
#: What a pod of the kubelet scenarios carries to land on the node (with a nodeName or a nodeSelector).
TOLERATION = {"key": LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
IMAGE = busybox.IMAGE
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
#: The kubelet's device-plugin folder is fixed (``pluginapi.KubeletSocket``), whatever its ``--root-dir``: one kubelet
#: node per machine at a time.
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
#: Where the kubelet links every container's log, also fixed (``/var/log/containers``); removed at the end.
CONTAINER_LOG_LINKS = Path("/var/log/containers")
CGROUP_V1 = Path("/sys/fs/cgroup")
#: Debian packages the node needs (.ci/install-kubelet-node.sh installs them, on CI through .ci/run).
PACKAGES = "containerd runc containernetworking-plugins busybox-static"
START_TIMEOUT_S = 120.0


class NodeUnavailable(Exception):
    """What this machine lacks to run a kubelet node, and how to get it."""


def requirements(kubelet: Path) -> None:
    """Raise :class:`NodeUnavailable` naming everything missing."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (the kubelet and containerd mount and create cgroups)")
    for tool in ("containerd", "containerd-shim-runc-v2", "runc", "ctr"):
        if shutil.which(tool) is None:
            missing.append(tool)
    if not (CNI_BIN_DIR / "loopback").exists():
        missing.append(f"{CNI_BIN_DIR}/loopback (containernetworking-plugins)")
    if not busybox.BUSYBOX.is_file() or not busybox.is_static(busybox.BUSYBOX):
        missing.append(f"a static {busybox.BUSYBOX} (busybox-static)")
    if not os.access(kubelet, os.X_OK):
        missing.append(f"{kubelet} (bash hack/build-kube.sh)")
    if _listening(DEVICE_PLUGIN_DIR / "kubelet.sock"):
        raise NodeUnavailable(
            f"another kubelet serves {DEVICE_PLUGIN_DIR}/kubelet.sock (a fixed path): one kubelet node per machine"
        )
    if missing:
        raise NodeUnavailable(
            f"the kubelet node needs {', '.join(missing)}: as root, `apt-get install -y {PACKAGES}` "
            f"(or `bash .ci/install-kubelet-node.sh`)"
        )


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
        return True


def _toml_str(value: str | Path) -> str:
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


def containerd_config(work: Path, sandbox_image: str) -> str:
    """containerd 1.6's config (version 2) with every path under ``work``."""
    return f"""version = 2
root = {_toml_str(work / "root")}
state = {_toml_str(work / "state")}
# nothing outside the work folder: no /opt/containerd
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = {_toml_str(work / "containerd.sock")}

[ttrpc]
  address = {_toml_str(work / "containerd.sock.ttrpc")}

[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {_toml_str(sandbox_image)}
  # root lacks CAP_SYS_RESOURCE here: without this every sandbox fails ("can't get final child's PID from pipe: EOF")
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = {_toml_str(work / "runc")}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {_toml_str(CNI_BIN_DIR)}
    conf_dir = {_toml_str(work / "cni")}
"""


#: The node is NotReady without a CNI network; hostNetwork pods need only this.
LOOPBACK_CONFLIST = {"cniVersion": "1.0.0", "name": "kelvin-e2e-loopback", "plugins": [{"type": "loopback"}]}


def kubelet_config(
    work: Path, ca: Path, containerd_sock: Path, cgroup_root: str, port: int, healthz_port: int
) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # these machines are cgroup v1 (v1.35+ refuses it unless told) without systemd
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        # the pods' cgroups under one of this node's own (created and removed by the fixture)
        "cgroupRoot": cgroup_root,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{containerd_sock}",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        # its API: client certificates of the cluster's CA only (the API server's); nothing else is served
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": str(work / "pod-logs"),
        "registerWithTaints": [TAINT],
        "maxPods": 20,
        "resolvConf": "",
        "serializeImagePulls": False,
        # the shared machine's disk: no evictions or image garbage collection of the node's two images
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "5s",
        "fileCheckFrequency": "5s",
        "shutdownGracePeriod": "0s",
    }


@dataclass
class KubeletNode:
    cluster: LoopbackCluster
    work: Path
    name: str = NODE_NAME
    containerd: Process | None = None
    kubelet: Process | None = None
    kubelet_argv: list[str] = field(default_factory=list)
    kubelet_starts: int = 0
    created: list[Path] = field(default_factory=list)  # folders outside ``work`` made for this node, removed at stop

    @property
    def cgroup_root(self) -> str:
        return f"/kelvin-e2e-{os.getpid()}"

    @property
    def socket(self) -> Path:
        return self.work / "containerd.sock"

    @property
    def root_dir(self) -> Path:
        return self.work / "kubelet"

    @property
    def device_plugin_dir(self) -> Path:
        return DEVICE_PLUGIN_DIR

    @property
    def pod_logs(self) -> Path:
        return self.work / "pod-logs"

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        for sub in ("root", "state", "runc", "cni", "kubelet", "pod-logs", "pki"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        for folder in (DEVICE_PLUGIN_DIR.parent, DEVICE_PLUGIN_DIR):
            if not folder.exists():
                folder.mkdir(mode=0o755)
                self.created.insert(0, folder)
        self._make_cgroups()
        (self.work / "config.toml").write_text(containerd_config(self.work, busybox.SANDBOX_IMAGE))
        (self.work / "cni" / "10-loopback.conflist").write_text(json.dumps(LOOPBACK_CONFLIST))
        self.containerd = spawn(
            "containerd", ["containerd", f"--config={self.work / 'config.toml'}"], self.cluster.logs
        )
        wait_for("containerd's socket", self._containerd_up, START_TIMEOUT_S, 0.25)
        busybox.build(self.work / "images.tar")
        self.ctr("images", "import", str(self.work / "images.tar"))
        self.kubelet_argv = self._kubelet_argv()
        self._start_kubelet()

    def _containerd_up(self) -> bool:
        assert self.containerd is not None
        if not self.containerd.alive():
            raise RuntimeError(f"containerd exited ({self.containerd.popen.returncode}):\n{self.containerd.tail()}")
        return self.socket.exists() and self.ctr("version", check=False).returncode == 0

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = ["ctr", f"--address={self.socket}", "--namespace=k8s.io", *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
        return result

    def _kubelet_argv(self) -> list[str]:
        p = self.cluster.pki
        ca = CertificateAuthority.load(p.ca, self.work / "pki")
        client = ca.issue("kubelet-client", f"system:node:{self.name}", organizations=("system:nodes",), client=True)
        kubeconfig = write_kubeconfig(
            self.work / "kubelet.kubeconfig",
            self.cluster.server,
            p.ca.cert,
            {"client-certificate": str(client.cert), "client-key": str(client.key)},
            name=f"system:node:{self.name}",
        )
        config = self.work / "kubelet-config.yaml"
        config.write_text(
            yaml.safe_dump(
                kubelet_config(self.work, p.ca.cert, self.socket, self.cgroup_root, free_port(), free_port())
            )
        )
        return [
            str(self.cluster.bins["kubelet"]),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.root_dir}",
            f"--cert-dir={self.work / 'kubelet-certs'}",
            f"--hostname-override={self.name}",
            f"--node-labels={LABEL}=true",
            "--v=2",
        ]

    def _start_kubelet(self) -> None:
        self.kubelet_starts += 1
        self.kubelet = spawn(f"kubelet-{self.kubelet_starts}", self.kubelet_argv, self.cluster.logs)

    def check_alive(self) -> None:
        for proc in (self.containerd, self.kubelet):
            if proc is not None and not proc.alive():
                raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")

    def ready(self) -> bool:
        """Ready, and the node lifecycle controller's not-ready taint gone (the node's own taint stays)."""
        self.check_alive()
        return self.cluster.node_ready(self.name)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        wait_for(f"kubelet node {self.name} Ready", self.ready, timeout, 0.5)

    def restart_kubelet(self) -> None:
        """Stop the kubelet (SIGTERM to its process group) and start it again with the same flags; the containers
        keep running (containerd holds them)."""
        assert self.kubelet is not None
        self.kubelet.stop(timeout=20)
        self._start_kubelet()

    def stop(self) -> None:
        api = self.cluster.api
        with contextlib.suppress(Exception):
            pods = api.get("/api/v1/pods", fieldSelector=f"spec.nodeName={self.name}")["items"]
            for pod in pods:
                meta = pod["metadata"]
                api.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", {"gracePeriodSeconds": 0})
        if self.kubelet is not None:
            self.kubelet.stop(timeout=20)
        if self.containerd is not None and self.containerd.alive():
            self._remove_containers()
        if self.containerd is not None:
            self.containerd.stop(timeout=20)
        self._kill_shims()
        problems = self._unmount()
        self._remove_log_links()
        problems += self._remove_cgroups()
        # the kubelet leaves its registration socket and device checkpoint in the fixed folder: a later node's kubelet
        # must not restore this one's allocations (no other kubelet was serving there: see requirements())
        for leftover in ("kubelet.sock", "kubelet_internal_checkpoint"):
            if not _listening(DEVICE_PLUGIN_DIR / "kubelet.sock"):
                with contextlib.suppress(FileNotFoundError):
                    (DEVICE_PLUGIN_DIR / leftover).unlink()
        for folder in self.created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty: the kubelet removes its socket and checkpoint when it stops
        with contextlib.suppress(Exception):
            api.delete(f"/api/v1/nodes/{self.name}")
        if problems:
            raise RuntimeError(f"kubelet node {self.name} left behind: {'; '.join(problems)}")

    def _remove_containers(self) -> None:
        listed = self.ctr("containers", "list", "--quiet", check=False).stdout.split()
        for cid in listed:
            self.ctr("tasks", "kill", "--signal=SIGKILL", "--all", cid, check=False)
        deadline = time.monotonic() + 20
        for cid in listed:
            while time.monotonic() < deadline:
                if self.ctr("tasks", "delete", "--force", cid, check=False).returncode == 0:
                    break
                if "not found" in self.ctr("tasks", "ps", cid, check=False).stderr:
                    break
                time.sleep(0.2)
            self.ctr("containers", "delete", cid, check=False)

    def _kill_shims(self) -> None:
        """containerd-shim-runc-v2 outlives containerd by design; kill the ones of this containerd by PID."""
        address = str(self.socket)
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and address.encode() in argv:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(proc.name), signal.SIGKILL)

    def _unmount(self) -> list[str]:
        """Unmount everything under the work folder, deepest first; what is still mounted after five rounds."""
        prefix = str(self.work) + "/"
        mounts: list[str] = []
        for _ in range(5):
            mounts = [m for m in _mount_points() if m.startswith(prefix)]
            if not mounts:
                return []
            for mount in sorted(mounts, key=len, reverse=True):
                subprocess.run(["umount", "--lazy", mount], capture_output=True, check=False)
        return [f"mount {m}" for m in mounts]

    def _remove_log_links(self) -> None:
        prefix = str(self.work) + "/"
        with contextlib.suppress(OSError):
            for link in CONTAINER_LOG_LINKS.iterdir():
                with contextlib.suppress(OSError):
                    if link.is_symlink() and os.readlink(link).startswith(prefix):
                        link.unlink()

    def _controllers(self) -> list[Path]:
        """The cgroup v1 hierarchies (one folder per mounted controller set)."""
        return sorted(d for d in CGROUP_V1.iterdir() if not d.is_symlink() and (d / "cgroup.procs").exists())

    def _make_cgroups(self) -> None:
        """The kubelet refuses a ``cgroupRoot`` that does not exist: make it in every hierarchy (cpuset's needs the
        parent's CPUs and memory nodes, or no task may join)."""
        for controller in self._controllers():
            folder = controller / self.cgroup_root.lstrip("/")
            folder.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (folder / name).exists() and not (folder / name).read_text().strip():
                    (folder / name).write_text((controller / name).read_text())

    def _remove_cgroups(self, timeout: float = 10.0) -> list[str]:
        """Remove the node's cgroups leaf first (the kernel frees a killed container's cgroup shortly after its last
        process exits: retried for ``timeout``); the ones that stay, with the error."""
        deadline = time.monotonic() + timeout
        while True:
            left: list[str] = []
            for controller in self._controllers():
                root = controller / self.cgroup_root.lstrip("/")
                if not root.is_dir():
                    continue
                folders = sorted((d for d in root.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True)
                for folder in [*folders, root]:
                    try:
                        folder.rmdir()
                    except OSError as exc:
                        if exc.errno != errno.ENOENT:
                            left.append(f"cgroup {folder} ({exc.strerror}: processes left in it?)")
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)

    # ---- what the scenarios read ---------------------------------------------------------------------------------
    def container_log(self, namespace: str, pod: str, container: str) -> list[str]:
        """The container's output lines, from the kubelet's pod logs (CRI format: ``<time> <stream> <tag> <line>``)."""
        lines: list[str] = []
        for log in sorted(self.pod_logs.glob(f"{namespace}_{pod}_*/{container}/*.log")):
            for raw in log.read_text(errors="replace").splitlines():
                parts = raw.split(" ", 3)
                lines.append(parts[3] if len(parts) == 4 else "")
        return lines

    def task(self, container_id: str) -> tuple[int, str] | None:
        """(PID, status) of the container's task in containerd, None when it has none."""
        cid = container_id.removeprefix("containerd://")
        for line in self.ctr("tasks", "list").stdout.splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3 and fields[0] == cid:
                return int(fields[1]), fields[2]
        return None


def _mount_points() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.append(re.sub(r"\\(\d{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


@contextlib.contextmanager
def running(cluster: LoopbackCluster, work: Path) -> Iterator[KubeletNode]:
    requirements(cluster.bins["kubelet"])
    node = KubeletNode(cluster, work)
    try:
        node.start()
        node.wait_ready()
        yield node
    finally:
        node.stop()
