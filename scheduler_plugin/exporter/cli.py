"""``kelvin exporter``: the per-node NVML exporter (a DaemonSet on GPU nodes)."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
from pathlib import Path

import typer

from .backend import NvmlApi, real_nvml


def exporter(
    host: str = typer.Option("0.0.0.0", help="Address to listen on."),
    port: int = typer.Option(9400, min=0, max=65535, help="Port for /metrics, /v1/node and /healthz."),
    node_name: str = typer.Option(
        "", envvar="NODE_NAME", help="Kubernetes node name (the downward API's spec.nodeName); default: hostname."
    ),
    proc_root: Path = typer.Option(
        Path("/proc"), help="The host's /proc (the pod needs hostPID: true) for pid -> pod attribution."
    ),
    pods_dir: Path | None = typer.Option(
        None, help="kubelet's /var/log/pods, mounted read-only, to name the pods of GPU processes (optional)."
    ),
    fake: bool = typer.Option(False, "--fake", help="Simulated GPUs instead of NVML (demo, tests)."),
    fake_gpus: int = typer.Option(8, min=1, max=16, help="GPUs of the fake backend."),
    fake_model: str = typer.Option("H100-SXM-80GB", help="Model of the fake GPUs (H200, H100-SXM-80GB, A100-...)."),
    fake_seed: int = typer.Option(0, help="Seed of the fake backend (UUIDs, pod names)."),
    fake_vary: bool = typer.Option(True, help="Let the fake GPUs' load and temperature vary over time."),
    log_level: str = typer.Option("INFO", help="Python log level."),
) -> None:
    """Serve NVML GPU metrics for Prometheus (/metrics) and this node as JSON (/v1/node)."""
    from .app import Exporter
    from .fake_nvml import FakeNvml, write_proc

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    node = node_name or os.uname().nodename
    nvml: NvmlApi
    if fake:
        try:
            fake_backend = FakeNvml(fake_gpus, fake_model, seed=fake_seed, vary=fake_vary)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--fake-model/--fake-gpus") from None
        if proc_root == Path("/proc"):
            # fake pids would match unrelated host processes: attribute them through a generated /proc instead
            scratch = Path(tempfile.mkdtemp(prefix="kelvin-fake-proc-"))
            proc_root, pods_dir = scratch / "proc", scratch / "pods"
            write_proc(fake_backend, proc_root, pods_dir)
        nvml = fake_backend
    else:
        nvml = real_nvml()
    app = Exporter(nvml, node, proc_root=proc_root, pods_dir=pods_dir)
    bound = app.start(host, port)
    logging.getLogger(__name__).info("kelvin exporter for node %s on %s:%d (fake=%s)", node, host, bound, fake)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    app.stop()
