"""The Node objects' topology labels, listed for ``/explain``'s gang forecast (the I/O edge of
:mod:`.gang_explain`).

The operator plans gangs with the Node objects' labels (the policy's ``gang.levels``); a Prometheus or scrape snapshot
carries none (its nodes are named from DCGM series). :class:`NodeLabelLister` lists ``/api/v1/nodes`` every
:data:`REFRESH_S` seconds in the background (pages of :data:`PAGE`) and keeps, per node, only the values of the
labels it was asked for (the levels' labels), so the forecast sees the domains the operator sees. :meth:`labels`
gives ``None`` when there is no list to trust (never listed, or the last good one older than :data:`MAX_AGE_S`):
the forecast then falls back to the snapshot's labels and says which levels it cannot see. A list that fails keeps
the previous one (logged once per error).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from ..kubeapi import KubeClient, KubeError

log = logging.getLogger(__name__)

PATH = "/api/v1/nodes"
REFRESH_S = 30.0
"""Seconds between two lists (labels change when nodes are added or relabelled: rarely)."""
MAX_AGE_S = 300.0
"""A list older than this is not used."""
PAGE = 500

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


class NodeLabelLister:
    def __init__(
        self,
        client: KubeClient,
        keys: Collection[str],
        *,
        refresh_s: float = REFRESH_S,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.keys = frozenset(keys)
        self.refresh_s, self.max_age_s, self.clock = refresh_s, max_age_s, clock
        self._labels: dict[str, dict[str, str]] | None = None
        self._listed_at = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self.error: str | None = None
        """Why the last list failed (None after a good one)."""

    def labels(self) -> NodeLabels | None:
        """Node name -> its level labels from the last good list, or None when there is none younger than
        ``max_age_s``."""
        if self._labels is None or self.clock() - self._listed_at > self.max_age_s:
            return None
        return self._labels

    async def refresh(self) -> bool:
        """List once; returns whether the list is now fresh. Never raises (but cancellation)."""
        items: list[Any] = []
        params = {"limit": str(PAGE)}
        try:
            while True:
                body = await self.client.get(PATH, params=params)
                page = body.get("items")
                items.extend(page if isinstance(page, list) else [])
                token = (body.get("metadata") or {}).get("continue")
                if not token:
                    break
                params = {"limit": str(PAGE), "continue": str(token)}
        except KubeError as exc:
            if self.error != str(exc):
                log.warning("listing Nodes for explain's gang forecast failed (the previous list is kept): %s", exc)
            self.error = str(exc)
            return False
        self._labels = labels_of_nodes(items, self.keys)
        self._listed_at = self.clock()
        self.error = None
        return True

    async def start(self) -> None:
        """List now, then every ``refresh_s`` in the background."""
        await self.refresh()
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="kelvin-node-labels")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
