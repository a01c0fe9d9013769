"""Output of every kelvin command: one console factory, one way to fail, one set of log levels.

On a terminal, commands print with rich (colours, tables sized to the window, live displays). When the output is
piped or captured (CI logs, ``| less``, ``> file``), nothing is wrapped or truncated: :func:`console` returns a
console as wide as the longest line needs and soft-wrapped text, so an error is one line and a table keeps every
cell whole. Typer's own usage errors are printed plainly (:func:`markup_mode`), not in a box cut at 80 columns.
Errors are one line on stderr, ``error: <what went wrong>`` (:func:`fail`).
"""

from __future__ import annotations

import enum
import logging
import sys
from typing import Annotated, Literal, NoReturn

import typer
from rich.console import Console

#: Width of a console that is not a terminal: wide enough that no table row or message is ever wrapped.
UNWRAPPED_WIDTH = 10_000


def is_terminal(*, stderr: bool = False) -> bool:
    """Whether stdout (or stderr) really is an interactive terminal. Not rich's ``is_terminal``: ``FORCE_COLOR``
    (set by many CI systems) makes that true for a pipe, and rich then wraps everything at 80 columns."""
    stream = sys.stderr if stderr else sys.stdout
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


def console(*, stderr: bool = False) -> Console:
    """A rich console for stdout (or stderr): the terminal's own on a terminal; otherwise one that never wraps or
    truncates (tables as wide as their cells, text on one line)."""
    if is_terminal(stderr=stderr):
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=UNWRAPPED_WIDTH, soft_wrap=True, highlight=False)


def markup_mode() -> Literal["rich"] | None:
    """Typer's ``rich_markup_mode``: rich help and error boxes on a terminal, plain click output otherwise (a boxed
    usage error is cut into 80-column pieces when piped)."""
    return "rich" if is_terminal(stderr=True) else None


def help_settings() -> dict[str, int]:
    """Click context settings for ``--help``: the terminal's width on a terminal; off one, wide enough that no
    option's help is wrapped and no command's description in a command list is cut short with ``...``."""
    if is_terminal():
        return {}
    return {"max_content_width": UNWRAPPED_WIDTH, "terminal_width": UNWRAPPED_WIDTH}


def one_line(message: object) -> str:
    """``message`` with every run of whitespace (newlines included) made one space."""
    return " ".join(str(message).split())


#: Exit status of a server whose startup failed, as ``uvicorn.run`` uses (``kelvin extender``, ``kelvin operator``).
STARTUP_FAILURE = 3


def fail(message: object, code: int = 2) -> NoReturn:
    """End the command: ``error: <message>`` as one line on stderr, exit status ``code`` (2: bad input)."""
    typer.echo(f"error: {one_line(message)}", err=True)
    raise typer.Exit(code)


class LogLevel(enum.StrEnum):
    """``--log-level`` values (case-insensitive on the command line)."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"
    critical = "critical"


LogLevelOption = Annotated[
    LogLevel,
    typer.Option(
        case_sensitive=False,
        metavar="LEVEL",
        help="Log level: debug, info, warning, error or critical (any case).",
    ),
]
"""The one ``--log-level`` option of every long-running command: ``log_level: LogLevelOption = LogLevel.info``."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Libraries that log every request at INFO: httpx writes one line per Prometheus query, exporter scrape and API
#: call (``HTTP Request: GET http://prometheus:9090/api/v1/query?... "HTTP/1.1 200 OK"``). Held at WARNING; kelvin
#: logs its own per-query lines at DEBUG.
QUIET_LOGGERS = ("httpx", "httpcore")


def setup_logging(level: LogLevel) -> None:
    """The logging of every long-running command: ``level`` for kelvin, WARNING for :data:`QUIET_LOGGERS`."""
    logging.basicConfig(level=level.value.upper(), format=LOG_FORMAT)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelNamesMapping()[level.value.upper()]))
