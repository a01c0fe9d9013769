"""Reading a user's text file (policy, fleet, pod, trace) with one clear error instead of a traceback.

:func:`read_text` reads UTF-8 (a leading byte-order mark is accepted) and raises :class:`TextFileError`, a
``ValueError`` whose message names what the file is, its path and the problem: unreadable (``No such file or
directory``, ``Permission denied``, a directory) or not UTF-8 text (the first bad byte and its offset).
"""

from __future__ import annotations

from pathlib import Path


class TextFileError(ValueError):
    """A file that cannot be read as UTF-8 text; the message names the file and the problem."""


def decode_problem(exc: UnicodeDecodeError) -> str:
    """``not UTF-8 text (byte 0xff at offset 12)``: what a :class:`UnicodeDecodeError` means, in one phrase."""
    bad = exc.object[exc.start : exc.start + 1]
    byte = f"byte 0x{bad.hex()}" if bad else "a truncated character"
    return f"not UTF-8 text ({byte} at offset {exc.start})"


def read_text(path: str | Path, what: str = "file") -> str:
    """The text of ``path`` decoded as UTF-8. ``what`` names the file in errors (``"policy file"``)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise TextFileError(f"{what} {p}: cannot read ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TextFileError(f"{what} {p}: {decode_problem(exc)}") from None


def first_undecodable(*paths: str | Path | None) -> str | None:
    """``<path>: not UTF-8 text (...)`` for the first of ``paths`` that is readable but not UTF-8, else None. For the
    edge of a command whose file readers let a :class:`UnicodeDecodeError` through without naming the file."""
    for p in paths:
        if p is None or str(p) == "":
            continue
        try:
            Path(p).read_bytes().decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            return f"{p}: {decode_problem(exc)}"
        except OSError:
            continue
    return None
