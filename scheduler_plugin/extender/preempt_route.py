"""``POST /preempt`` and ``/scheduler/preempt``: body read, limits and errors as for the other verbs (``routes.py``'s
``run_verb``); parsed by :func:`.preempt_wire.parse_preemption`, answered by :class:`.preempt.PreemptVerb`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from .preempt import PreemptVerb
from .preempt_wire import PreemptionArgs, parse_preemption

if TYPE_CHECKING:
    from .service import Extender

RunVerb = Callable[[str, Request, Callable[[bytes], Awaitable[Any]]], Awaitable[Response]]


def install_preempt_route(app: FastAPI, ext: Extender, run_verb: RunVerb) -> None:
    from .routes import decode  # routes imports this module: decode is read at install time

    verb = PreemptVerb(ext)
    max_names = ext.settings.max_node_names

    def parse(body: bytes) -> PreemptionArgs:
        return parse_preemption(body, max_node_names=max_names)

    async def do_preempt(body: bytes) -> Any:
        args = await decode(parse, body)
        async with ext.turn:
            return verb(args)

    async def preempt_route(request: Request) -> Response:
        return await run_verb("preempt", request, do_preempt)

    for prefix in ("", "/scheduler"):
        app.add_route(f"{prefix}/preempt", preempt_route, methods=["POST"], include_in_schema=False)
