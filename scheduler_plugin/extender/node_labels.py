"""The Node objects' topology labels, listed for ``/explain``'s gang forecast (the I/O edge of
:mod:`.gang_explain`).

The operator plans gangs with the Node objects' labels (the policy's ``gang.levels``); a Prometheus or scrape snapshot
carries none (its nodes are named from DCGM series). :class:`NodeLabelLister` lists ``/api/v1/nodes`` every
:data:`REFRESH_S` seconds in the background (pages of 500) and keeps, per node, only the values of the
labels it was asked for (the levels' labels), so the forecast sees the domains the operator sees. :meth:`labels`
gives ``None`` when there is no list to trust (never listed, or the last good one older than :data:`MAX_AGE_S`):
the forecast then falls back to the snapshot's labels and says which levels it cannot see. A list that fails keeps
the previous one (logged once per error): :class:`.periodic_list.PeriodicList`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from ..kubeapi import KubeClient
from .periodic_list import PeriodicList

PATH = "/api/v1/nodes"
REFRESH_S = 30.0
"""Seconds between two lists (labels change when nodes are added or relabelled: rarely)."""
MAX_AGE_S = 300.0
"""A list older than this is not used."""

NodeLabels = Mapping[str, Mapping[str, str]]


def labels_of_nodes(items: Sequence[Any], keys: Collection[str]) -> dict[str, dict[str, str]]:
    """Node name -> the values of its labels among ``keys``, for a list's ``items`` (objects without a name are
    left out; labels that are not strings are ignored)."""
    out: dict[str, dict[str, str]] = {}
    for obj in items:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
            continue
        labels = meta.get("labels")
        labels = labels if isinstance(labels, Mapping) else {}
        out[meta["name"]] = {k: v for k, v in labels.items() if k in keys and isinstance(v, str)}
    return out


class NodeLabelLister(PeriodicList[dict[str, dict[str, str]]]):
    path = PATH
    what = "Nodes for explain's gang forecast"
    task_name = "kelvin-node-labels"

    def __init__(
        self,
        client: KubeClient,
        keys: Collection[str],
        *,
        refresh_s: float = REFRESH_S,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(client, refresh_s=refresh_s, max_age_s=max_age_s, clock=clock)
        self.keys = frozenset(keys)

    def labels(self) -> NodeLabels | None:
        """Node name -> its level labels from the last good list, or None when there is none younger than
        ``max_age_s``."""
        return self.current()

    def _build(self, items: Sequence[Any]) -> dict[str, dict[str, str]]:
        return labels_of_nodes(items, self.keys)
