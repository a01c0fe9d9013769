"""The assumed-allocation ledger: placements kelvin made that telemetry does not show yet.

Between a bind and the moment the exporter reports the new pod, the snapshot still shows the GPUs as free; without
this ledger a burst of pods would all land on the same "best" node. The framework applies :meth:`entries` as an
overlay (``FleetArrays.with_assumed``) and scores recent placements (:meth:`placements`) with the burst policy.

An entry is the pod's claim as :func:`~scheduler_plugin.model.claim.claim_of` reads it, the very record the listing of
bound pods rebuilds from the pod's annotations (``telemetry/assignments.py``); the overlay charges it on each GPU by
that GPU's size (:func:`~scheduler_plugin.model.claim.charged_milli`), as the snapshot charges the listed record.

An entry leaves the ledger when telemetry shows the pod (:meth:`reconcile`), when the pod is forgotten (deleted, bind
failed) or after the TTL, whichever comes first. The placement history used for burst scoring is kept for the TTL
even after reconcile: the burst policy cares about recent decisions, visible or not. Thread-safe.

Every verb reads the ledger (the overlay and the burst policy's placements), one bind at a time changes it: what the
readers get is kept until the ledger changes (:attr:`AssumedLedger.version`) or an entry reaches its TTL, so that a
verb pays for the ledger's size only after a change, not on every read.
"""

from __future__ import annotations

import bisect
import math
import operator
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..model import GpuAssignment, Snapshot


@dataclass(frozen=True, slots=True)
class _Entry:
    node: str
    assignment: GpuAssignment
    at: float


class AssumedLedger:
    """Placements kelvin made that telemetry does not show yet (see the module's docstring).

    Owns the assumed entries (one per pod key) and the placement history of the last ``ttl_s`` seconds. One per
    extender, built by ``build_extender`` and shared by the framework (which assumes binds and reads the overlay) and
    the snapshot cache (which reconciles it on each publish); it lives as long as the process. Thread-safe: every
    method takes the ledger's lock."""

    def __init__(self, ttl_s: float = 30.0) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ledger ttl_s must be > 0, got {ttl_s!r}")
        self.ttl_s = float(ttl_s)
        self._lock = threading.Lock()
        self._assumed: dict[str, _Entry] = {}  # pod_key -> entry (a pod is bound once)
        self._history: list[_Entry] = []  # placements in time order, pruned after the TTL
        self._history_at: list[float] = []  # their times, for bisecting a window (while in order)
        self._in_order = True  # whether ``_history`` is in time order (a clock that stepped back breaks it)
        self._oldest = math.inf  # no assumed entry is older than this: none expires before it reaches the TTL
        self._version = 0
        self._entries: tuple[int, Mapping[str, list[GpuAssignment]]] | None = None
        self._placements: tuple[tuple[int, float, int], Mapping[str, list[float]]] | None = None

    @property
    def version(self) -> int:
        """Counts the changes of the assumed entries and of the history (a bind, a forget, a reconcile, an expiry):
        while it stays the same, so does what :meth:`entries` returns."""
        return self._version

    def _changed(self) -> None:
        self._version += 1
        self._history_at = [h.at for h in self._history]
        self._in_order = all(map(operator.le, self._history_at, self._history_at[1:]))

    def assume(self, node: str, assignment: GpuAssignment, now: float) -> None:
        """Record that ``assignment`` was bound to ``node`` at ``now``. Re-assuming a pod replaces its entry."""
        e = _Entry(node, assignment, float(now))
        with self._lock:
            self._assumed[assignment.pod_key] = e
            self._history = [h for h in self._history if h.assignment.pod_key != assignment.pod_key]
            self._history.append(e)
            self._oldest = min(self._oldest, e.at)
            self._changed()

    def _expire(self, now: float) -> None:
        cutoff = now - self.ttl_s
        changed = False
        if self._oldest <= cutoff:  # else no entry is old enough: nothing to scan
            dead = [k for k, e in self._assumed.items() if e.at <= cutoff]
            for k in dead:
                del self._assumed[k]
            self._oldest = min((e.at for e in self._assumed.values()), default=math.inf)
            changed = bool(dead)
        if self._history and self._history[0].at <= cutoff:
            self._history = [h for h in self._history if h.at > cutoff]
            changed = True
        if changed:
            self._changed()

    def entries(self, now: float) -> Mapping[str, list[GpuAssignment]]:
        """Live assumed assignments per node (entries older than the TTL are dropped), in the order assumed.
        The same object until the ledger changes (:attr:`version`): read it, never change it."""
        with self._lock:
            self._expire(now)
            if self._entries is not None and self._entries[0] == self._version:
                return self._entries[1]
            out: dict[str, list[GpuAssignment]] = {}
            for e in self._assumed.values():
                out.setdefault(e.node, []).append(e.assignment)
            view = MappingProxyType(out)
            self._entries = (self._version, view)
            return view

    def placements(self, now: float, window_s: float) -> Mapping[str, list[float]]:
        """Node -> times of the placements made in the last ``window_s`` seconds (at most the TTL), in time order.
        Kept while the ledger is unchanged and the window starts after the same placements: read it, never change it."""
        with self._lock:
            self._expire(now)
            cutoff = now - window_s
            # The history is in time order (unless the clock stepped back): the window is the placements after the
            # first ``start``, and its answer the same while ``start`` is.
            start = bisect.bisect_right(self._history_at, cutoff) if self._in_order else -1
            key = (self._version, window_s, start)
            if start >= 0 and self._placements is not None and self._placements[0] == key:
                return self._placements[1]
            out: dict[str, list[float]] = {}
            for h in self._history:
                if h.at > cutoff:
                    out.setdefault(h.node, []).append(h.at)
            view = MappingProxyType(out)
            if start >= 0:
                self._placements = (key, view)
            return view

    def forget(self, pod_key: str, assignment: GpuAssignment | None = None) -> bool:
        """Drop a pod (deleted, or its bind failed). True if it was known.

        With ``assignment``, only the entry holding that very object (the one a bind attempt assumed) is dropped: a
        first attempt that fails late does not release the GPUs a retry of the same pod has assumed since."""
        with self._lock:
            entry = self._assumed.get(pod_key)
            if assignment is not None and (entry is None or entry.assignment is not assignment):
                return False
            known = self._assumed.pop(pod_key, None) is not None
            before = len(self._history)
            self._history = [h for h in self._history if h.assignment.pod_key != pod_key]
            dropped = known or len(self._history) != before
            if dropped:
                self._changed()
            return dropped

    def reconcile(self, snapshot: Snapshot) -> int:
        """Drop entries the snapshot already shows: the pod's assignment is in ``node.assignments`` (by pod key or
        uid), or one of the node's GPU processes belongs to the pod's uid. Returns how many were dropped."""
        with self._lock:
            seen: list[str] = []
            for key, e in self._assumed.items():
                node = snapshot.node(e.node)
                if node is None:
                    continue
                uid = e.assignment.pod_uid
                recorded = any(a.pod_key == key or (uid and a.pod_uid == uid) for a in node.assignments)
                running = bool(uid) and any(p.pod_uid == uid for g in node.gpus for p in g.processes)
                if recorded or running:
                    seen.append(key)
            for key in seen:
                del self._assumed[key]
            if seen:
                self._changed()
            return len(seen)

    def __len__(self) -> int:
        with self._lock:
            return len(self._assumed)
