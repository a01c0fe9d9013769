"""The ``hotness`` filter: keep pods off nodes the operator is about to drain.

The operator taints a node ``kelvin.dev/thermal=hot`` when any GPU meets the entry rule of
:mod:`scheduler_plugin.hotness` (at or above ``hot_celsius``, thermally throttling, or rising towards its slowdown
threshold within the horizon). kube-scheduler keeps new pods off the tainted node; this filter applies the very same
rule to the telemetry snapshot, so that between the rule firing and the taint landing (one operator cycle) the
scheduler does not fill a node that is about to be drained. It reads the shared ``hotness:`` section of the policy
file, so extender and operator can never disagree on what "hot" means.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..hotness import HotnessConfig, trigger_mask
from ..model import THERMAL_THROTTLE_MASK, FleetArrays, GpuRequest
from ..model.snapshot import IndexKey
from .base import BoolA, CycleContext, IntA, Rejection
from .reasons import NodeHot, NodeThrottling, NodeWarming

#: The columns :func:`~scheduler_plugin.hotness.trigger_mask` reads (telemetry, never written in place).
HOT_COLUMNS = ("temp", "trend", "throttle", "slowdown", "gpu_present")


class HotNodeFilter:
    name = "hotness"

    def __init__(self, cfg: HotnessConfig, enabled: bool = True) -> None:
        self.cfg = cfg
        self.enabled = enabled
        self._hot_key = IndexKey[BoolA]("hotness.hot_gpus", HOT_COLUMNS)
        self._hot_rows_key = IndexKey[BoolA]("hotness.hot_rows", HOT_COLUMNS)
        self._reasons_key = IndexKey[npt.NDArray[np.object_]]("hotness.reasons", (*HOT_COLUMNS, "gpu_index"))

    def _trigger(self, fleet: FleetArrays) -> BoolA:
        return trigger_mask(fleet, self.cfg)

    def _hot_gpus(self, fleet: FleetArrays) -> BoolA:
        """(N, G) GPUs meeting the entry rule; in the snapshot index (once per snapshot)."""
        return fleet.derive(self._hot_key, self._trigger)

    def _hot_rows(self, fleet: FleetArrays) -> BoolA:
        """(N,) nodes with a GPU meeting the entry rule; in the snapshot index (once per snapshot)."""
        return fleet.derive(self._hot_rows_key, lambda f: np.asarray(self._hot_gpus(f).any(axis=1), dtype=np.bool_))

    def prepare(self, fleet: FleetArrays) -> None:
        if self.enabled:
            self._hot_reasons(fleet)  # the hot GPUs, and the hot rows' reasons
            self._hot_rows(fleet)

    def filter(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> BoolA:
        if not self.enabled or not req.wants_gpu:
            return np.ones(idx.shape[0], dtype=np.bool_)
        return ~self._hot_rows(fleet)[idx]

    def reasons(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext) -> list[Rejection]:
        """One :class:`Rejection` per row (only rejected rows are asked for). They depend on the snapshot only, not
        on the pod: the hot rows' are worded once per snapshot (in its index) and looked up by row."""
        rows = np.asarray(rows, dtype=np.int64)
        out: list[Rejection | None] = self._hot_reasons(fleet)[rows].tolist()
        if None in out:  # a row that is not hot (explain asks for any row): worded from its first GPU
            cool = np.flatnonzero(np.fromiter((r is None for r in out), dtype=np.bool_, count=len(out)))
            for i, rej in zip(cool.tolist(), self._worded(fleet, rows[cool]), strict=True):
                out[i] = rej
        return [r for r in out if r is not None]

    def _hot_reasons(self, fleet: FleetArrays) -> npt.NDArray[np.object_]:
        """(N,) the :class:`Rejection` of each hot row, None for the others; in the snapshot index."""
        return fleet.derive(self._reasons_key, self._word_hot_rows)

    def _word_hot_rows(self, fleet: FleetArrays) -> npt.NDArray[np.object_]:
        out = np.full(fleet.n_nodes, None, dtype=object)
        hot_rows = np.flatnonzero(self._hot_gpus(fleet).any(axis=1))
        out[hot_rows] = self._worded(fleet, hot_rows)
        return out

    def _worded(self, fleet: FleetArrays, rows: IntA) -> list[Rejection]:
        """The figures of every row gathered with numpy; rows worded alike share one object."""
        hot = self._hot_gpus(fleet)[rows]
        j = hot.argmax(axis=1)  # the first hot GPU of each row
        at = (rows, j)
        worded: dict[tuple[object, ...], Rejection] = {}
        out = []
        for key in zip(
            hot.sum(axis=1).tolist(),
            fleet.gpu_index[at].tolist(),
            fleet.temp[at].tolist(),
            (fleet.throttle[at] & THERMAL_THROTTLE_MASK).tolist(),
            fleet.trend[at].tolist(),
            strict=True,
        ):
            rej = worded.get(key)
            if rej is None:
                rej = worded[key] = self._word(*key)
            out.append(rej)
        return out

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> Rejection:
        return self.reasons(req, fleet, np.array([row], dtype=np.int64), ctx)[0]

    def _word(self, n_hot: int, gpu: int, temp: float, throttle: int, trend: float) -> Rejection:
        """Why a node is hot, from its first hot GPU (``n_hot`` of its GPUs meet the rule)."""
        others = max(n_hot - 1, 0)
        if temp >= self.cfg.hot_celsius:
            return NodeHot(gpu, others, temp, self.cfg.hot_celsius)
        if self.cfg.throttling_is_hot and throttle:
            return NodeThrottling(gpu, others)
        return NodeWarming(gpu, others, temp, trend, self.cfg.horizon_s)
