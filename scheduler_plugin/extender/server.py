"""Running the extender under uvicorn: :class:`ExtenderServers` (``kelvin extender``: the verbs listener and the
metrics listener in one event loop) and :class:`ServerThread` (one app on a loopback port in a background thread, for
the demo and tests)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Generator
from types import TracebackType
from typing import Literal

import uvicorn
from fastapi import FastAPI

from ..settings import Settings, is_loopback
from .app import StartupError, create_app, create_metrics_app
from .service import Extender

log = logging.getLogger(__name__)


def _config(app: FastAPI, *, log_level: str, lifespan: Literal["on", "off"]) -> uvicorn.Config:
    """uvicorn's settings for a kelvin listener: no access log (the verbs have metrics), no proxy headers middleware
    (kelvin reads no client address; it would cost every request a pass over its headers) and no ``server`` header
    naming uvicorn on every reply."""
    return uvicorn.Config(
        app, log_level=log_level, lifespan=lifespan, access_log=False, proxy_headers=False, server_header=False
    )


class ServerThread:
    """``with ServerThread(app) as url:`` serves ``app`` on 127.0.0.1 at a free port until the block ends."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", startup_timeout_s: float = 30.0) -> None:
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.server = uvicorn.Server(_config(app, log_level="warning", lifespan="on"))
        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only then (else 40 ms delayed-ACK stalls)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self.port = int(self._sock.getsockname()[1])
        self._thread = threading.Thread(target=self._run, name="kelvin-extender", daemon=True)
        self.error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self._sock])
        except BaseException as exc:  # reported to the starting thread
            self.error = exc

    def start(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.server.started:
            if self.error is not None or not self._thread.is_alive():
                raise RuntimeError(f"the extender did not start: {self.error or 'server exited'}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the extender did not start within {self.startup_timeout_s:g} s")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class _MainServer(uvicorn.Server):
    """The verbs server: it handles SIGTERM / SIGINT for the process, and a SIGTERM that stopped it cleanly is a
    clean exit (status 0). uvicorn re-raises the signal once it has shut down, which kills the process with it
    (status -15): Kubernetes' ordinary stop of a pod would read as a crash."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]


class _OncePerProcess(logging.Filter):
    """Lets uvicorn's "Started/Finished server process [pid]" through once: each of the two listeners' servers logs
    it, for the one process."""

    MESSAGES = frozenset({"Started server process [%d]", "Finished server process [%d]"})

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not isinstance(record.msg, str) or record.msg not in self.MESSAGES:
            return True
        if record.msg in self.seen:
            return False
        self.seen.add(record.msg)
        return True


class _SideServer(uvicorn.Server):
    """A uvicorn server that leaves signals to the main one (which stops it when it stops)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def listen(host: str, port: int, field: str) -> socket.socket:
    """A TCP socket bound to ``host:port``; a :class:`StartupError` naming ``field`` when that is impossible."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except (socket.gaierror, UnicodeError) as exc:
        raise StartupError(f"{field}: cannot resolve {host!r}: {exc}") from None
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only then (else 40 ms delayed-ACK stalls)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"{field}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


class ExtenderServers:
    """The extender's two listeners in one process, sharing one :class:`Extender`:

    * the verbs (filter, prioritize, bind, explain, and /healthz) on ``host:port``, loopback by default: the
      scheduler runs beside kelvin in the pod, and nothing else should be able to bind pods;
    * /healthz, /readyz and /metrics on ``metrics_host:metrics_port`` (all interfaces by default: probes and
      Prometheus), served by their own thread and event loop (:func:`_run_side`): while the verbs keep their loop
      busy, a probe waits at most for the interpreter to switch threads (milliseconds), never for the queue of
      verbs. These handlers only read the published snapshot and the metrics, which are safe to read from another
      thread. ``metrics_port: 0`` serves them on the verbs listener (and loop) instead.

    Both sockets are bound here, before anything starts, so a port in use stops startup with the setting named.
    """

    def __init__(
        self,
        ext: Extender,
        settings: Settings,
        *,
        log_level: str = "info",
        sockets: tuple[socket.socket, socket.socket | None] | None = None,
    ) -> None:
        if sockets is None:
            verbs_sock = listen(settings.host, settings.port, "host/port (KELVIN_HOST, KELVIN_PORT)")
            metrics_sock = None
            if settings.metrics_port:
                try:
                    metrics_sock = listen(
                        settings.metrics_host,
                        settings.metrics_port,
                        "metrics_host/metrics_port (KELVIN_METRICS_HOST, KELVIN_METRICS_PORT)",
                    )
                except StartupError:
                    verbs_sock.close()
                    raise
            sockets = (verbs_sock, metrics_sock)
        self.verbs_sock, self.metrics_sock = sockets
        self.settings = settings
        level = log_level.lower()
        separate = self.metrics_sock is not None
        self.verbs = _MainServer(_config(create_app(ext, metrics=not separate), log_level=level, lifespan="on"))
        self.metrics: uvicorn.Server | None = None
        if separate:
            self.metrics = _SideServer(_config(create_metrics_app(ext), log_level=level, lifespan="off"))

    @property
    def verbs_url(self) -> str:
        return _url(self.verbs_sock)

    @property
    def metrics_url(self) -> str | None:
        return _url(self.metrics_sock) if self.metrics_sock is not None else None

    @property
    def started(self) -> bool:
        return self.verbs.started and (self.metrics is None or self.metrics.started)

    def request_stop(self) -> None:
        self.verbs.should_exit = True
        if self.metrics is not None:
            self.metrics.should_exit = True

    async def serve(self) -> None:
        if not is_loopback(self.settings.host):
            log.warning(
                "the extender verbs (filter, prioritize, bind) listen on %s, not on loopback: anything that reaches "
                "port %d can bind pods; keep host (KELVIN_HOST) at 127.0.0.1 when kube-scheduler runs in this pod",
                self.settings.host,
                self.settings.port,
            )
        log.info(
            "kelvin extender: verbs on %s, /healthz /readyz /metrics on %s",
            self.verbs_url,
            self.metrics_url or f"{self.verbs_url} (metrics_port 0)",
        )
        side: threading.Thread | None = None
        once = _OncePerProcess()
        uvicorn_log = logging.getLogger("uvicorn.error")
        uvicorn_log.addFilter(once)
        if self.metrics is not None and self.metrics_sock is not None:
            loop = asyncio.get_running_loop()
            side = threading.Thread(
                target=_run_side,
                args=(self.metrics, self.metrics_sock, lambda: loop.call_soon_threadsafe(self.request_stop)),
                name="kelvin-metrics",
                daemon=True,
            )
            side.start()
        try:
            await self.verbs.serve(sockets=[self.verbs_sock])
        except SystemExit:  # uvicorn >= 0.30 exits 3 when the lifespan fails; older ones return normally
            if self.verbs.started:
                raise
        finally:
            self.request_stop()
            if side is not None:
                await asyncio.to_thread(side.join)
            uvicorn_log.removeFilter(once)
        if not self.verbs.started:
            # uvicorn returns normally when the app's lifespan fails (it logged why): not a clean stop.
            raise StartupError("the extender did not start: its startup (the telemetry cache) failed, see above")

    def run(self) -> None:
        """Serve until SIGTERM / SIGINT (or :meth:`request_stop`), on uvloop when it is installed. Raises
        :class:`StartupError` when the verbs app did not start (its lifespan failed)."""
        try:
            with asyncio.Runner(loop_factory=_new_loop) as runner:
                runner.run(self.serve())
        finally:
            self.verbs_sock.close()
            if self.metrics_sock is not None:
                self.metrics_sock.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover (Windows)
        return asyncio.new_event_loop()


def _run_side(server: uvicorn.Server, sock: socket.socket, stopped: Callable[[], None]) -> None:
    """Serve the metrics listener on this thread's own event loop until it is told to stop; then (or when it ends
    on its own, e.g. a failure) call ``stopped``, so that one listener gone stops the other too."""
    try:
        with asyncio.Runner(loop_factory=_new_loop) as runner:
            runner.run(server.serve(sockets=[sock]))
    except BaseException:  # reported, and the verbs server stopped with it
        log.exception("the metrics listener failed")
    finally:
        with contextlib.suppress(RuntimeError):  # the verbs' loop has closed already
            stopped()


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
