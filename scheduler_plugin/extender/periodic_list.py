"""A Kubernetes list kept fresh in the background: the machinery the extender's listers share
(:class:`.pdb_lister.PdbLister`, :class:`.node_labels.NodeLabelLister`).

:class:`PeriodicList` lists one ``path`` in pages of :data:`PAGE` every ``refresh_s`` seconds and keeps what the
subclass builds from the items (:meth:`PeriodicList._build`). :meth:`PeriodicList.current` gives it only while the
last good list is younger than ``max_age_s`` (else ``None``: the caller falls back to what it does without one). A
list that fails keeps the previous one (logged once per distinct error); a subclass may refuse a list that grew too
large while paging (:meth:`PeriodicList._too_many`), which drops what it kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from ..kubeapi import KubeClient, KubeError

log = logging.getLogger(__name__)

PAGE = 500
T = TypeVar("T")


class PeriodicList(Generic[T]):
    """``path`` listed every ``refresh_s`` seconds, what :meth:`_build` makes of the items kept ``max_age_s``."""

    path: str
    what: str
    """What is listed, for the log (``"PodDisruptionBudgets"``)."""
    task_name: str

    def __init__(
        self, client: KubeClient, *, refresh_s: float, max_age_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.client = client
        self.refresh_s, self.max_age_s, self.clock = refresh_s, max_age_s, clock
        self._kept: T | None = None
        self._listed_at = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self.error: str | None = None
        """Why the last list failed (None after a good one)."""

    def _build(self, items: Sequence[Any]) -> T:
        raise NotImplementedError

    def _too_many(self, count: int) -> str | None:
        """Why a list of ``count`` items (so far) is refused, or ``None`` (default: never)."""
        return None

    def current(self) -> T | None:
        """What the last good list built, or None when there is none younger than ``max_age_s``."""
        if self._kept is None or self.clock() - self._listed_at > self.max_age_s:
            return None
        return self._kept

    async def refresh(self) -> bool:
        """List once; returns whether the list is now fresh. Never raises (but cancellation)."""
        items: list[Any] = []
        params = {"limit": str(PAGE)}
        try:
            while True:
                body = await self.client.get(self.path, params=params)
                page = body.get("items")
                items.extend(page if isinstance(page, list) else [])
                refused = self._too_many(len(items))
                if refused is not None:
                    self.error = refused
                    log.warning("%s", refused)
                    self._kept = None
                    return False
                token = (body.get("metadata") or {}).get("continue")
                if not token:
                    break
                params = {"limit": str(PAGE), "continue": str(token)}
        except KubeError as exc:
            if self.error != str(exc):
                log.warning("listing %s failed (the previous list is kept): %s", self.what, exc)
            self.error = str(exc)
            return False
        self._kept = self._build(items)
        self._listed_at = self.clock()
        self.error = None
        return True

    async def start(self) -> None:
        """List now, then every ``refresh_s`` in the background."""
        await self.refresh()
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=self.task_name)

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
