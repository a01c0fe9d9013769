"""Running the extender app under uvicorn on a loopback port in a background thread (demo, tests)."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

import uvicorn
from fastapi import FastAPI


class ServerThread:
    """``with ServerThread(app) as url:`` serves ``app`` on 127.0.0.1 at a free port until the block ends."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", startup_timeout_s: float = 30.0) -> None:
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False))
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
