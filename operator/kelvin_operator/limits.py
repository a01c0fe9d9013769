"""Eviction limits, owned by the evictor: per node per cycle, per namespace and cluster-wide per sliding window.

Pure bookkeeping (no I/O, the caller passes the time). Dry-run evictions count too, so a dry run shows what the
real run would do.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .settings import LimitsConfig


@dataclass(slots=True)
class EvictionBudget:
    cfg: LimitsConfig
    _history: deque[tuple[float, str]] = field(default_factory=deque)
    _cycle: dict[str, int] = field(default_factory=dict)

    def new_cycle(self, node: str) -> None:
        """Start a cycle over ``node``: its per-cycle count restarts."""
        self._cycle[node] = 0

    def _expire(self, now: float) -> None:
        while self._history and now - self._history[0][0] >= self.cfg.window_s:
            self._history.popleft()

    def refusal(self, node: str, namespace: str, now: float) -> str | None:
        """Why one more eviction is not allowed now, or ``None``."""
        self._expire(now)
        if self._cycle.get(node, 0) >= self.cfg.max_per_node_per_cycle:
            return f"node {node} reached {self.cfg.max_per_node_per_cycle} eviction(s) this cycle"
        if len(self._history) >= self.cfg.max_total:
            return f"cluster reached {self.cfg.max_total} eviction(s) in {self.cfg.window_s:g} s"
        in_ns = sum(1 for _, ns in self._history if ns == namespace)
        if in_ns >= self.cfg.max_per_namespace:
            return f"namespace {namespace} reached {self.cfg.max_per_namespace} eviction(s) in {self.cfg.window_s:g} s"
        return None

    def hold_node_slot(self, node: str) -> None:
        """A step that takes the node's turn this cycle without evicting (a pending checkpoint handshake)."""
        self._cycle[node] = self._cycle.get(node, 0) + 1

    def record(self, node: str, namespace: str, now: float) -> None:
        self._cycle[node] = self._cycle.get(node, 0) + 1
        self._history.append((now, namespace))

    def used(self, now: float) -> int:
        self._expire(now)
        return len(self._history)
