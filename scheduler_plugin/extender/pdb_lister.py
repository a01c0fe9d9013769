"""The cluster's PodDisruptionBudgets, listed for the preempt verb (the I/O edge of :mod:`..preemption.pdb`).

:class:`PdbLister` lists ``policy/v1`` PodDisruptionBudgets every :data:`REFRESH_S` seconds in the background (pages
of 500, at most :data:`MAX_BUDGETS` in all) and keeps the last good list, indexed by namespace. The verb
asks :meth:`PdbLister.index` for it: ``None`` when kelvin has no list it can trust (never listed, the last good one
older than :data:`MAX_AGE_S`, or the cluster has more than :data:`MAX_BUDGETS`), and the verb then falls back to
kube-scheduler's own count (``NumPDBViolations``). A list that fails keeps the previous one (logged); an object that
does not parse is left out, logged once by name with the field at fault.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..kubeapi import KubeClient
from ..preemption.pdb import Budget, BudgetError, BudgetIndex, parse_budget
from .periodic_list import PeriodicList

log = logging.getLogger(__name__)

PATH = "/apis/policy/v1/poddisruptionbudgets"
REFRESH_S = 10.0
"""Seconds between two lists."""
MAX_AGE_S = 60.0
"""A list older than this is not used (the verb falls back to kube-scheduler's count)."""
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


class PdbLister(PeriodicList[BudgetIndex]):
    path = PATH
    what = "PodDisruptionBudgets"
    task_name = "kelvin-pdb-list"

    def __init__(
        self,
        client: KubeClient,
        *,
        refresh_s: float = REFRESH_S,
        max_age_s: float = MAX_AGE_S,
        max_budgets: int = MAX_BUDGETS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(client, refresh_s=refresh_s, max_age_s=max_age_s, clock=clock)
        self.max_budgets = max_budgets
        self._warned: set[str] = set()

    def index(self) -> BudgetIndex | None:
        """The last good list, or None when there is none younger than ``max_age_s``."""
        return self.current()

    def _too_many(self, count: int) -> str | None:
        if count > self.max_budgets:
            return f"preempt: more than {self.max_budgets} PodDisruptionBudgets; kube-scheduler's count is used"
        return None

    def _build(self, items: Sequence[Any]) -> BudgetIndex:
        return BudgetIndex(budgets_of(items, self._warned))
