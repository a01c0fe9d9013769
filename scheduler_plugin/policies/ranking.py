"""The framework's filter and score steps over many rows at once, for callers that choose the node themselves (the
simulators): which rows pass every filter, and the value each row is ranked on.

They run the :class:`~.framework.Framework`'s own plugins on its own view of the fleet (the assumed-ledger overlay);
no second filter loop or score combination exists beside them. ``ctx`` is one the framework made
(:meth:`Framework.context <.framework.Framework.context>`).
"""

from __future__ import annotations

import numpy as np

from ..model import FleetArrays, GpuRequest
from .base import CycleContext, FloatA, IntA
from .framework import Framework


def feasible(fw: Framework, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> IntA:
    """The rows, in the order given, that pass every filter of ``fw``: :meth:`Framework.filter
    <.framework.Framework.filter>`'s ``passed`` without wording a reason for every rejected row (a placement loop
    needs none, and wording them costs more than filtering)."""
    rows = np.asarray(rows, dtype=np.int64)
    if not req.wants_gpu:
        return rows
    view = fw.view(fleet, ctx)
    for f in fw.filters:
        if rows.size == 0:
            break
        rows = rows[f.filter(req, view, rows, ctx)]
    return rows


def rank(
    fw: Framework, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext, *, raw: bool = False
) -> FloatA:
    """What ``rows`` are ordered by (higher is better): the framework's weighted mean of normalised scores before
    the extender rounds it (:meth:`Framework.prioritize <.framework.Framework.prioritize>`'s float; a pod without
    GPUs by the framework's ``cpu_only`` ranking, 0 without one).

    With ``raw``, the raw score of the framework's only score plugin instead, for every pod: the FGD paper defines
    its baselines on their raw scores (its normalisation may bin them, e.g. ``fgd``'s to 0..10)."""
    rows = np.asarray(rows, dtype=np.int64)
    if raw:
        if len(fw.scorers) != 1:
            raise ValueError(f"raw ranking needs exactly one score plugin, the framework has {len(fw.scorers)}")
        view = fw.view(fleet, ctx)
        return np.asarray(fw.scorers[0].plugin.score(req, view, rows, ctx), dtype=np.float64)
    _, combined = fw.prioritize(req, fleet, rows, ctx)
    return combined


def tied_best(rows: IntA, score: FloatA) -> IntA:
    """The rows whose score is the best one, up to float noise (relative 1e-9); every row when no score is finite."""
    best = float(np.max(score))
    if not np.isfinite(best):
        return rows
    return rows[score >= best - 1e-9 * max(1.0, abs(best))]
