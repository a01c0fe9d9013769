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

Every verb reads the ledger (the overlay and the burst policy's placements), one bind at a time changes it, and a busy
cluster keeps thousands of pods assumed (180 pods/s for a 30 s TTL): the per-node views the readers get are kept up
to date on each change, touching only the nodes it concerns (copy on write: a view handed out is never changed), so a
read costs the same whatever the ledger holds. :attr:`AssumedLedger.version` counts the changes, and the ledger
remembers which nodes' lists the last changes replaced (:meth:`entries_since`), so a reader that keeps something
derived from the lists (the framework's overlay) updates only those nodes instead of comparing every node's list.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
from bisect import bisect_right
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..model import GpuAssignment, Snapshot
from .base import PlacementLog

_EPOCHS = itertools.count(1)
"""Numbers of :class:`~.base.PlacementLog` epochs, unique across ledgers (``next`` is atomic under the GIL)."""


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

    CHANGE_LOG = 4096
    """How many changes :meth:`entries_since` can look back over (a reader further behind rebuilds whole)."""

    def __init__(self, ttl_s: float = 30.0) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ledger ttl_s must be > 0, got {ttl_s!r}")
        self.ttl_s = float(ttl_s)
        self._lock = threading.Lock()
        self._assumed: dict[str, _Entry] = {}  # pod_key -> entry (a pod is bound once)
        self._history: list[_Entry] = []  # placements in time order, pruned after the TTL
        self._history_keys: set[str] = set()  # the pod keys of ``_history`` (a pod is in it at most once)
        # ``_history``'s nodes and times as two lists (:meth:`placement_log`): appended in place with it, replaced
        # (never changed below their length) when it is rebuilt; ``_log_ordered``: the times never decrease
        self._log_nodes: list[str] = []
        self._log_times: list[float] = []
        self._log_ordered = True
        # the log's numbering (:class:`~.base.PlacementLog`): its epoch, and the number of ``_log_nodes[0]`` in it
        self._log_epoch = next(_EPOCHS)
        self._log_first = 0
        # (time, sequence, entry) of every entry assumed, a heap by time: the expiry pops what reached the TTL, and
        # skips what is no longer the pod's entry (forgotten, reconciled, re-assumed) instead of scanning them all
        self._expiry: list[tuple[float, int, _Entry]] = []
        self._expiry_seq = 0
        self._history_oldest = math.inf  # the oldest placement of the history (in order: the first one)
        self._version = 0
        # (version after the change, the nodes whose assumed lists it replaced) for the last CHANGE_LOG changes, one
        # per version: :meth:`entries_since` answers from it while it reaches back far enough
        self._changes: deque[tuple[int, tuple[str, ...]]] = deque(maxlen=self.CHANGE_LOG)
        # What the readers get, per node, in the order of ``_assumed`` and of ``_history``: replaced, never changed
        # in place, node by node (:meth:`_set_entries`, :meth:`_set_times`).
        self._by_node: dict[str, list[GpuAssignment]] = {}
        self._times: dict[str, list[float]] = {}
        self._entries_view: Mapping[str, list[GpuAssignment]] = MappingProxyType(self._by_node)
        self._times_view: Mapping[str, list[float]] = MappingProxyType(self._times)

    @property
    def version(self) -> int:
        """Counts the changes of the assumed entries and of the history (a bind, a forget, a reconcile, an expiry):
        while it stays the same, so does what :meth:`entries` returns."""
        return self._version

    def _set_entries(self, lists: Mapping[str, list[GpuAssignment]]) -> None:
        """Replace these nodes' assumed lists (an empty one drops the node) in a copy of the per-node map."""
        by_node = dict(self._by_node)
        for node, lst in lists.items():
            if lst:
                by_node[node] = lst
            else:
                by_node.pop(node, None)
        self._by_node = by_node
        self._entries_view = MappingProxyType(by_node)
        self._bump(tuple(lists))

    def _bump(self, nodes: tuple[str, ...] = ()) -> None:
        """One change more: a new version, logged with the nodes whose assumed lists it replaced."""
        self._version += 1
        self._changes.append((self._version, nodes))

    def _set_times(self, nodes: set[str]) -> None:
        """Rebuild the placement times of ``nodes`` from the history, in a copy of the per-node map."""
        self._history_oldest = min((h.at for h in self._history), default=math.inf)
        if not nodes:
            return
        fresh: dict[str, list[float]] = {n: [] for n in nodes}
        for h in self._history:
            if h.node in fresh:
                fresh[h.node].append(h.at)
        self._replace_times(fresh)

    def _replace_times(self, fresh: Mapping[str, list[float]]) -> None:
        """Replace these nodes' placement times (an empty list drops the node) in a copy of the per-node map."""
        times = dict(self._times)
        for node, ts in fresh.items():
            if ts:
                times[node] = ts
            else:
                times.pop(node, None)
        self._times = times
        self._times_view = MappingProxyType(times)
        self._bump()

    def _drop_first_times(self, counts: Counter[str]) -> None:
        """What :meth:`_set_times` of ``counts``' nodes rebuilds after a prefix of the history was cut, holding
        ``counts[node]`` placements of each: those are each node's first times (its list is in history order), so its
        list loses them."""
        self._history_oldest = self._log_times[0] if self._log_times else math.inf
        self._replace_times({node: self._times[node][n:] for node, n in counts.items()})

    def _append_time(self, node: str, at: float) -> None:
        """A placement appended to the history: what :meth:`_set_times` of ``{node}`` rebuilds, without reading the
        history (the node's times so far, then ``at``; the oldest is the older of the two)."""
        self._history_oldest = min(self._history_oldest, at)
        times = dict(self._times)
        times[node] = [*self._times.get(node, ()), at]
        self._times = times
        self._times_view = MappingProxyType(times)
        self._bump()

    def _append_history(self, e: _Entry) -> None:
        if self._log_times and e.at < self._log_times[-1]:
            self._log_ordered = False
        self._history.append(e)
        self._log_nodes.append(e.node)
        self._log_times.append(e.at)

    def _set_history(self, history: list[_Entry]) -> None:
        """Replace the history (and its log lists: a :class:`PlacementLog` handed out keeps the old ones)."""
        self._history = history
        self._log_nodes = [h.node for h in history]
        self._log_times = [h.at for h in history]
        self._log_ordered = all(a <= b for a, b in zip(self._log_times, self._log_times[1:], strict=False))
        self._log_epoch, self._log_first = next(_EPOCHS), 0

    def _drop_entries(self, dead: list[_Entry]) -> None:
        """Take the assignments of ``dead`` (entries already removed from ``_assumed``) out of their nodes' lists."""
        if not dead:
            return
        keys: dict[str, set[str]] = {}
        for e in dead:
            keys.setdefault(e.node, set()).add(e.assignment.pod_key)
        self._set_entries({n: [a for a in self._by_node.get(n, ()) if a.pod_key not in ks] for n, ks in keys.items()})

    def assume(self, node: str, assignment: GpuAssignment, now: float) -> None:
        """Record that ``assignment`` was bound to ``node`` at ``now``. Re-assuming a pod replaces its entry."""
        key = assignment.pod_key
        e = _Entry(node, assignment, float(now))
        with self._lock:
            prev = self._assumed.get(key)
            self._assumed[key] = e  # a known key keeps its place
            if prev is None:
                self._set_entries({node: [*self._by_node.get(node, ()), assignment]})
            elif prev.node == node:
                self._set_entries({node: [assignment if a.pod_key == key else a for a in self._by_node[node]]})
            else:  # moved: its place among the new node's entries is the key's place in ``_assumed``
                self._set_entries(
                    {
                        prev.node: [a for a in self._by_node.get(prev.node, ()) if a.pod_key != key],
                        node: [x.assignment for x in self._assumed.values() if x.node == node],
                    }
                )
            self._expiry_seq += 1
            heapq.heappush(self._expiry, (e.at, self._expiry_seq, e))
            if key not in self._history_keys:  # a new pod (the common case): one placement more, no scan
                self._append_history(e)
                self._history_keys.add(key)
                self._append_time(node, e.at)
                return
            gone = {h.node for h in self._history if h.assignment.pod_key == key}
            self._set_history([*(h for h in self._history if h.assignment.pod_key != key), e])
            self._set_times(gone | {node})

    def _expire(self, now: float) -> None:
        cutoff = now - self.ttl_s
        expiry = self._expiry
        if expiry and expiry[0][0] <= cutoff:  # else no entry is old enough: nothing to read
            dead: list[_Entry] = []
            while expiry and expiry[0][0] <= cutoff:
                e = heapq.heappop(expiry)[2]
                if self._assumed.get(e.assignment.pod_key) is e:  # still the pod's entry
                    del self._assumed[e.assignment.pod_key]
                    dead.append(e)
            self._drop_entries(dead)
        if self._history and self._history[0].at <= cutoff:
            if self._log_ordered:  # what reached the TTL is a prefix: sliced off, no step per placement kept
                k = bisect_right(self._log_times, cutoff)
                old = self._history[:k]
                self._history, self._log_nodes, self._log_times = (
                    self._history[k:],
                    self._log_nodes[k:],
                    self._log_times[k:],
                )
                self._log_first += k
                self._history_keys.difference_update(h.assignment.pod_key for h in old)
                self._drop_first_times(Counter(h.node for h in old))
                return
            old = [h for h in self._history if h.at <= cutoff]
            self._set_history([h for h in self._history if h.at > cutoff])
            self._history_keys.difference_update(h.assignment.pod_key for h in old)
            self._set_times({h.node for h in old})

    def entries(self, now: float) -> Mapping[str, list[GpuAssignment]]:
        """Live assumed assignments per node (entries older than the TTL are dropped), in the order assumed.
        The same object until the ledger changes (:attr:`version`): read it, never change it."""
        with self._lock:
            self._expire(now)
            return self._entries_view

    def entries_since(self, now: float, version: int) -> tuple[Mapping[str, list[GpuAssignment]], int, set[str] | None]:
        """:meth:`entries`, the :attr:`version` they are at, and the nodes whose lists changed after ``version``
        (an earlier version of this ledger): every other node's list is the same object as at ``version``. None
        instead of the nodes when ``version`` is further back than the last :attr:`CHANGE_LOG` changes (or not one
        of this ledger's). All three read under one lock: they agree with each other."""
        with self._lock:
            self._expire(now)
            current = self._version
            if version == current:
                return self._entries_view, current, set()
            changes = self._changes
            if not 0 <= version < current or not changes or changes[0][0] > version + 1:
                return self._entries_view, current, None
            nodes: set[str] = set()
            for v, changed in reversed(changes):
                if v <= version:
                    break
                nodes.update(changed)
            return self._entries_view, current, nodes

    def placements(self, now: float, window_s: float) -> Mapping[str, list[float]]:
        """Node -> times of the placements made in the last ``window_s`` seconds (at most the TTL), in the order
        made. Read it, never change it."""
        with self._lock:
            self._expire(now)
            cutoff = now - window_s
            if self._history_oldest > cutoff:  # the whole history (a window of at least the TTL, unless the clock
                return self._times_view  # stepped back and left older placements behind a newer first one)
            out: dict[str, list[float]] = {}
            for h in self._history:
                if h.at > cutoff:
                    out.setdefault(h.node, []).append(h.at)
            return MappingProxyType(out)

    def placement_log(self, now: float) -> PlacementLog:
        """The placements of :meth:`placements` over the whole TTL, as one log in the order made (read it, never
        change it)."""
        with self._lock:
            self._expire(now)
            return PlacementLog(
                self._log_nodes,
                self._log_times,
                len(self._log_times),
                self._log_ordered,
                self._log_epoch,
                self._log_first,
            )

    def forget(self, pod_key: str, assignment: GpuAssignment | None = None) -> bool:
        """Drop a pod (deleted, or its bind failed). True if it was known.

        With ``assignment``, only the entry holding that very object (the one a bind attempt assumed) is dropped: a
        first attempt that fails late does not release the GPUs a retry of the same pod has assumed since."""
        with self._lock:
            entry = self._assumed.get(pod_key)
            if assignment is not None and (entry is None or entry.assignment is not assignment):
                return False
            popped = self._assumed.pop(pod_key, None)
            if popped is not None:
                self._drop_entries([popped])
            gone = (
                {h.node for h in self._history if h.assignment.pod_key == pod_key}
                if pod_key in self._history_keys
                else ()
            )
            if gone:
                self._set_history([h for h in self._history if h.assignment.pod_key != pod_key])
                self._history_keys.discard(pod_key)
                self._set_times(gone)
            return popped is not None or bool(gone)

    def reconcile(self, snapshot: Snapshot) -> int:
        """Drop entries the snapshot already shows: the pod's assignment is in ``node.assignments`` (by pod key or
        uid), or one of the node's GPU processes belongs to the pod's uid. Returns how many were dropped."""
        with self._lock:
            seen: list[_Entry] = []
            for key, e in self._assumed.items():
                node = snapshot.node(e.node)
                if node is None:
                    continue
                uid = e.assignment.pod_uid
                recorded = any(a.pod_key == key or (uid and a.pod_uid == uid) for a in node.assignments)
                running = bool(uid) and any(p.pod_uid == uid for g in node.gpus for p in g.processes)
                if recorded or running:
                    seen.append(e)
            for e in seen:
                del self._assumed[e.assignment.pod_key]
            self._drop_entries(seen)
            return len(seen)

    def __len__(self) -> int:
        with self._lock:
            return len(self._assumed)
