"""Shared normalisation of raw scores to 0..MAX_EXTENDER_PRIORITY. The all-equal and non-finite cases live here once."""

from __future__ import annotations

import numpy as np

from .base import MAX_EXTENDER_PRIORITY, FloatA


def finite(x: FloatA, *, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> FloatA:
    """``np.nan_to_num(x, ...)``, and ``x`` itself when every value is finite already (the common case; the
    check costs a fraction of ``nan_to_num``'s own overhead, which the simulator paid five times per pod)."""
    if bool(np.isfinite(x).all()):
        return x
    return np.nan_to_num(x, nan=nan, posinf=posinf, neginf=neginf)


def minmax(raw: FloatA, *, reverse: bool = False) -> FloatA:
    """Scale so the best candidate gets MAX and the worst 0. All equal -> all MAX (nobody is worse).

    NaN or -inf (no data) gets 0. ``reverse`` means lower raw is better.
    """
    x = np.asarray(raw, dtype=np.float64)
    out = np.zeros_like(x)
    ok = np.isfinite(x)
    if not ok.any():
        return out
    v = -x[ok] if reverse else x[ok]
    lo, hi = float(v.min()), float(v.max())
    if hi - lo <= 1e-12:
        out[ok] = MAX_EXTENDER_PRIORITY
    else:
        out[ok] = (v - lo) / (hi - lo) * MAX_EXTENDER_PRIORITY
    return out


def unit(raw: FloatA) -> FloatA:
    """An absolute score in 0..1 to 0..MAX (clipped; NaN -> 0). For policies whose raw value means the same on
    every node (thermal headroom), so a hot fleet scores low everywhere instead of being stretched to 0..10."""
    # fmax/fmin skip NaN: NaN -> 0, inf -> 1, -inf -> 0, as nan_to_num then clip give (two ufuncs instead of a
    # finiteness check and clip's Python-level dispatch: three scores of every simulated arrival end here)
    x = np.asarray(raw, dtype=np.float64)
    return np.fmin(np.fmax(x, 0.0), 1.0) * MAX_EXTENDER_PRIORITY
