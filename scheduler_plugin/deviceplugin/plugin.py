"""Running the plugin: one gRPC server per resource on a unix socket, registered with the kubelet, again after
every kubelet restart.

The kubelet serves ``kubelet.sock`` in its device-plugins folder and, when it restarts, recreates that socket and
deletes the plugins' sockets. The runner polls both (every ``poll_s``): a new ``kubelet.sock`` (another inode or
change time) or a missing own socket restarts the servers and registers again. A failed registration (kubelet not up
yet) is retried at the next poll. While there is no ``kubelet.sock`` (the kubelet is not running, or the plugin's
folder is not the kubelet's device-plugins folder) the plugin says so: one INFO line when it starts waiting, naming
the socket, a WARNING every ``wait_warn_s`` (5 minutes) while it still waits, and INFO once registered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from ..nvml.backend import NvmlApi
from ..nvml.events import XidWatcher
from .devices import RESOURCES, Gpu, discover
from .health import Health
from .pods import NodePods
from .service import DevicePluginService, DeviceState
from .v1beta1 import api_pb2 as pb
from .v1beta1 import api_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_SOCKET_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_SLOTS = 16
#: While no kubelet socket appears, a WARNING this often (seconds).
DEFAULT_WAIT_WARN_S = 300.0


def endpoint_name(resource: str) -> str:
    """The plugin's socket file name for a resource: ``kelvin-gpu.sock``, ``kelvin-shared-gpu.sock``."""
    return "kelvin-" + resource.rsplit("/", 1)[-1] + ".sock"


@dataclass(frozen=True, slots=True)
class PluginConfig:
    node: str
    socket_dir: Path = DEFAULT_SOCKET_DIR
    resources: tuple[str, ...] = RESOURCES
    slots: int = DEFAULT_SLOTS
    cdi_kind: str | None = None
    poll_s: float = 1.0
    health_s: float = 2.0
    register_timeout_s: float = 5.0
    wait_warn_s: float = DEFAULT_WAIT_WARN_S

    def __post_init__(self) -> None:
        if not self.node:
            raise ValueError("node name is empty (set NODE_NAME or --node-name)")
        if not self.resources:
            raise ValueError("resources: serve at least one resource")
        for r in self.resources:
            if r not in RESOURCES:
                raise ValueError(f"resources: {r!r} is not one of {', '.join(RESOURCES)}")
        if len(set(self.resources)) != len(self.resources):
            raise ValueError("resources: a resource is listed twice")
        if not 1 <= self.slots <= 128:
            raise ValueError(f"shared slots per GPU must be 1..128, got {self.slots}")
        if not self.wait_warn_s > 0:
            raise ValueError(f"wait_warn_s: must be > 0 seconds, got {self.wait_warn_s!r}")


def _socket_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns


class DevicePluginRunner:
    """Discovers the GPUs, watches their health, serves and registers the resources until ``stop`` is set."""

    def __init__(self, config: PluginConfig, nvml: NvmlApi, pods: NodePods, *, xids: XidWatcher | None = None) -> None:
        self.config = config
        self.nvml = nvml
        self.pods = pods
        self.xids = xids
        self.state: DeviceState | None = None
        self.registrations = 0
        """Successful rounds of registration (every resource), for tests and logs."""
        self.polls = 0
        """Looks at the kubelet's socket so far."""
        self.health_checks = 0
        """NVML health checks so far."""
        self._servers: list[grpc.aio.Server] = []

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        gpus = await asyncio.to_thread(discover, self.nvml)
        log.info("serving %d GPUs of node %s: %s", len(gpus), self.config.node, ", ".join(g.uuid for g in gpus))
        self.state = DeviceState(gpus)
        health = Health(self.nvml, gpus, xids=self.xids)
        if self.xids is not None:
            self.xids.start()
        watcher = asyncio.create_task(self._watch_health(health, self.state, stop))
        try:
            await self._serve(gpus, self.state, stop, ready)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await self._stop_servers()
            if self.xids is not None:
                await asyncio.to_thread(self.xids.stop)

    async def _watch_health(self, health: Health, state: DeviceState, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await state.set_unhealthy(await asyncio.to_thread(health.check))
            self.health_checks += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.health_s)

    async def _serve(
        self, gpus: Sequence[Gpu], state: DeviceState, stop: asyncio.Event, ready: asyncio.Event | None
    ) -> None:
        cfg = self.config
        kubelet = cfg.socket_dir / KUBELET_SOCKET
        registered_with: tuple[int, int] | None = None
        lock = asyncio.Lock()
        loop = asyncio.get_running_loop()
        waiting_since: float | None = None  # loop time the wait for kubelet.sock began
        warned_at = 0.0
        while not stop.is_set():
            current = _socket_id(kubelet)
            own = all((cfg.socket_dir / endpoint_name(r)).exists() for r in cfg.resources)
            if current is not None and (current != registered_with or not own):
                if registered_with is not None:
                    log.info("the kubelet restarted (or removed our sockets): serving and registering again")
                await self._stop_servers()
                await self._start_servers(state, lock)
                try:
                    await self._register(kubelet)
                except grpc.RpcError as exc:
                    log.warning("registration with the kubelet failed, retrying: %s", exc.details() or exc.code())
                    registered_with = None
                else:
                    registered_with = current
                    self.registrations += 1
                    if waiting_since is not None:
                        log.info("the kubelet is up after %.0f s: registered", loop.time() - waiting_since)
                        waiting_since = None
                    if ready is not None:
                        ready.set()
            elif current is None:
                now = loop.time()
                if registered_with is not None:
                    log.info("kubelet socket %s is gone: waiting for the kubelet", kubelet)
                    registered_with = None
                    waiting_since = warned_at = now
                elif waiting_since is None:
                    log.info(
                        "waiting for the kubelet: no %s yet (registration starts when it appears; the plugin's "
                        "--socket-dir must be the kubelet's device-plugins folder)",
                        kubelet,
                    )
                    waiting_since = warned_at = now
                elif now - warned_at >= cfg.wait_warn_s:
                    log.warning(
                        "still waiting for the kubelet: no %s after %.0f s; is the kubelet running, and is %s its "
                        "device-plugins folder (mounted into this pod)?",
                        kubelet,
                        now - waiting_since,
                        cfg.socket_dir,
                    )
                    warned_at = now
            self.polls += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), cfg.poll_s)

    async def _start_servers(self, state: DeviceState, lock: asyncio.Lock) -> None:
        cfg = self.config
        for resource in cfg.resources:
            path = cfg.socket_dir / endpoint_name(resource)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            server = grpc.aio.server()
            service = DevicePluginService(
                resource, state=state, pods=self.pods, slots=cfg.slots, cdi_kind=cfg.cdi_kind, lock=lock
            )
            pb_grpc.add_DevicePluginServicer_to_server(service, server)  # type: ignore[no-untyped-call]
            server.add_insecure_port(f"unix://{path}")
            await server.start()
            self._servers.append(server)

    async def _stop_servers(self) -> None:
        servers, self._servers = self._servers, []
        for server in servers:
            await server.stop(grace=0.5)

    async def _register(self, kubelet: Path) -> None:
        cfg = self.config
        async with grpc.aio.insecure_channel(f"unix://{kubelet}") as channel:
            stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            for resource in cfg.resources:
                await stub.Register(
                    pb.RegisterRequest(
                        version=API_VERSION,
                        endpoint=endpoint_name(resource),
                        resource_name=resource,
                        options=pb.DevicePluginOptions(
                            pre_start_required=False, get_preferred_allocation_available=True
                        ),
                    ),
                    timeout=cfg.register_timeout_s,
                )
                log.info("registered %s with the kubelet (%s)", resource, endpoint_name(resource))
