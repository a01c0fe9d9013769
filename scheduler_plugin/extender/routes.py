"""HTTP endpoints of the extender. Bodies are read raw and decoded with orjson (no FastAPI body validation on the hot
path); every reply is orjson.

Error behaviour (see docs/extender.md):
* a body that is not the expected JSON -> HTTP 400 ``{"Error": "<field>: <problem>"}``;
* an unexpected failure inside kelvin -> logged with its traceback and answered without a 500: filter and bind
  reply 200 with ``Error`` set (kube-scheduler keeps the pod pending with that message and retries); prioritize and
  explain reply 503 (kube-scheduler ignores prioritize failures);
* kelvin never answers 422: FastAPI's validation handler is replaced by a 400 that names the fields.

The verbs are served at ``/<verb>`` and ``/scheduler/<verb>`` (the prefix used in the captures and examples).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from . import wire
from .service import Extender

log = logging.getLogger(__name__)

JSON = "application/json"


def _json(obj: Any, status: int = 200) -> Response:
    return Response(content=wire.dumps(obj), status_code=status, media_type=JSON)


def _validation_message(exc: ValidationError | RequestValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


def install_routes(app: FastAPI, ext: Extender) -> None:
    m = ext.metrics
    gate = ext.cache.gate  # the snapshot refresh steps aside while a verb is served

    async def run_verb(verb: str, request: Request, call: Callable[[bytes], Awaitable[Any]]) -> Response:
        started = time.perf_counter()
        try:
            with gate.serving():
                body = await request.body()
                resp = _json(await call(body))
        except wire.WireError as exc:
            log.info("%s: bad request: %s", verb, exc)
            resp = _json({"Error": str(exc)}, 400)
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

    async def do_filter(body: bytes) -> Any:
        return ext.filter(body)

    async def do_prioritize(body: bytes) -> Any:
        return ext.prioritize(body)

    async def do_explain(body: bytes) -> Any:
        try:
            args = wire.ExplainArgs.model_validate_json(body or b"null")
        except ValidationError as exc:
            raise wire.WireError(_validation_message(exc)) from None
        return ext.explain(args.pod, args.node, args.candidates)

    async def filter_route(request: Request) -> Response:
        return await run_verb("filter", request, do_filter)

    async def prioritize_route(request: Request) -> Response:
        return await run_verb("prioritize", request, do_prioritize)

    async def bind_route(request: Request) -> Response:
        return await run_verb("bind", request, ext.bind)

    async def explain_route(request: Request) -> Response:
        return await run_verb("explain", request, do_explain)

    for prefix in ("", "/scheduler"):
        app.add_api_route(f"{prefix}/filter", filter_route, methods=["POST"], include_in_schema=prefix == "")
        app.add_api_route(f"{prefix}/prioritize", prioritize_route, methods=["POST"], include_in_schema=prefix == "")
        app.add_api_route(f"{prefix}/bind", bind_route, methods=["POST"], include_in_schema=prefix == "")
    app.add_api_route("/explain", explain_route, methods=["POST"])

    @app.get("/healthz")
    async def healthz() -> Response:
        if ext.cache.refresher_stopped:
            return _json({"status": "error", "reason": "the telemetry refresh task has stopped"}, 503)
        return _json({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        r = ext.cache.readiness()
        return _json({"ready": r.ready, "reason": r.reason}, 200 if r.ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        ext.cache.update_metrics()
        m.assumed.set(len(ext.ledger))
        return Response(content=generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return _json({"Error": _validation_message(exc)}, 400)
