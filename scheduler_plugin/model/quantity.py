"""Kubernetes resource quantities (``20Gi``, ``500m``, ``1.5e9``) parsed exactly.

Only the parsing lives here; it is pure and raises :class:`QuantityError` with the offending text.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

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
_RE = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$")


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(text: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity into an exact :class:`~decimal.Decimal`."""
    if isinstance(text, bool):
        raise QuantityError(f"{text!r} is not a quantity")
    if isinstance(text, int):
        return Decimal(text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise QuantityError(f"{text!r} is not a finite quantity")
        return Decimal(repr(text))
    s = str(text).strip()
    m = _RE.match(s)
    if not m:
        raise QuantityError(f"{text!r} is not a quantity (expected e.g. 20Gi, 512Mi, 1.5, 500m)")
    number, exponent, suffix = m.groups()
    try:
        value = Decimal(number)
        if exponent:
            value = value * (Decimal(10) ** int(exponent[1:]))
    except (InvalidOperation, ValueError) as exc:  # pragma: no cover - the regex already guards this
        raise QuantityError(f"{text!r} is not a quantity") from exc
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    return value * _DECIMAL[suffix or ""]


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
    return int((value * 1000).to_integral_value(rounding="ROUND_CEILING"))


def format_gib(n_bytes: float) -> str:
    """Human text for operators: ``12.0 GiB``."""
    return f"{n_bytes / 2**30:.1f} GiB"
