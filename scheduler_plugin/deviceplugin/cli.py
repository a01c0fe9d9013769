"""``kelvin device-plugin``: the kubelet device plugin serving the GPUs kelvin's extender assigned (a DaemonSet)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import Annotated

import typer

from ..console import LogLevel, LogLevelOption, fail, setup_logging
from .devices import RESOURCES
from .plugin import DEFAULT_SLOTS, DEFAULT_SOCKET_DIR

_STRATEGIES = ("env", "cdi")


def device_plugin(
    node_name: Annotated[
        str,
        typer.Option(
            envvar="NODE_NAME", metavar="NAME", help="This node's name (downward API spec.nodeName). Required."
        ),
    ] = "",
    socket_dir: Annotated[
        Path, typer.Option(metavar="PATH", help="The kubelet's device-plugins folder (kubelet.sock lives there).")
    ] = DEFAULT_SOCKET_DIR,
    resource: Annotated[
        list[str] | None,
        typer.Option(
            "--resource",
            metavar="RESOURCE",
            help=f"A resource to serve (repeat for several): {', '.join(RESOURCES)}. Default: both.",
        ),
    ] = None,
    shared_slots_per_gpu: Annotated[
        int,
        typer.Option(
            metavar="N", help="Devices advertised per GPU for kelvin.dev/shared-gpu (pool pods per GPU), 1..128."
        ),
    ] = DEFAULT_SLOTS,
    device_list_strategy: Annotated[
        str,
        typer.Option(
            metavar="STRATEGY",
            help="How the container runtime learns the GPUs: 'env' (NVIDIA_VISIBLE_DEVICES=<uuids>) or 'cdi' "
            "(CDI device names <cdi-kind>=<uuid>, NVIDIA_VISIBLE_DEVICES=void; needs Kubernetes 1.29+).",
        ),
    ] = "env",
    cdi_kind: Annotated[
        str, typer.Option(metavar="KIND", help="CDI kind of the GPUs' CDI names (with --device-list-strategy cdi).")
    ] = ("nvidia.com/gpu"),
    health_interval: Annotated[
        float, typer.Option(min=0.05, metavar="SECONDS", help="Seconds between NVML health checks.")
    ] = 2.0,
    kubeconfig: Annotated[
        str | None,
        typer.Option(metavar="PATH", help="kubeconfig for the pod lookup (default: $KUBECONFIG, else in-cluster)."),
    ] = None,
    api_server: Annotated[
        str | None,
        typer.Option(metavar="URL", help="Plain API server URL without credentials (tests, demo).", hidden=True),
    ] = None,
    fake: Annotated[bool, typer.Option("--fake", help="Simulated GPUs instead of NVML (demo, tests).")] = False,
    fake_gpus: Annotated[int, typer.Option(min=1, max=16, metavar="N", help="GPUs of the fake backend.")] = 8,
    fake_model: Annotated[str, typer.Option(metavar="MODEL", help="Model of the fake GPUs.")] = "H100-SXM-80GB",
    fake_seed: Annotated[int, typer.Option(metavar="SEED", help="Seed of the fake backend (UUIDs).")] = 0,
    log_level: LogLevelOption = LogLevel.info,
) -> None:
    """Serve nvidia.com/gpu and kelvin.dev/shared-gpu to the kubelet, handing each pod the GPUs kelvin assigned."""
    import pynvml

    from ..kubeapi import KubeClient, KubeConfig, KubeError
    from ..nvml.backend import NvmlApi, real_nvml
    from ..nvml.events import XidWatcher
    from ..nvml.fake import FakeNvml
    from .plugin import DevicePluginRunner, PluginConfig
    from .pods import NodePods

    setup_logging(log_level)
    if device_list_strategy not in _STRATEGIES:
        raise typer.BadParameter(
            f"{device_list_strategy!r} is not one of {', '.join(_STRATEGIES)}", param_hint="--device-list-strategy"
        )
    if not socket_dir.is_dir():
        raise typer.BadParameter(f"{socket_dir} is not a folder (mount the kubelet's)", param_hint="--socket-dir")
    try:
        config = PluginConfig(
            node=node_name,
            socket_dir=socket_dir,
            resources=tuple(resource) if resource else RESOURCES,
            slots=shared_slots_per_gpu,
            cdi_kind=cdi_kind if device_list_strategy == "cdi" else None,
            health_s=health_interval,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    nvml: NvmlApi
    if fake:
        try:
            nvml = FakeNvml(fake_gpus, fake_model, seed=fake_seed)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--fake-model") from None
    else:
        nvml = real_nvml()
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as exc:
        typer.echo(f"Error: NVML cannot initialise: {exc} (no NVIDIA driver on this node?)", err=True)
        raise typer.Exit(1) from None
    try:
        kube = KubeClient(KubeConfig.load(kubeconfig, api_server))
    except (KubeError, OSError) as exc:
        if kubeconfig:
            raise typer.BadParameter(f"cannot configure the API client: {exc}", param_hint="--kubeconfig") from None
        source = f"$KUBECONFIG {os.environ['KUBECONFIG']}" if os.environ.get("KUBECONFIG") else "in-cluster config"
        fail(f"cannot configure the API client from the {source}: {exc}; off-cluster, pass --kubeconfig PATH")

    runner = DevicePluginRunner(config, nvml, NodePods(kube, node_name), xids=XidWatcher(nvml))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await runner.run(stop)
        finally:
            await kube.close()

    logging.getLogger(__name__).info("kelvin device plugin for node %s in %s (fake=%s)", node_name, socket_dir, fake)
    try:
        asyncio.run(main())
    except pynvml.NVMLError as exc:
        typer.echo(f"Error: NVML cannot list the GPUs: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            nvml.nvmlShutdown()
