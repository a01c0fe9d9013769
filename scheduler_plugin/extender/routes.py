"""HTTP endpoints of the extender: the verbs table (:func:`verb_table`, one :class:`~.verbs.Verb` per verb: paths,
parser, handler, error reply), served by :class:`VerbEndpoint`, and /healthz, /readyz and /metrics. Bodies are read
raw and decoded with orjson or msgspec (no FastAPI body validation on the hot path); every reply is orjson.

Error behaviour (see docs/extender.md):
* a refusal is an :class:`~.errors.HttpError`, which carries its status, answered ``{"Error": "<message>"}``:
  a body that is not the expected JSON -> 400 naming the field and the problem;
  a body over ``max_body_bytes`` (by its Content-Length, or counted while it streams in) or listing more than
  ``max_node_names`` nodes -> 413 naming the limit, its setting and its env var;
  a body sent with a ``Content-Encoding`` (gzip, ...) -> 415 naming the encoding (kelvin does not decompress:
  kube-scheduler never compresses, and a decompressor would open the door to zip bombs);
  a client that went away before its body was read -> counted under 499 (nobody reads the answer);
* an unexpected failure inside kelvin -> logged with its traceback and answered with the verb's ``on_error``, never a
  500 (:mod:`.verbs`: filter and bind reply 200 with ``Error`` set, the others 503);
* kelvin never answers 422: FastAPI's validation handler is replaced by a 400 that names the fields;
* a path kelvin does not serve, with or without a trailing slash (``/filter/``) -> HTTP 404, never a redirect; no
  OpenAPI schema or docs pages are served; a verb's path asked with another method than POST -> 405, ``Allow: POST``.

The verbs are served ahead of FastAPI (:class:`ExtenderApp`, :class:`VerbRoutes`: raw ASGI, no router or
middleware per request); /healthz, /readyz, /metrics and every other path go through FastAPI.

Bodies over :data:`PARSE_INLINE_MAX_BYTES` are decoded in a worker thread, so that the event loop keeps answering
/healthz and other requests meanwhile; small ones, the common case, inline.
:func:`install_health_routes` adds /healthz, /readyz and /metrics (the metrics listener; see ``app.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from ..telemetry.gate import RequestGate
from . import wire
from .errors import ClientGone, HttpError, UnsupportedEncoding, WireError, body_too_large, too_many_names
from .metrics import ExtenderMetrics
from .preempt_route import preempt_verb
from .service import Extender
from .verbs import BindFailed, Verb, filter_failed, in_turn, served_at, unavailable

log = logging.getLogger(__name__)

JSON = "application/json"

#: Bodies up to this size are decoded on the event loop (under a millisecond); bigger ones in a worker thread.
PARSE_INLINE_MAX_BYTES = 256 * 1024

T = TypeVar("T")


def _json(obj: Any, status: int = 200) -> Response:
    return Response(content=wire.dumps(obj), status_code=status, media_type=JSON)


def _validation_message(exc: ValidationError | RequestValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


def _headers(scope: Scope) -> dict[bytes, bytes]:
    """The request's headers by lower-case name (ASGI gives them lower-cased; the last of a repeated one wins)."""
    return dict(scope["headers"])


def check_encoding(headers: dict[bytes, bytes]) -> None:
    """Refuse a compressed body with :class:`~.errors.UnsupportedEncoding` before it is read.

    kube-scheduler sends its bodies uncompressed (Go's HTTP client never compresses a request), so kelvin does not
    decompress: accepting gzip would add a decompressor, and its zip bombs, for no client that needs one. A
    ``Content-Encoding`` other than ``identity`` gets a 415 naming it, instead of "not valid JSON"."""
    encoding = headers.get(b"content-encoding", b"").decode("latin-1").strip().lower()
    if encoding not in ("", "identity"):
        raise UnsupportedEncoding(
            f"Content-Encoding {encoding!r} is not supported: kelvin reads request bodies uncompressed (as "
            "kube-scheduler sends them); send the JSON without compressing it"
        )


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The request body, refused with :class:`~.errors.TooLarge` before it is read when its Content-Length is over
    ``limit``, or as soon as the bytes received pass it (a chunked body has no Content-Length);
    :class:`~.errors.ClientGone` when the client disconnects first."""
    headers = _headers(scope)
    check_encoding(headers)
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(f"of {declared.decode()}", limit)
    chunks: list[bytes] = []
    received = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk: bytes = message.get("body", b"")
        received += len(chunk)
        if received > limit:
            raise body_too_large(f"of more than {limit}", limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_json(send: Send, status: int, content: bytes, *, close: bool = False, allow: str | None = None) -> None:
    """One JSON reply, straight to the ASGI server: its start (status, type, length) and its body."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    if allow is not None:
        headers.append((b"allow", allow.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


async def decode(fn: Callable[[bytes], T], body: bytes) -> T:
    """``fn(body)``, in a worker thread when the body is big enough to hold the event loop up."""
    if len(body) <= PARSE_INLINE_MAX_BYTES:
        return fn(body)
    return await anyio.to_thread.run_sync(fn, body)


def parse_explain(body: bytes, *, max_node_names: int) -> wire.ExplainArgs:
    try:
        args = wire.ExplainArgs.model_validate_json(body or b"null")
    except ValidationError as exc:
        raise WireError(_validation_message(exc)) from None
    if args.candidates is not None:
        if len(args.candidates) > max_node_names:
            raise too_many_names("candidates", len(args.candidates), max_node_names)
        args.candidates = list(dict.fromkeys(args.candidates))
    return args


def verb_table(ext: Extender) -> tuple[Verb[Any], ...]:
    """The verbs ``ext`` serves: kube-scheduler's (filter, prioritize, bind, preempt) and kelvin's ``/explain``."""
    max_names = ext.settings.max_node_names
    parse_args = partial(wire.parse_args, max_node_names=max_names, names=ext.names)
    return (
        Verb("filter", served_at("filter"), parse_args, in_turn(ext.turn, ext.filter), filter_failed),
        Verb("prioritize", served_at("prioritize"), parse_args, in_turn(ext.turn, ext.prioritize), unavailable),
        # bind takes its turn itself, around its CPU work only (not while the API server answers)
        Verb("bind", served_at("bind"), wire.parse_binding, ext.bind, BindFailed(ext.metrics)),
        Verb(
            "explain",
            ("/explain",),
            partial(parse_explain, max_node_names=max_names),
            in_turn(ext.turn, lambda a: ext.explain(a.pod, a.node, a.candidates)),
            unavailable,
        ),
        preempt_verb(ext),  # preempt_route.py
    )


class VerbEndpoint:
    """Serves one :class:`~.verbs.Verb` as an ASGI app: reads the body within ``max_body`` bytes, marks the request as
    being served (the snapshot refresh steps aside meanwhile), parses and answers it, maps its errors to replies, and
    counts it in ``kelvin_extender_requests_total`` and ``kelvin_extender_request_duration_seconds``. It catches
    every exception itself: nothing it raises reaches the server (no 500)."""

    def __init__(self, verb: Verb[Any], *, gate: RequestGate, metrics: ExtenderMetrics, max_body: int) -> None:
        self.verb = verb
        self.gate = gate
        self.max_body = max_body
        self._duration = metrics.duration.labels(verb.name)
        self._requests = metrics.requests
        self._answered = self._requests.labels(verb.name, "200")
        """The counter of 200 replies (nearly every request), without a label lookup each time."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        arrived = asyncio.get_running_loop().time()  # a bind's deadline counts from here, before the body is read
        verb = self.verb
        status, close = 200, False
        try:
            body = await read_body(scope, receive, self.max_body)
            with self.gate.serving():
                content = wire.dumps(await verb.handle(await decode(verb.parse, body), arrived))
        except HttpError as exc:
            log.log(exc.log_level, "%s", exc.log_line(verb.name))
            status, close = exc.status, exc.close
            content = wire.dumps({"Error": str(exc)})
        except Exception as exc:
            log.exception("%s failed", verb.name)
            reply, status = verb.on_error(f"kelvin {verb.name} failed: {type(exc).__name__}: {exc}")
            content = wire.dumps(reply)
        self._duration.observe(time.perf_counter() - started)
        (self._answered if status == 200 else self._requests.labels(verb.name, str(status))).inc()
        await send_json(send, status, content, close=close)


class VerbRoutes:
    """The verbs' paths, each to its :class:`VerbEndpoint`: what :class:`ExtenderApp` serves before FastAPI's own
    routing. A verb's path asked with another method than POST is a 405 naming the one allowed."""

    def __init__(self, ext: Extender) -> None:
        self.endpoints: dict[str, VerbEndpoint] = {}
        max_body = ext.settings.max_body_bytes
        for verb in verb_table(ext):
            endpoint = VerbEndpoint(verb, gate=ext.cache.gate, metrics=ext.metrics, max_body=max_body)
            self.endpoints.update(dict.fromkeys(verb.paths, endpoint))

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer ``scope`` when it asks for a verb's path (True); else False, for the app's routing."""
        if scope["type"] != "http":
            return False
        endpoint = self.endpoints.get(scope["path"])
        if endpoint is None:
            return False
        if scope["method"] == "POST":
            await endpoint(scope, receive, send)
        else:
            message = f"{scope['path']} answers POST only (kube-scheduler's extender protocol), not {scope['method']}"
            await send_json(send, 405, wire.dumps({"Error": message}), allow="POST")
        return True


class ExtenderApp(FastAPI):
    """The extender's FastAPI app with its hot verbs served ahead of FastAPI: a POST to a verb's path goes straight
    to its :class:`VerbEndpoint` (raw ASGI: no router, no middleware stack, no Request or Response object, which
    cost a quarter of a millisecond per request at kube-scheduler's pace); every other request (probes, metrics, an
    unknown path) and the lifespan go through FastAPI as usual."""

    verb_routes: VerbRoutes | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        routes = self.verb_routes
        if routes is not None and await routes.serve(scope, receive, send):
            return
        await super().__call__(scope, receive, send)


async def _validation_error(request: Request, exc: Exception) -> Response:
    """FastAPI's validation failures (the probes' routes): a 400 naming the fields, never its 422."""
    message = _validation_message(exc) if isinstance(exc, RequestValidationError) else str(exc)
    return _json({"Error": message}, 400)


def install_routes(app: ExtenderApp, ext: Extender, *, health: bool = True) -> None:
    """The verbs (:class:`VerbRoutes`, served ahead of FastAPI) and /healthz; with ``health`` also /readyz and
    /metrics (one listener for everything)."""
    app.verb_routes = VerbRoutes(ext)
    app.add_exception_handler(RequestValidationError, _validation_error)
    install_health_routes(app, ext, probes=health)


def install_health_routes(app: FastAPI, ext: Extender, *, probes: bool = True) -> None:
    """/healthz; with ``probes`` also /readyz and /metrics."""
    m = ext.metrics

    @app.get("/healthz")
    async def healthz() -> Response:
        if ext.cache.refresher_stopped:
            return _json({"status": "error", "reason": "the telemetry refresh task has stopped"}, 503)
        return _json({"status": "ok"})

    if not probes:
        return

    @app.get("/readyz")
    async def readyz() -> Response:
        r = ext.cache.readiness()
        return _json({"ready": r.ready, "reason": r.reason}, 200 if r.ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        ext.cache.update_metrics()
        m.assumed.set(len(ext.ledger))
        return Response(content=generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
