"""The exporter's HTTP listener: aiohttp's low-level server on its own event loop in one background thread, the
handler's work (an NVML read, the exposition) in a small bounded thread pool.

What a node-local listener reachable by every pod needs, and a thread-per-connection server lacks:

* **Bounded threads.** Connections cost no thread: one event-loop thread holds them all, and at most
  :attr:`~.limits.ServeLimits.workers` threads run requests (350 idle connections are 350 sockets, not 354 threads).
* **A connection cap.** Past :attr:`~.limits.ServeLimits.max_connections` open connections a new one is answered
  ``503 Service Unavailable`` at once and closed, without being read.
* **Idle connections closed.** A connection must deliver its first request head (request line and headers) within
  :attr:`~.limits.ServeLimits.header_timeout_s` of opening (a client that connects and sends nothing, or trickles its
  headers, is closed then); between requests aiohttp's keep-alive timeout,
  :attr:`~.limits.ServeLimits.idle_timeout_s`, closes it.
* **A request line that is not HTTP/1.x** (a bare HTTP/0.9 ``GET /metrics``, garbage) is answered ``400 Bad Request``
  and closed as soon as its line ends, not held until the client gives up.

The first two and the first-request checks are :class:`_Guard`, a protocol in front of aiohttp's own; everything
after the first request line (parsing, keep-alive, ``HEAD`` answered without a body) is aiohttp's.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_request import BaseRequest

from .limits import ServeLimits

log = logging.getLogger(__name__)

#: An HTTP/1.x request line: method, target, version (RFC 9112 section 3), without its line end.
_REQUEST_LINE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+ [!-~]+ HTTP/1\.[0-9]")
#: Longest first request head read before it must be complete (aiohttp's own line limit is 8190 bytes).
_MAX_HEAD_BYTES = 64 * 1024


@dataclass(frozen=True)
class Reply:
    """A response: status code, headers, body. ``HEAD`` gets the same status and headers without the body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


Responder = Callable[[str, str, str, Mapping[str, str]], Reply]
"""``(method, path, query string, headers) -> Reply``; called in a pool thread. ``headers`` looks names up
case-insensitively (aiohttp's ``CIMultiDictProxy``)."""


def _canned(status: str, message: str) -> bytes:
    body = f'{{"error": "{message}"}}'.encode()
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


_BUSY = _canned("503 Service Unavailable", "too many open connections; try again")
_BAD_LINE = _canned("400 Bad Request", "not an HTTP/1.x request line")
_HEAD_TOO_LARGE = _canned("431 Request Header Fields Too Large", "request head too large")


class _Guard(asyncio.Protocol):
    """One connection: checks the first request (its line, and that its head arrives in time) and counts the
    connection against the cap; passes every byte on to aiohttp's protocol for that connection."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._head = b""
        self._line_checked = False
        self._head_done = False
        self._deadline: asyncio.TimerHandle | None = None

    # -------------------------------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        guards = self._server.guards
        if len(guards) >= self._server.limits.max_connections:
            self._server.refused += 1
            log.debug("refused a connection from %s: %d open", transport.get_extra_info("peername"), len(guards))
            transport.write(_BUSY)
            transport.close()
            return
        guards.add(self)
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self._server.limits.header_timeout_s, self._too_slow)
        self._inner = self._server.protocol_factory()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            return
        if not self._head_done:
            self._head += data
            head = self._head.lstrip(b"\r\n")  # empty lines before the request line are allowed (RFC 9112 2.2)
            if not self._line_checked and not self._check_line(head):
                return
            if b"\r\n\r\n" in head or b"\n\n" in head:
                self._head_done = True
                self._head = b""
                self._cancel_deadline()
            elif len(self._head) > _MAX_HEAD_BYTES:
                self._close_with(_HEAD_TOO_LARGE)
                return
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self._inner is None else self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self._server.guards.discard(self)
        if self._inner is not None:
            self._inner.connection_lost(exc)
            self._inner = None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    # ---------------------------------------------------------------------------------------------- checks
    def _check_line(self, head: bytes) -> bool:
        """Whether the bytes so far may still be an HTTP/1.x request: False (and the connection answered 400 and
        closed) once the first line has ended and is not one."""
        end = head.find(b"\n")
        if end < 0:
            if len(head) > _MAX_HEAD_BYTES:
                self._close_with(_BAD_LINE)
                return False
            return True
        line = head[:end].removesuffix(b"\r")
        if not _REQUEST_LINE.fullmatch(line):
            self._close_with(_BAD_LINE)
            return False
        self._line_checked = True
        return True

    def _too_slow(self) -> None:
        self._deadline = None
        if self._transport is not None and not self._head_done:
            self._server.timed_out += 1
            log.debug("closed %s: no request head in time", self._transport.get_extra_info("peername"))
            self._transport.close()

    def _close_with(self, reply: bytes) -> None:
        self._cancel_deadline()
        assert self._transport is not None
        self._transport.write(reply)
        self._transport.close()
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.connection_lost(None)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


class HttpServer:
    """Serves ``respond`` on ``host:port`` until :meth:`stop`; see the module docstring for the limits."""

    def __init__(self, respond: Responder, limits: ServeLimits | None = None) -> None:
        self.respond = respond
        self.limits = limits or ServeLimits()
        self.guards: set[_Guard] = set()
        self.refused = 0
        """Connections answered 503 at the cap."""
        self.timed_out = 0
        """Connections closed for not sending their first request head within ``header_timeout_s``."""
        self._pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix="kelvin-exporter-worker")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._aio: web.Server | None = None

    @property
    def protocol_factory(self) -> Callable[[], asyncio.Protocol]:
        assert self._aio is not None
        return self._aio

    @property
    def open_connections(self) -> int:
        return len(self.guards)

    async def _handle(self, request: BaseRequest) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        reply = await loop.run_in_executor(
            self._pool, self.respond, request.method, request.path, request.query_string, request.headers
        )
        # aiohttp answers HEAD with these headers (Content-Length included) and no body
        response = web.Response(status=reply.status, body=reply.body)
        for name, value in reply.headers:
            if name.lower() != "content-length":
                response.headers[name] = value
        return response

    def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` (raises ``OSError`` when impossible) and serve in a background thread; returns the
        bound port (for ``port=0``)."""
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only then (else 40 ms delayed-ACK stalls)
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        port = int(sock.getsockname()[1])
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(self._serve(sock, ready))
            except BaseException as exc:  # handed to the starting thread while it waits
                failed.append(exc)
                ready.set()
                if self._stop is None:
                    return
                raise

        self._thread = threading.Thread(target=run, name="kelvin-exporter-http", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the exporter's HTTP listener did not start within 10 s")
        if failed:
            sock.close()
            raise RuntimeError(f"the exporter's HTTP listener did not start: {failed[0]}")
        return port

    async def _serve(self, sock: socket.socket, ready: threading.Event) -> None:
        loop = asyncio.get_running_loop()
        self._aio = web.Server(self._handle, access_log=None, keepalive_timeout=self.limits.idle_timeout_s)
        server = await loop.create_server(lambda: _Guard(self), sock=sock)
        self._loop = loop
        self._stop = asyncio.Event()
        ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for guard in list(self.guards):
                guard.close()
            await self._aio.shutdown(1.0)
            sock.close()

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(10)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._loop = self._stop = self._thread = None
