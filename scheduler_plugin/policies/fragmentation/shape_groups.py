"""The workload's GPU shapes as the measure F needs them: grouped by what their fit test reads, ordered by threshold.

F_n(M) sums, per threshold t (a distinct per-GPU share), the probabilities of the shapes of share t that fit the node,
and multiplies each sum by the node's free thousandths on GPUs with at least t free. Shapes that differ only in their
model list (a pinned pod's shape is a shape of its own) fit alike apart from the node's GPU model, so they are tested
once, as a *group*: the group's probability on a node is the summed probability of its members that admit the node's
model (a per-model table, gathered per node). An unrestricted workload's groups are its shapes, one each.

The sums are plain additions in shape order, one group after another (every threshold's groups are gathered into a
block padded with zeros, :attr:`ShapeGroups.pad`, and the block's rows are added in turn: what ``np.add.reduce`` over
the leading axis of each threshold's groups gives, bit for bit, in one gather and a few additions instead of one
reduction per threshold): every row's F is computed from that row alone, so it does not depend on how many rows are
computed together (a BLAS matrix product's rounding did: a one-row product took another path than a many-row one,
whose sums these equal bit for bit), and no BLAS threads are involved.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ...model import FleetArrays
from ..base import BoolA, FloatA, IntA
from .workload import Workload

_CACHE_SIZE = 16
_FLEETS = 4
_FEW_ROWS = 64
"""Rows up to which :meth:`ShapeGroups.fit_mass` adds in one padded gather (faster for a few rows, slower for many:
2.4 times faster for one row of the default trace's 35 shapes, 3 times slower for 1,213)."""


@dataclass(frozen=True, slots=True)
class ShapeGroups:
    """One workload's GPU shapes in groups (members: equal share, CPU, GPU count and host memory), ordered by
    threshold, then by first member. Arrays of length G, per group."""

    members: tuple[IntA, ...]
    """Per group: its shapes (indices into the workload, ascending)."""
    bounds: IntA
    """(T + 1,) the groups of threshold t are ``bounds[t]:bounds[t + 1]``."""
    threshold: IntA
    """Each group's index in ``Workload.thresholds``."""
    cpu_milli: IntA
    count: IntA
    host_memory: IntA
    prob: FloatA
    """(G, 1) the group's probability when every member admits every node (unrestricted workloads)."""
    restricted: bool
    """Some shape restricts GPU models: the probability is per node (:meth:`node_mass`)."""
    of_shape: IntA
    """(M,) each shape's group (CPU-only shapes: ``G``, one past the last group)."""
    pad: IntA
    """(K, T) the groups of threshold t in order down column t (K: the most groups of one threshold), padded with
    ``G`` (a zero row): :meth:`fit_mass` adds row after row."""
    _node_mass: list[tuple[tuple[str, ...], npt.NDArray[np.int32], FloatA]] = field(default_factory=list)
    _access: dict[tuple[str, ...], BoolA] = field(default_factory=dict)
    """:meth:`Workload.access_table` per fleet model list, shared by the groups of every workload of the same shapes
    (the table reads the shapes' model lists only)."""

    @classmethod
    def of(cls, w: Workload) -> ShapeGroups:
        assert w.host_memory is not None  # set by Workload.__post_init__
        keys: dict[tuple[int, int, int, int], list[int]] = {}
        for m in np.flatnonzero(w.gpu_shapes).tolist():
            key = (int(w.share_index[m]), int(w.cpu_milli[m]), int(w.count[m]), int(w.host_memory[m]))
            keys.setdefault(key, []).append(m)
        ordered = sorted(keys.items(), key=lambda kv: (kv[0][0], kv[1][0]))  # by threshold, then first member
        members = tuple(np.array(ms, dtype=np.int64) for _, ms in ordered)
        first = np.array([ms[0] for _, ms in ordered], dtype=np.int64)
        threshold = np.array([k[0] for k, _ in ordered], dtype=np.int64)
        bounds = np.searchsorted(threshold, np.arange(len(w.thresholds) + 1), side="left").astype(np.int64)
        prob = _group_prob(w, members)
        of_shape = np.full(len(w), len(members), dtype=np.int64)
        for g, ms in enumerate(members):
            of_shape[ms] = g
        sizes = np.diff(bounds)
        pad = np.full((max(int(sizes.max(initial=0)), 1), len(sizes)), len(members), dtype=np.int64)
        for t, (lo, hi) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)):
            pad[: hi - lo, t] = np.arange(lo, hi)
        return cls(
            members,
            bounds,
            threshold,
            w.cpu_milli[first],
            w.count[first],
            np.asarray(w.host_memory, dtype=np.int64)[first],
            prob.reshape(-1, 1),
            not w.unrestricted,
            of_shape,
            pad,
        )

    def like(self, w: Workload) -> ShapeGroups:
        """The groups of ``w``, a workload of the same shapes as the one these were built for (:func:`_structure`)
        with other probabilities: what :meth:`of` gives, without grouping the shapes again."""
        return dataclasses.replace(self, prob=_group_prob(w, self.members), _node_mass=[])

    def mass(self, acc: BoolA, w: Workload) -> FloatA:
        """(P, G) per row of ``acc`` ((P, M): shape m admits the row's node) each group's summed probability over its
        admitting members, added in member order."""
        out = np.zeros((len(acc), len(self.members)), dtype=np.float64)
        for g, ms in enumerate(self.members):
            col = out[:, g]
            for m in ms.tolist():
                col += np.where(acc[:, m], w.prob[m], 0.0)
        return out

    def node_mass(self, w: Workload, fleet: FleetArrays) -> FloatA:
        """(N, G) :meth:`mass` per node of ``fleet`` (computed per GPU model, gathered by the node's first GPU's
        model). Cached for the last few fleets' models (``model_id`` is never written in place, as in
        :meth:`Workload.node_access`; a snapshot and the copies made from it alternate)."""
        cached = self._node_mass
        for models, model_id, per_node in cached:
            if model_id is fleet.model_id and models == fleet.models:
                return per_node
        access = self._access.get(fleet.models)
        if access is None:
            access = self._access[fleet.models] = w.access_table(fleet.models)
        table = self.mass(access, w)
        per_node = np.asarray(table[fleet.model_id[:, 0]], dtype=np.float64)  # model id -1 (no GPU) -> the last row
        cached[:] = [(fleet.models, fleet.model_id, per_node), *cached[: _FLEETS - 1]]
        return per_node

    def fit_mass(self, gpus_at_least: IntA, cpu: IntA, mass: FloatA | None, mem: IntA | None) -> FloatA:
        """(P, T) per row: the summed probability of the fitting shapes of each threshold. ``gpus_at_least``: (P, T)
        GPUs with at least each threshold free; ``cpu``: (P,) free millicores; ``mass``: (P, G) :meth:`mass` of the
        rows, ``None`` when unrestricted; ``mem``: (P,) free host memory, ``None`` when not checked."""
        ok = cpu[None, :] >= self.cpu_milli[:, None]
        have = np.ascontiguousarray(gpus_at_least.T)[self.threshold]  # (G, P): GPUs free at each group's threshold
        ok &= have >= self.count[:, None]
        if mem is not None:
            ok &= mem[None, :] >= self.host_memory[:, None]
        vals = np.where(ok, self.prob if mass is None else mass.T, 0.0)
        p, (k, t) = len(cpu), self.pad.shape
        if p > _FEW_ROWS:  # many rows: one reduction per threshold, its groups added row after row
            out = np.empty((p, t), dtype=np.float64)
            for i in range(t):
                out[:, i] = np.add.reduce(vals[self.bounds[i] : self.bounds[i + 1]], axis=0)
            return out
        # few rows (the memos' updates): the same additions in one gather, each threshold's groups padded with the zero
        # row G and added in turn (a flat row index: numpy's 2-D fancy index is several times slower)
        block = np.concatenate((vals, np.zeros((1, p))))[self.pad.ravel()].reshape(k, t, p)
        acc = block[0]
        for j in range(1, k):
            acc += block[j]
        return np.ascontiguousarray(acc.T)  # (P, T) in C order: the caller's row sums take numpy's pairwise path


def _summed(w: Workload, ms: list[int]) -> float:
    total = 0.0
    for m in ms:
        total += float(w.prob[m])
    return total


def _group_prob(w: Workload, members: tuple[IntA, ...]) -> FloatA:
    """(G, 1) each group's summed probability, its members added in order."""
    probs = w.prob.tolist()
    out = [probs[ms[0]] if len(ms) == 1 else _summed(w, ms.tolist()) for ms in members]
    return np.array(out, dtype=np.float64).reshape(-1, 1)


def _structure(w: Workload) -> tuple[object, ...]:
    """What :meth:`ShapeGroups.of` and the access tables read of ``w`` besides the probabilities: workloads with
    the same structure group alike (the extender's learned workload is a new object with every pod, mostly of the
    same shapes)."""
    assert w.host_memory is not None  # set by Workload.__post_init__
    arrays = (w.gpu_shapes, w.share_index, w.cpu_milli, w.count, w.host_memory)
    return (w.models, len(w.thresholds), *((a.dtype.str, a.tobytes()) for a in arrays))


_GROUPS: dict[int, tuple[Workload, ShapeGroups]] = {}
_STRUCTURES: dict[tuple[object, ...], ShapeGroups] = {}


def shape_groups(w: Workload) -> ShapeGroups:
    """:meth:`ShapeGroups.of` ``w``, cached per workload object (the last few; an entry holds its workload, so the id
    is not reused while it is cached); a workload of the shapes of one seen before is grouped like it
    (:meth:`ShapeGroups.like`)."""
    hit = _GROUPS.get(id(w))
    if hit is not None and hit[0] is w:
        return hit[1]
    key = _structure(w)
    template = _STRUCTURES.get(key)
    groups = ShapeGroups.of(w) if template is None else template.like(w)
    if template is None:
        if len(_STRUCTURES) >= _CACHE_SIZE:
            _STRUCTURES.clear()
        _STRUCTURES[key] = groups
    if len(_GROUPS) >= _CACHE_SIZE:
        _GROUPS.clear()
    _GROUPS[id(w)] = (w, groups)
    return groups
