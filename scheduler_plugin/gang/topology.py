"""Topology domains: which nodes share a network domain at each level, from node labels.

Level 0 is ``node`` (each node its own domain), then the policy's levels innermost first, then ``cluster`` (one
domain). A node without a level's label is its own domain at that level. Pure: built once per snapshot from the
nodes' labels, then read as int arrays aligned with the :class:`~scheduler_plugin.model.FleetArrays` rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .levels import GangPolicy

IntA = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Domains:
    """Domain ids per level, one row per fleet row."""

    levels: tuple[str, ...]
    """``node``, the policy's levels, ``cluster``: innermost first."""
    ids: tuple[IntA, ...]
    """Per level, (N,) the domain id of each row (0..n_domains-1)."""
    names: tuple[tuple[str, ...], ...]
    """Per level, domain id -> a readable name (the label value, or the node's name where it has none)."""
    labelled: tuple[bool, ...]
    """Per level: does any node carry the level's label (``required=`` a level no node has cannot be met)."""

    def level_index(self, level: str) -> int:
        return self.levels.index(level)

    def count(self, level: int) -> int:
        return len(self.names[level])


def build_domains(node_names: Sequence[str], labels: Sequence[Mapping[str, str]], policy: GangPolicy) -> Domains:
    """The domains of ``node_names`` (fleet row order) whose labels are ``labels``."""
    n = len(node_names)
    levels = policy.level_names
    ids: list[IntA] = [np.arange(n, dtype=np.int64)]
    names: list[tuple[str, ...]] = [tuple(node_names)]
    labelled = [True]
    for lv in policy.levels:
        seen: dict[str, int] = {}
        col = np.empty(n, dtype=np.int64)
        any_label = False
        for i, (node, lab) in enumerate(zip(node_names, labels, strict=True)):
            value = lab.get(lv.label)
            if value is None:
                key = f"\0{node}"  # its own domain; cannot collide with a label value
            else:
                key = value
                any_label = True
            col[i] = seen.setdefault(key, len(seen))
        ids.append(col)
        names.append(tuple(k[1:] if k.startswith("\0") else k for k in seen))
        labelled.append(any_label)
    ids.append(np.zeros(n, dtype=np.int64))
    names.append(("cluster",))
    labelled.append(True)
    return Domains(levels, tuple(ids), tuple(names), tuple(labelled))


def spread(domains: Domains, rows: Sequence[int]) -> tuple[int, ...]:
    """Per level, how many distinct domains ``rows`` touch."""
    r = np.asarray(rows, dtype=np.int64)
    return tuple(int(np.unique(col[r]).size) if r.size else 0 for col in domains.ids)
