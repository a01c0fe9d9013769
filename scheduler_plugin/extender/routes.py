"""HTTP endpoints of the extender. Bodies are read raw and decoded with orjson (no FastAPI body validation on the hot
path); every reply is orjson.

Error behaviour (see docs/extender.md):
* a body that is not the expected JSON -> HTTP 400 ``{"Error": "<field>: <problem>"}``;
* an unexpected failure inside kelvin -> logged with its traceback and answered without a 500: filter and bind
  reply 200 with ``Error`` set (kube-scheduler keeps the pod pending with that message and retries); prioritize and
  explain reply 503 (kube-scheduler ignores prioritize failures);
* kelvin never answers 422: FastAPI's validation handler is replaced by a 400 that names the fields;
* a body over ``max_body_bytes`` (by its Content-Length, or counted while it streams in) or listing more than
  ``max_node_names`` nodes -> HTTP 413 ``{"Error": "..."}`` naming the limit, its setting and its env var;
* a body sent with a ``Content-Encoding`` (gzip, ...) -> HTTP 415 naming the encoding (kelvin does not decompress:
  kube-scheduler never compresses, and a decompressor would open the door to zip bombs);
* a path kelvin does not serve, with or without a trailing slash (``/filter/``) -> HTTP 404, never a redirect; no
  OpenAPI schema or docs pages are served.

Bodies over :data:`PARSE_INLINE_MAX_BYTES` are decoded (orjson + the shape checks) in a worker thread, so that the
event loop keeps answering /healthz and other requests meanwhile; small ones, the common case, inline.

The verbs are served at ``/<verb>`` and ``/scheduler/<verb>`` (the prefix used in the captures and examples).
:func:`install_health_routes` adds /healthz, /readyz and /metrics (the metrics listener; see ``app.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from . import wire
from .preempt_route import install_preempt_route
from .service import Extender

log = logging.getLogger(__name__)

JSON = "application/json"

#: Bodies up to this size are decoded on the event loop (under a millisecond); bigger ones in a worker thread.
PARSE_INLINE_MAX_BYTES = 256 * 1024

#: The status a request the client gave up on is counted under in ``kelvin_extender_requests_total`` (nginx's code).
CLIENT_CLOSED_REQUEST = 499

T = TypeVar("T")


def _json(obj: Any, status: int = 200) -> Response:
    return Response(content=wire.dumps(obj), status_code=status, media_type=JSON)


def _validation_message(exc: ValidationError | RequestValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


def body_too_large(size: str, limit: int) -> wire.TooLarge:
    return wire.TooLarge(
        f"request body {size} bytes is over max_body_bytes ({limit} bytes, env KELVIN_MAX_BODY_BYTES); raise the "
        "limit if your scheduler sends requests this big (nodeCacheCapable: false with many nodes)"
    )


def check_encoding(request: Request) -> None:
    """Refuse a compressed body with :class:`wire.UnsupportedEncoding` before it is read.

    kube-scheduler sends its bodies uncompressed (Go's HTTP client never compresses a request), so kelvin does not
    decompress: accepting gzip would add a decompressor, and its zip bombs, for no client that needs one. A
    ``Content-Encoding`` other than ``identity`` gets a 415 naming it, instead of "not valid JSON"."""
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise wire.UnsupportedEncoding(
            f"Content-Encoding {encoding!r} is not supported: kelvin reads request bodies uncompressed (as "
            "kube-scheduler sends them); send the JSON without compressing it"
        )


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with :class:`wire.TooLarge` before it is read when its Content-Length is over
    ``limit``, or as soon as the bytes received pass it (a chunked body has no Content-Length)."""
    check_encoding(request)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(f"of {declared}", limit)
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise body_too_large(f"of more than {limit}", limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def decode(fn: Callable[[bytes], T], body: bytes) -> T:
    """``fn(body)``, in a worker thread when the body is big enough to hold the event loop up."""
    if len(body) <= PARSE_INLINE_MAX_BYTES:
        return fn(body)
    return await anyio.to_thread.run_sync(fn, body)


def install_routes(app: FastAPI, ext: Extender, *, health: bool = True) -> None:  # noqa: C901
    """The verbs and /healthz; with ``health`` also /readyz and /metrics (one listener for everything)."""
    m = ext.metrics
    gate = ext.cache.gate  # the snapshot refresh steps aside while a verb is served
    max_body = ext.settings.max_body_bytes
    max_names = ext.settings.max_node_names

    async def run_verb(verb: str, request: Request, call: Callable[[bytes], Awaitable[Any]]) -> Response:
        started = time.perf_counter()
        try:
            body = await read_body(request, max_body)
            with gate.serving():
                resp = _json(await call(body))
        except wire.TooLarge as exc:
            # kube-scheduler shows only the status code (413) on the pod: the reason is in kelvin's log
            log.warning("%s: request refused: %s", verb, exc)
            resp = _json({"Error": str(exc)}, 413)
            resp.headers["Connection"] = "close"  # the rest of an unread body is not worth reading
        except wire.UnsupportedEncoding as exc:
            log.info("%s: request refused: %s", verb, exc)
            resp = _json({"Error": str(exc)}, 415)
            resp.headers["Connection"] = "close"  # the body was not read
        except wire.WireError as exc:
            log.info("%s: bad request: %s", verb, exc)
            resp = _json({"Error": str(exc)}, 400)
        except ClientDisconnect:
            # kube-scheduler gave up (its httpTimeout) or went away while sending: nothing failed inside kelvin and
            # nobody reads the answer. Counted under nginx's 499 ("client closed request"), not as an error.
            log.info("%s: the client disconnected before the request was read", verb)
            resp = _json({"Error": "client disconnected"}, CLIENT_CLOSED_REQUEST)
        except Exception as exc:
            log.exception("%s failed", verb)
            msg = f"kelvin {verb} failed: {type(exc).__name__}: {exc}"
            if verb == "filter":
                resp = _json(wire.error_result(msg))
            elif verb == "bind":
                m.decisions.labels("bind", "error").inc()
                resp = _json({"Error": msg})
            else:
                resp = _json({"Error": msg}, 503)
        m.duration.labels(verb).observe(time.perf_counter() - started)
        m.requests.labels(verb, str(resp.status_code)).inc()
        return resp

    def parse_filter(body: bytes) -> wire.ParsedArgs:
        return wire.parse_args(body, max_node_names=max_names, names=ext.names)

    def parse_prioritize(body: bytes) -> wire.ParsedArgs:
        return wire.parse_args(body, max_node_names=max_names, names=ext.names)

    def parse_explain(body: bytes) -> wire.ExplainArgs:
        try:
            args = wire.ExplainArgs.model_validate_json(body or b"null")
        except ValidationError as exc:
            raise wire.WireError(_validation_message(exc)) from None
        if args.candidates is not None:
            if len(args.candidates) > max_names:
                raise wire.too_many_names("candidates", len(args.candidates), max_names)
            args.candidates = list(dict.fromkeys(args.candidates))
        return args

    turn = ext.turn  # one verb's CPU work per pass of the event loop (turns.py)

    async def do_filter(body: bytes) -> Any:
        args = await decode(parse_filter, body)
        async with turn:
            return ext.filter(args)

    async def do_prioritize(body: bytes) -> Any:
        args = await decode(parse_prioritize, body)
        async with turn:
            return ext.prioritize(args)

    async def do_explain(body: bytes) -> Any:
        args = await decode(parse_explain, body)
        async with turn:
            return ext.explain(args.pod, args.node, args.candidates)

    async def filter_route(request: Request) -> Response:
        return await run_verb("filter", request, do_filter)

    async def prioritize_route(request: Request) -> Response:
        return await run_verb("prioritize", request, do_prioritize)

    async def bind_route(request: Request) -> Response:
        arrived = asyncio.get_running_loop().time()  # the bind deadline counts from here, before the body is read

        async def do_bind(body: bytes) -> Any:
            return await ext.bind(body, arrived=arrived)

        return await run_verb("bind", request, do_bind)

    async def explain_route(request: Request) -> Response:
        return await run_verb("explain", request, do_explain)

    # Plain Starlette routes (``add_route``), not FastAPI's ``add_api_route``: each handler takes the request and
    # reads its body itself, so FastAPI's dependency and validation machinery would only cost time per request.
    for prefix in ("", "/scheduler"):
        app.add_route(f"{prefix}/filter", filter_route, methods=["POST"], include_in_schema=False)
        app.add_route(f"{prefix}/prioritize", prioritize_route, methods=["POST"], include_in_schema=False)
        app.add_route(f"{prefix}/bind", bind_route, methods=["POST"], include_in_schema=False)
    app.add_route("/explain", explain_route, methods=["POST"], include_in_schema=False)
    install_preempt_route(app, ext, run_verb)  # preempt_route.py

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return _json({"Error": _validation_message(exc)}, 400)

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
