"""The exporter's HTTP side: ``/metrics`` (Prometheus), ``/v1/node`` (the node as JSON, for the scrape source) and
``/healthz``. A small threaded WSGI server. ``/metrics`` is rendered by prometheus_client's own encoders with the
hardware-only families cached (:mod:`.exposition`); other methods go to prometheus_client's own WSGI app (which
answers them with 405 and ``Allow``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson
from prometheus_client import CollectorRegistry, make_wsgi_app

from ..model.serde import GPU_ERRORS_HEADER, node_to_json
from .backend import NvmlApi
from .cgroups import PodDirectory
from .collector import NvmlCollector
from .events import XidWatcher
from .exposition import ScrapeRenderer, maybe_gzip
from .node import to_gpu_node
from .reader import NvmlReader

log = logging.getLogger(__name__)

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)


@dataclass
class Exporter:
    """One node's exporter: NVML reader, XID watcher, collector registry and the WSGI app over them."""

    nvml: NvmlApi
    node: str
    proc_root: Path = Path("/proc")
    pods_dir: Path | None = None
    watch_xid: bool = True
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=False))

    def __post_init__(self) -> None:
        self.watcher = XidWatcher(self.nvml)
        self.reader = NvmlReader(
            self.nvml,
            self.node,
            proc_root=self.proc_root,
            pods=PodDirectory(self.pods_dir),
            xid_counts=self.watcher.counts,
        )
        self.collector = NvmlCollector(self.reader)
        self.registry.register(self.collector)
        self._metrics_app = make_wsgi_app(self.registry)
        self.renderer = ScrapeRenderer()
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------------------------------------------- WSGI
    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return _respond(start_response, "405 Method Not Allowed", {"error": "only GET is served"})
        if path == "/metrics":
            if environ.get("REQUEST_METHOD", "GET") != "GET":
                return self._metrics_app(environ, start_response)  # type: ignore[no-any-return]
            return self.scrape(environ, start_response)
        if path == "/v1/node":
            reading = self.reader.read()
            if not reading.nvml_up and not reading.gpus:
                return _respond(start_response, "503 Service Unavailable", {"error": "; ".join(reading.errors)})
            body = node_to_json(to_gpu_node(reading))
            headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
            if reading.errors:
                # Some GPUs could not be read (off the bus, lost): the body holds the others; say which are missing.
                headers.append(
                    (GPU_ERRORS_HEADER, "; ".join(reading.errors)[:2000].encode("ascii", "replace").decode())
                )
            start_response("200 OK", headers)
            return [body]
        if path == "/healthz":
            last = self.collector.last
            return _respond(
                start_response,
                "200 OK",
                {"status": "ok", "node": self.node, "nvml_up": None if last is None else last.nvml_up},
            )
        return _respond(start_response, "404 Not Found", {"error": f"no such path {path}; try /metrics or /v1/node"})

    def scrape(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        """``GET /metrics``: one fresh NVML read, exposed in the format the client's ``Accept`` header asks for."""
        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]", [])
        body, content_type = self.renderer.render(self.collector.read(), environ.get("HTTP_ACCEPT"), names)
        body, headers = maybe_gzip(body, environ.get("HTTP_ACCEPT_ENCODING"))
        start_response("200 OK", [("Content-Type", content_type), *headers, ("Content-Length", str(len(body)))])
        return [body]

    # ------------------------------------------------------------------------------------------------- lifecycle
    def start(self, host: str = "0.0.0.0", port: int = 9400) -> int:
        """Start the XID watcher and serve in a background thread; returns the bound port (for ``port=0``)."""
        self._server = make_server(host, port, self, server_class=_Server, handler_class=_QuietHandler)
        if self.watch_xid:
            self.watcher.start()
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="kelvin-exporter-http", daemon=True
        )
        self._thread.start()
        return int(self._server.server_port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self.watcher.stop()
        self.reader.close()


def _respond(start_response: StartResponse, status: str, doc: dict[str, Any]) -> list[bytes]:
    body = orjson.dumps(doc)
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
