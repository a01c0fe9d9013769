"""The errors a verb answers with a status of their own: one base class, :class:`HttpError`, carrying the status, the
log level and whether the connection is closed after the reply. ``routes.py`` answers any of them with
``{"Error": "<message>"}`` and that status; anything else a verb raises is an unexpected failure (the verb's own
error reply, see ``verbs.Verb.on_error``).
"""

from __future__ import annotations

import logging
from typing import ClassVar


class HttpError(Exception):
    """A request kelvin refuses; the message names the field or the limit and the problem."""

    status: ClassVar[int] = 400
    """The HTTP status of the reply."""
    close: ClassVar[bool] = False
    """Close the connection after the reply (its body was not read, or not all of it)."""
    log_level: ClassVar[int] = logging.INFO
    what: ClassVar[str] = "bad request"
    """How the log line names the refusal: ``<verb>: <what>: <message>``."""

    def log_line(self, verb: str) -> str:
        return f"{verb}: {self.what}: {self}"


class WireError(HttpError, ValueError):
    """A request body kelvin cannot read; the message names the field and the problem (HTTP 400)."""


class TooLarge(WireError):
    """A request over one of the configured limits (HTTP 413); the message names the setting. kube-scheduler shows
    only the status code on the pod, so the reason is logged as a warning."""

    status = 413
    close = True  # the rest of an unread body is not worth reading
    log_level = logging.WARNING
    what = "request refused"


class UnsupportedEncoding(WireError):
    """A body sent with a ``Content-Encoding`` kelvin does not decode (HTTP 415, naming it)."""

    status = 415
    close = True  # the body was not read
    what = "request refused"


class ClientGone(HttpError):
    """The client gave up (kube-scheduler's httpTimeout) or went away while sending the body: nothing failed inside
    kelvin and nobody reads the answer. Counted under nginx's 499 ("client closed request"), not as an error."""

    status = 499

    def __init__(self) -> None:
        super().__init__("client disconnected")

    def log_line(self, verb: str) -> str:
        return f"{verb}: the client disconnected before the request was read"


def body_too_large(size: str, limit: int) -> TooLarge:
    return TooLarge(
        f"request body {size} bytes is over max_body_bytes ({limit} bytes, env KELVIN_MAX_BODY_BYTES); raise the "
        "limit if your scheduler sends requests this big (nodeCacheCapable: false with many nodes)"
    )


def too_many_names(field: str, count: int, limit: int) -> TooLarge:
    return TooLarge(
        f"{field}: {count} nodes, more than max_node_names ({limit}, env KELVIN_MAX_NODE_NAMES); "
        "raise the limit if your scheduler really sends that many"
    )
