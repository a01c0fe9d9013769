"""The exporter's routes: ``/metrics`` (Prometheus), ``/v1/node`` (the node as JSON, for the scrape source) and
``/healthz``, each answering ``GET`` and ``HEAD`` (the same status and headers, no body). :meth:`Exporter.respond`
is the routing, a plain function of the request; :mod:`.server` serves it over HTTP with bounded threads and
connections, and :meth:`Exporter.__call__` is the same routing as a WSGI app (benchmarks, tests, any WSGI server).
``/metrics`` is rendered by prometheus_client's own encoders with the hardware-only families cached
(:mod:`.exposition`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import orjson
from prometheus_client import CollectorRegistry

from ..model.serde import GPU_ERRORS_HEADER, node_to_json
from ..nvml.backend import NvmlApi
from ..nvml.events import XidWatcher
from .cgroups import PodDirectory
from .collector import NvmlCollector
from .exposition import ScrapeRenderer, maybe_gzip
from .limits import ServeLimits
from .node import to_gpu_node
from .reader import NvmlReader
from .server import HttpServer, Reply

log = logging.getLogger(__name__)

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
_ROUTES = ("/metrics", "/v1/node", "/healthz")
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


@dataclass
class Exporter:
    """One node's exporter: NVML reader, XID watcher, collector registry, and the routes over them."""

    nvml: NvmlApi
    node: str
    proc_root: Path = Path("/proc")
    pods_dir: Path | None = None
    watch_xid: bool = True
    limits: ServeLimits = field(default_factory=ServeLimits)
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
        self.renderer = ScrapeRenderer()
        self.http: HttpServer | None = None

    # -------------------------------------------------------------------------------------------------- routes
    def respond(self, method: str, path: str, query: str, headers: Mapping[str, str]) -> Reply:
        """The answer to one request. ``HEAD`` is routed as ``GET`` (the server leaves the body out); any other
        method is 405 with ``Allow``."""
        if path not in _ROUTES:
            return _json(404, {"error": f"no such path {path}; try /metrics or /v1/node"})
        if method not in ("GET", "HEAD"):
            return _json(405, {"error": f"{path} answers GET and HEAD only (got {method})"}, ("Allow", "GET, HEAD"))
        if path == "/metrics":
            return self.scrape(query, headers.get("Accept"), headers.get("Accept-Encoding"))
        if path == "/v1/node":
            reading = self.reader.read()
            if not reading.nvml_up and not reading.gpus:
                return _json(503, {"error": "; ".join(reading.errors)})
            body = node_to_json(to_gpu_node(reading))
            node_headers = [("Content-Type", "application/json")]
            if reading.errors:
                # Some GPUs could not be read (off the bus, lost): the body holds the others; say which are missing.
                node_headers.append(
                    (GPU_ERRORS_HEADER, "; ".join(reading.errors)[:2000].encode("ascii", "replace").decode())
                )
            return Reply(200, node_headers, body)
        last = self.collector.last
        return _json(200, {"status": "ok", "node": self.node, "nvml_up": None if last is None else last.nvml_up})

    def scrape(self, query: str = "", accept: str | None = None, accept_encoding: str | None = None) -> Reply:
        """``GET /metrics``: one fresh NVML read, exposed in the format ``Accept`` asks for, gzipped when
        ``Accept-Encoding`` accepts it (``gzip;q=0`` does not)."""
        names = parse_qs(query).get("name[]", [])
        body, content_type = self.renderer.render(self.collector.read(), accept, names)
        body, encoding = maybe_gzip(body, accept_encoding)
        return Reply(200, [("Content-Type", content_type), ("Vary", "Accept, Accept-Encoding"), *encoding], body)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """:meth:`respond` as a WSGI app."""
        method = environ.get("REQUEST_METHOD", "GET")
        headers = {
            name: environ[key]
            for name, key in (("Accept", "HTTP_ACCEPT"), ("Accept-Encoding", "HTTP_ACCEPT_ENCODING"))
            if key in environ
        }
        reply = self.respond(method, environ.get("PATH_INFO", "/"), environ.get("QUERY_STRING", ""), headers)
        start_response(
            f"{reply.status} {_REASONS.get(reply.status, '')}".strip(),
            [*reply.headers, ("Content-Length", str(len(reply.body)))],
        )
        return [] if method == "HEAD" else [reply.body]

    # ------------------------------------------------------------------------------------------------- lifecycle
    def start(self, host: str = "0.0.0.0", port: int = 9400) -> int:
        """Start the XID watcher and serve (:mod:`.server`) in a background thread; returns the bound port (for
        ``port=0``). Raises ``OSError`` when ``host:port`` cannot be bound."""
        self.http = HttpServer(self.respond, self.limits)
        port = self.http.start(host, port)
        if self.watch_xid:
            self.watcher.start()
        return port

    def stop(self) -> None:
        if self.http is not None:
            self.http.stop()
            self.http = None
        self.watcher.stop()
        self.reader.close()


def _json(status: int, doc: dict[str, Any], *headers: tuple[str, str]) -> Reply:
    return Reply(status, [("Content-Type", "application/json"), *headers], orjson.dumps(doc))
