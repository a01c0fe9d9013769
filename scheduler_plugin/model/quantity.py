"""Kubernetes resource quantities (``20Gi``, ``500m``, ``1.5e9``) parsed exactly.

Only the parsing lives here; it is pure and raises :class:`QuantityError` with the offending text.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, DecimalException

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
# ASCII digits only, as Kubernetes' own parser: ``\d`` of a ``str`` pattern would also take "２０" or "٥٠٠" (and
# Decimal() reads them), so a value the API server would refuse could pass here.
_RE = re.compile(
    r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?", re.ASCII
)


MAX_INT64 = 2**63 - 1
MAX_QUANTITY = Decimal(MAX_INT64)
"""The largest magnitude accepted, in the quantity's own unit (Kubernetes keeps quantities in int64 too). A larger
value (``1e400``, ``9e18`` cores in millicores) would overflow the int64/float arithmetic that consumes it."""
_MAX_TEXT = 64
_MAX_EXPONENT = 40


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def _bounded(value: Decimal, text: object) -> Decimal:
    if abs(value) > MAX_QUANTITY:
        raise QuantityError(f"{text!r} is too large (at most {MAX_QUANTITY:.3e})")
    return value


def parse_quantity(text: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity into an exact :class:`~decimal.Decimal` of magnitude at most ``MAX_QUANTITY``."""
    if isinstance(text, bool):
        raise QuantityError(f"{text!r} is not a quantity")
    if isinstance(text, int):
        return _bounded(Decimal(text), text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise QuantityError(f"{text!r} is not a finite quantity")
        return _bounded(Decimal(repr(text)), text)
    s = str(text).strip()
    if len(s) > _MAX_TEXT:
        raise QuantityError(f"{s[:20]!r}... is not a quantity (longer than {_MAX_TEXT} characters)")
    m = _RE.fullmatch(s)
    if not m:
        raise QuantityError(f"{text!r} is not a quantity (expected e.g. 20Gi, 512Mi, 1.5, 500m)")
    number, exponent, suffix = m.groups()
    if exponent and abs(int(exponent[1:])) > _MAX_EXPONENT:
        raise QuantityError(f"{text!r}: exponent out of range (at most e{_MAX_EXPONENT})")
    try:
        value = Decimal(number)
        if exponent:
            value = value * (Decimal(10) ** int(exponent[1:]))
    except (DecimalException, ValueError) as exc:  # pragma: no cover - the regex and bounds already guard this
        raise QuantityError(f"{text!r} is not a quantity") from exc
    if suffix in _BINARY:
        return _bounded(value * _BINARY[suffix], text)
    return _bounded(value * _DECIMAL[suffix or ""], text)


def parse_bytes(text: str | int | float) -> int:
    """A memory quantity in whole bytes (rounded up, as the kubelet does)."""
    value = parse_quantity(text)
    if value < 0:
        raise QuantityError(f"{text!r} is negative")
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def parse_cpu_milli(text: str | int | float) -> int:
    """A CPU quantity in millicores (``2`` -> 2000, ``500m`` -> 500)."""
    value = parse_quantity(text)
    if value < 0:
        raise QuantityError(f"{text!r} is negative")
    return int(_bounded(value * 1000, text).to_integral_value(rounding="ROUND_CEILING"))


def format_gib(n_bytes: float) -> str:
    """Human text for operators: ``12.0 GiB``."""
    return f"{n_bytes / 2**30:.1f} GiB"
