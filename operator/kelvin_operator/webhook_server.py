"""kopf's HTTPS webhook server with kelvin's edges: what it answers besides admission decisions, and how it fails.

* A body that is not an AdmissionReview kelvin can judge (:func:`kelvin_operator.review.read_review`) is answered
  HTTP 400 with a ``Status`` naming the field, before any handler runs.
* A handler that *fails* (an exception, not a denial) is the webhook failing, not a verdict on the pod: kopf would
  answer ``allowed: false`` with code 500, a denial no ``failurePolicy`` can undo. It is answered HTTP 500 instead
  (kopf has logged the traceback at ERROR), so the API server applies the webhook's ``failurePolicy``: ``Ignore``
  (the chart's default) admits the pod unchanged and unchecked, ``Fail`` refuses it. Both webhooks do this: which
  failure is acceptable is the cluster admin's choice, made once in the webhook configuration. Denials of the
  validation (``kopf.AdmissionError``, code 400) stay HTTP 200 ``allowed: false``.
* A path that names no kelvin webhook is answered 404 (kopf would run no handler and admit the pod).
* The listening address is tried before kopf binds it (kopf binds with ``SO_REUSEPORT``, so a second operator on
  the same host would silently share the port): a port in use, an address that cannot be bound or a certificate
  that cannot be loaded is reported once through ``on_failure`` (the CLI prints one ``error:`` line and exits), not
  as kopf's traceback of a failed root task.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Collection
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf

from scheduler_plugin.model.pod import pod_key

from .review import ReviewError, read_review

log = logging.getLogger("kelvin.operator")

#: The settings that place the webhook server, as an error names them.
LISTEN_SETTING = (
    "webhook.addr/webhook.port (KELVIN_OPERATOR_WEBHOOK__ADDR, KELVIN_OPERATOR_WEBHOOK__PORT, --webhook-port)"
)
CERT_SETTING = (
    "webhook.certfile/webhook.pkeyfile (KELVIN_OPERATOR_WEBHOOK__CERTFILE, KELVIN_OPERATOR_WEBHOOK__PKEYFILE)"
)


class WebhookStartError(RuntimeError):
    """The webhook server cannot start; the message names the setting."""


def _status(code: int, reason: str, message: str) -> aiohttp.web.Response:
    """A Kubernetes ``Status`` object: what the API server reports of a webhook answering other than 200."""
    body = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason}
    return aiohttp.web.json_response({**body, "message": message}, status=code)


def _object_name(req: dict[str, Any]) -> str:
    """``namespace/name`` of the reviewed object, for the log."""
    obj = req.get("object") or req.get("oldObject")
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return "?"
    return pod_key(meta.get("namespace") or req.get("namespace"), meta.get("name") or req.get("name"))


def listen_problem(addr: str | None, port: int, setting: str = LISTEN_SETTING) -> str | None:
    """Why ``addr:port`` cannot be listened on now (``None``: it can), naming ``setting``. Binds and releases a
    socket for every address ``addr`` resolves to (all interfaces when empty), as asyncio's server does."""
    shown = f"{addr or '*'}:{port}"
    try:
        infos = socket.getaddrinfo(addr or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        return f"{setting}: cannot resolve {addr!r}: {exc}"
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"{setting}: cannot listen on {shown}: the port {port} is in use"
            return f"{setting}: cannot listen on {shown}: {exc.strerror or exc}"
    return None


class AdmissionServer(kopf.WebhookServer):
    """``kopf.WebhookServer`` that checks the envelope, answers a failing handler HTTP 500 and reports a failed start
    to ``on_failure`` (``None``: raise :class:`WebhookStartError`)."""

    def __init__(
        self,
        *,
        on_failure: Callable[[str], None] | None = None,
        webhooks: Collection[str] = (),
        **kwargs: Any,
    ) -> None:
        """``webhooks``: the handler ids served (the paths); a request to any other path is answered 404 (kopf
        would run no handler and admit it: a webhook configuration with a mistyped path would check nothing)."""
        super().__init__(**kwargs)
        self.on_failure = on_failure
        self.webhooks = tuple(webhooks)

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        problem = self.certificate_problem() or (listen_problem(self.addr, self.port) if self.port else None)
        if problem is None:
            try:
                async for client_config in super().__call__(fn):
                    yield client_config
                return
            except ssl.SSLError as exc:  # the files changed since they were tried (kopf reloads them)
                problem = f"{CERT_SETTING}: cannot load {self.certfile} / {self.pkeyfile}: {exc}"
            except OSError as exc:
                problem = f"{LISTEN_SETTING}: cannot listen on {self.addr or '*'}:{self.port}: {exc.strerror or exc}"
        if self.on_failure is None:
            raise WebhookStartError(problem)
        log.error("the admission webhook server cannot start: %s", problem)
        self.on_failure(problem)
        await asyncio.Event().wait()  # the operator stops and cancels this task

    def certificate_problem(self) -> str | None:
        """Why the serving certificate cannot be loaded (``None``: it can, or kopf is to make one)."""
        if self.certfile is None:
            return None
        for path in (self.certfile, self.pkeyfile):
            if path is not None and not Path(path).is_file():
                return f"{CERT_SETTING}: {path} is not a file"
        try:
            ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                self.certfile, self.pkeyfile, self.password
            )
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            return f"{CERT_SETTING}: cannot load {self.certfile} / {self.pkeyfile}: {exc}"
        return None

    # kopf declares _serve a staticmethod but calls it as ``self._serve(fn, request)``: the served ids need ``self``
    async def _serve(self, fn: kopf.WebhookFn, request: aiohttp.web.Request) -> aiohttp.web.Response:  # type: ignore[override]
        webhook = request.match_info.get("id")
        if self.webhooks and webhook not in self.webhooks:
            served = ", ".join(f"/{w}" for w in self.webhooks)
            return _status(404, "NotFound", f"no kelvin admission webhook at /{webhook}; served: {served}")
        try:
            review = read_review(await request.read())
        except ReviewError as exc:
            log.warning("admission webhook %s: refused a request from %s: %s", webhook, request.remote, exc)
            return _status(400, "BadRequest", f"kelvin admission webhook {webhook}: {exc}")
        req = review["request"]
        what = f"{req['operation']} {_object_name(req)} (uid {req['uid']})"
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        try:
            request_: Any = review  # kopf's Request (a TypedDict it does not export)
            response = await fn(request_, webhook=webhook, sslpeer=sslpeer, headers=dict(request.headers))
        except Exception as exc:
            log.exception("admission webhook %s failed on %s", webhook, what)
            return _status(500, "InternalError", f"kelvin admission webhook {webhook} failed: {exc!r}")
        answer = response["response"]
        status = answer.get("status") or {}
        if not answer.get("allowed") and int(status.get("code") or 500) >= 500:
            message = status.get("message", "")
            log.error(
                "admission webhook %s failed on %s: %s; answered HTTP 500, so the API server applies the webhook's "
                "failurePolicy",
                webhook,
                what,
                message,
            )
            return _status(500, "InternalError", f"kelvin admission webhook {webhook} failed: {message}")
        return aiohttp.web.json_response(response)
