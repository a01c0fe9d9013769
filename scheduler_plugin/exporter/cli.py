"""``kelvin exporter``: the per-node NVML exporter (a DaemonSet on GPU nodes)."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from ..console import LogLevel, LogLevelOption, setup_logging
from ..nvml.backend import NvmlApi, real_nvml
from .limits import ServeLimits


def exporter(  # noqa: C901
    host: Annotated[str, typer.Option(metavar="ADDRESS", help="Address to listen on.")] = "0.0.0.0",
    port: Annotated[
        int, typer.Option(min=0, max=65535, metavar="PORT", help="Port for /metrics, /v1/node and /healthz.")
    ] = 9400,
    node_name: Annotated[
        str,
        typer.Option(
            envvar="NODE_NAME",
            show_default=False,
            metavar="NAME",
            help="Kubernetes node name (downward API spec.nodeName) (default: this host's name).",
        ),
    ] = "",
    proc_root: Annotated[
        Path,
        typer.Option(metavar="PATH", help="The host's /proc (the pod needs hostPID: true) for pid -> pod attribution."),
    ] = Path("/proc"),
    pods_dir: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH", help="kubelet's /var/log/pods, mounted read-only, to name the pods of GPU processes."
        ),
    ] = None,
    max_connections: Annotated[
        int,
        typer.Option(
            min=1, max=100_000, metavar="N", help="Open connections at most; one more is answered 503 and closed."
        ),
    ] = ServeLimits.max_connections,
    header_timeout: Annotated[
        float,
        typer.Option(
            min=0.1,
            max=3600,
            metavar="SECONDS",
            help="Seconds a new connection has to send its first request's line and headers.",
        ),
    ] = ServeLimits.header_timeout_s,
    idle_timeout: Annotated[
        float,
        typer.Option(
            min=0.1,
            max=3600,
            metavar="SECONDS",
            help="Seconds a keep-alive connection may wait for its next request (longer than the scrape interval).",
        ),
    ] = ServeLimits.idle_timeout_s,
    fake: Annotated[bool, typer.Option("--fake", help="Simulated GPUs instead of NVML (demo, tests).")] = False,
    fake_gpus: Annotated[int, typer.Option(min=1, max=16, metavar="N", help="GPUs of the fake backend.")] = 8,
    fake_model: Annotated[
        str, typer.Option(metavar="MODEL", help="Model of the fake GPUs (H200, H100-SXM-80GB, A100-SXM-80GB...).")
    ] = ("H100-SXM-80GB"),
    fake_seed: Annotated[int, typer.Option(metavar="SEED", help="Seed of the fake backend (UUIDs, pod names).")] = 0,
    fake_nvlink_islands: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="Fake only: split the GPUs into N equal NVLink islands, linked directly within an island and not "
            "across (1: every GPU on the NVSwitch fabric).",
        ),
    ] = 1,
    fake_vary: Annotated[bool, typer.Option(help="Let the fake GPUs' load and temperature vary over time.")] = True,
    fake_state_file: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help="Fake only: a YAML/JSON file of per-GPU temperature, throttling, memory and processes, re-read when "
            "it changes (docs/exporter.md).",
        ),
    ] = None,
    log_level: LogLevelOption = LogLevel.info,
) -> None:
    """Serve NVML GPU metrics for Prometheus (/metrics) and this node as JSON (/v1/node)."""
    from ..nvml.fake import FakeNvml, island_members, write_proc
    from ..nvml.fake_state import FakeStateError, FakeStateFile
    from .app import Exporter

    setup_logging(log_level)
    node = node_name or os.uname().nodename
    nvml: NvmlApi
    state: FakeStateFile | None = None
    if fake_state_file is not None and not fake:
        raise typer.BadParameter("is an option of the fake backend: give --fake too", param_hint="--fake-state-file")
    if fake_nvlink_islands != 1 and not fake:
        raise typer.BadParameter(
            "is an option of the fake backend: give --fake too", param_hint="--fake-nvlink-islands"
        )
    if fake:
        try:
            island_members(fake_gpus, fake_nvlink_islands, True, fake_model)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--fake-nvlink-islands") from None
        try:
            fake_backend = FakeNvml(
                fake_gpus, fake_model, seed=fake_seed, vary=fake_vary, nvlink_islands=fake_nvlink_islands
            )
        except ValueError as exc:
            hint = "--fake-nvlink-islands" if "NVLink islands" in str(exc) else "--fake-model"
            raise typer.BadParameter(str(exc), param_hint=hint) from None
        write: Callable[[], None] | None = None
        if proc_root == Path("/proc"):
            # fake pids could match unrelated host processes: attribute them through a generated /proc instead
            scratch = Path(tempfile.mkdtemp(prefix="kelvin-fake-proc-"))
            proc_root, pods_dir = scratch / "proc", scratch / "pods"
            fake_proc, fake_pods = proc_root, pods_dir

            def write() -> None:
                write_proc(fake_backend, fake_proc, fake_pods)

        if fake_state_file is not None:
            try:
                state = FakeStateFile(fake_state_file, fake_backend, on_change=write)
            except FakeStateError as exc:
                raise typer.BadParameter(str(exc), param_hint="--fake-state-file") from None
        elif write is not None:
            write()
        nvml = fake_backend
    else:
        nvml = real_nvml()
    limits = ServeLimits(max_connections, header_timeout_s=header_timeout, idle_timeout_s=idle_timeout)
    app = Exporter(nvml, node, proc_root=proc_root, pods_dir=pods_dir, limits=limits)
    try:
        bound = app.start(host, port)
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}", param_hint="--port"
        ) from None
    logging.getLogger(__name__).info("kelvin exporter for node %s on %s:%d (fake=%s)", node, host, bound, fake)
    if state is not None:
        state.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    if state is not None:
        state.stop()
    app.stop()
