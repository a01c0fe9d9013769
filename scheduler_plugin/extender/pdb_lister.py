"""The cluster's PodDisruptionBudgets, listed for the preempt verb (the I/O edge of :mod:`..preemption.pdb`).

:class:`PdbLister` lists ``policy/v1`` PodDisruptionBudgets every :data:`REFRESH_S` seconds in the background (pages
of :data:`PAGE`, at most :data:`MAX_BUDGETS` in all) and keeps the last good list, indexed by namespace. The verb
asks :meth:`PdbLister.index` for it: ``None`` when kelvin has no list it can trust (never listed, the last good one
older than :data:`MAX_AGE_S`, or the cluster has more than :data:`MAX_BUDGETS`), and the verb then falls back to
kube-scheduler's own count (``NumPDBViolations``). A list that fails keeps the previous one (logged); an object that
does not parse is left out, logged once by name with the field at fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..kubeapi import KubeClient, KubeError
from ..preemption.pdb import Budget, BudgetError, BudgetIndex, parse_budget

log = logging.getLogger(__name__)

PATH = "/apis/policy/v1/poddisruptionbudgets"
REFRESH_S = 10.0
"""Seconds between two lists."""
MAX_AGE_S = 60.0
"""A list older than this is not used (the verb falls back to kube-scheduler's count)."""
PAGE = 500
MAX_BUDGETS = 10_000
"""More budgets than this in the cluster: kelvin does not list them (a partial list would miss violations)."""


def budgets_of(items: Sequence[Any], warned: set[str] | None = None) -> list[Budget]:
    """The budgets of a list's ``items`` that parse; the others are logged (once per name when ``warned`` is kept)."""
    out = []
    for obj in items:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        name = f"{meta.get('namespace')}/{meta.get('name')}" if isinstance(meta, Mapping) else "?"
        try:
            if not isinstance(obj, Mapping):
                raise BudgetError("expected an object")
            out.append(parse_budget(obj))
        except BudgetError as exc:
            if warned is None or name not in warned:
                log.warning("PodDisruptionBudget %s: %s; not counted by the preempt verb", name, exc)
                if warned is not None:
                    warned.add(name)
    return out


class PdbLister:
    def __init__(
        self,
        client: KubeClient,
        *,
        refresh_s: float = REFRESH_S,
        max_age_s: float = MAX_AGE_S,
        max_budgets: int = MAX_BUDGETS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.refresh_s, self.max_age_s, self.max_budgets, self.clock = refresh_s, max_age_s, max_budgets, clock
        self._index: BudgetIndex | None = None
        self._listed_at = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self._warned: set[str] = set()
        self.error: str | None = None
        """Why the last list failed (None after a good one)."""

    def index(self) -> BudgetIndex | None:
        """The last good list, or None when there is none younger than ``max_age_s``."""
        if self._index is None or self.clock() - self._listed_at > self.max_age_s:
            return None
        return self._index

    async def refresh(self) -> bool:
        """List once; returns whether the list is now fresh. Never raises (but cancellation)."""
        items: list[Any] = []
        params = {"limit": str(PAGE)}
        try:
            while True:
                body = await self.client.get(PATH, params=params)
                page = body.get("items")
                items.extend(page if isinstance(page, list) else [])
                if len(items) > self.max_budgets:
                    self.error = f"more than {self.max_budgets} PodDisruptionBudgets; kube-scheduler's count is used"
                    log.warning("preempt: %s", self.error)
                    self._index = None
                    return False
                token = (body.get("metadata") or {}).get("continue")
                if not token:
                    break
                params = {"limit": str(PAGE), "continue": str(token)}
        except KubeError as exc:
            if self.error != str(exc):
                log.warning("listing PodDisruptionBudgets failed (the previous list is kept): %s", exc)
            self.error = str(exc)
            return False
        self._index = BudgetIndex(budgets_of(items, self._warned))
        self._listed_at = self.clock()
        self.error = None
        return True

    async def start(self) -> None:
        """List now (so the first preemption has the budgets), then every ``refresh_s`` in the background."""
        await self.refresh()
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="kelvin-pdb-list")

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
