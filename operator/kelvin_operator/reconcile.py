"""One cycle over one node: hotness -> taint -> strategies -> gang moves / planner -> evictor.

A thermal candidate that is a member of a non-elastic gang is not evicted alone: the gang is moved as a whole
(:mod:`kelvin_operator.stragglers`, :meth:`Evictor.act_gang`), with its members from the operator's gang index.

The reconciler holds the little state the operator keeps in memory (hotness per node, first-seen times of pool
violations, the eviction budget). Hotness is re-derived from the node's taint after a restart; the checkpoint
handshake lives in pod annotations. kopf handlers call :meth:`Reconciler.reconcile_node`; so do the tests and the
fleet scenario.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler_plugin import hotness
from scheduler_plugin.gang import GangRef
from scheduler_plugin.kubeapi import KubeError
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.gpu import GpuNode
from scheduler_plugin.model.pod import key_of

from .evictor import Evictor, Outcome, pod_ref
from .k8s import Kube, ObjectRef
from .limits import EvictionBudget
from .metrics import OperatorMetrics
from .planner import Protected, plan
from .pods import PodView, pod_view
from .settings import OperatorConfig, PoolMode
from .stragglers import GangMove, gang_moves, gang_of, is_elastic, move_protection
from .strategies import Candidate, PoolViolation, memory_pools, noisy_neighbours, pool_candidates, thermal

log = logging.getLogger("kelvin.operator")


@dataclass(slots=True)
class NodeResult:
    node: str
    hot: bool
    transition: hotness.Transition | None = None
    taint_changed: bool = False
    candidates: list[Candidate] = field(default_factory=list)
    protected: list[Protected] = field(default_factory=list)
    violations: list[PoolViolation] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    moves: list[GangMove] = field(default_factory=list)
    """Gangs moved (or kept, when protected) as a whole this cycle."""


def has_thermal_taint(node_obj: Mapping[str, Any]) -> bool:
    taints = (node_obj.get("spec") or {}).get("taints") or []
    return any(t.get("key") == ann.THERMAL_TAINT_KEY for t in taints)


def active_pods(pods: Iterable[Mapping[str, Any]], node: str) -> list[PodView]:
    views = (pod_view(p) for p in pods)
    return [v for v in views if v.node == node and v.phase not in ("Succeeded", "Failed")]


class Reconciler:
    """One node's operator cycle (:meth:`reconcile_node`): hotness, the thermal taint, the strategies, the planner and
    the one :class:`Evictor`.

    Owns the operator's in-memory state: the hotness of each node, when each pool violation was first seen, which
    protected pods were already reported, and the eviction budget shared with the evictor. Built once by
    ``Runtime.start`` (kept in kopf's ``memo``) and kept for the operator's life; after a restart the hotness is
    re-derived from the node's taint. Not thread-safe: kopf's timers call it from the operator's one event loop."""

    def __init__(self, cfg: OperatorConfig, kube: Kube, metrics: OperatorMetrics | None = None) -> None:
        self.cfg = cfg
        self.kube = kube
        self.metrics = metrics or OperatorMetrics()
        self.budget = EvictionBudget(cfg.limits)
        self.evictor = Evictor(kube, cfg, self.metrics, self.budget)
        self.states: dict[str, hotness.NodeHotness] = {}
        self.pool_over_since: dict[str, dict[str, float]] = {}
        #: Per node, the (pod, eviction reason) pairs kept last cycle because the pod is protected: each is logged at
        #: INFO once per episode (while it stays a protected candidate), at DEBUG on the cycles after.
        self.protected_seen: dict[str, set[tuple[str, str]]] = {}
        #: The (gang, why) pairs of gangs kept whole because a member is protected (logged at INFO once per episode).
        self.gangs_kept: set[tuple[str, str]] = set()

    def _state(self, name: str, node_obj: Mapping[str, Any], now: float) -> hotness.NodeHotness:
        st = self.states.get(name)
        if st is None:
            # after a restart the taint is the memory: a tainted node is still hot until it proves cool
            st = (
                hotness.NodeHotness(hot=True, since=now, reason="thermal taint present")
                if has_thermal_taint(node_obj)
                else hotness.NodeHotness()
            )
        return st

    async def reconcile_node(
        self,
        node_obj: Mapping[str, Any],
        gpu_node: GpuNode | None,
        pods: Iterable[Mapping[str, Any]],
        now: float,
        gangs: Mapping[str, Iterable[Mapping[str, Any]]] | None = None,
    ) -> NodeResult:
        """One cycle over ``node_obj``. ``gangs``: gang key -> the pods of its ungated members on every node (the
        operator's ``placed_gangs`` index), so a straggling member's whole gang is moved; without it, a gang's
        members known are the ones on this node."""
        pods = list(pods)
        name = str((node_obj.get("metadata") or {}).get("name") or (gpu_node.name if gpu_node else ""))
        fresh = (
            gpu_node is not None
            and (gpu_node.age_seconds(now) or 0.0) <= self.cfg.max_telemetry_age_s
            and gpu_node.observed_at is not None
        )
        obs = hotness.observe(gpu_node, self.cfg.hotness) if fresh and gpu_node is not None else None
        old = self._state(name, node_obj, now)
        new, transition = hotness.step(old, obs, now, self.cfg.hotness) if self.cfg.thermal_enabled else (old, None)
        self.states[name] = new
        self.metrics.hot_nodes.set(sum(1 for s in self.states.values() if s.hot))
        result = NodeResult(node=name, hot=new.hot, transition=transition)
        if transition is not None:
            log.info("node %s %s hot: %s", name, transition.value, new.reason)
        if self.cfg.thermal_enabled:
            result.taint_changed = await self._sync_taint(name, node_obj, new, transition)

        if not fresh or gpu_node is None:
            return result
        views = active_pods(pods, name)
        gang_by_pod, gang_members = self._gangs_here(pods, gangs)
        candidates: list[Candidate] = []
        if new.hot and obs is not None and self.cfg.thermal_enabled:
            rule = self.cfg.thermal_eviction
            deferred = {v.key for v in views if v.key in gang_by_pod and not is_elastic(v)}  # the gang decides
            candidates += thermal(gpu_node, obs, views, self.cfg.hotness.cool_celsius, now, rule, deferred)
        # Each strategy is isolated: an unexpected error in one (a pod's data it cannot handle) is logged with the
        # node and strategy, and the others (above all the thermal one) still act this cycle.
        try:
            candidates += noisy_neighbours(gpu_node, views, self.cfg.noisy)
        except Exception:
            log.exception("node %s: the noisy-neighbour strategy failed; skipped this cycle", name)
        try:
            result.violations = await self._pools(name, node_obj, gpu_node, views, now)
            candidates += pool_candidates(result.violations)
        except Exception:
            log.exception("node %s: the memory-pool strategy failed; skipped this cycle", name)
        singles, moves = gang_moves(candidates, gang_by_pod, gang_members, now, self.cfg.thermal_eviction)
        ranked, protected = plan(singles, now, self.cfg.protection)
        result.candidates, result.protected, result.moves = ranked, protected, moves
        self._report_protected(name, protected)
        self.budget.new_cycle(name)
        kept: set[tuple[str, str]] = set()
        for move in moves:  # thermal, the most urgent reason: before the single evictions
            why = move_protection(move, now, self.cfg.protection)
            if why is not None:
                self.metrics.gang_moves.labels("protected").inc()
                say = log.debug if (move.gang, why) in self.gangs_kept else log.info  # INFO once per episode
                say("keeping gang %s whole on its nodes: %s; %s", move.gang, why, move.detail)
                kept.add((move.gang, why))
                continue
            result.outcomes += await self.evictor.act_gang(name, move, now)
        self.gangs_kept = (self.gangs_kept - {k for k in self.gangs_kept if k[0] in {m.gang for m in moves}}) | kept
        result.outcomes += await self.evictor.act(name, ranked, now)
        return result

    def _gangs_here(
        self, pods: list[Mapping[str, Any]], gangs: Mapping[str, Iterable[Mapping[str, Any]]] | None
    ) -> tuple[dict[str, GangRef], dict[str, list[Mapping[str, Any]]]]:
        """(pod key -> gang, for this node's pods; gang key -> its members' pods: the index's, plus this node's)."""
        by_pod: dict[str, GangRef] = {}
        members: dict[str, list[Mapping[str, Any]]] = {}
        for p in pods:
            ref = gang_of(p, self.cfg.gang)
            if ref is None:
                continue
            key = key_of(p)
            by_pod[key] = ref
            if ref.key not in members:  # only the gangs with a member here are read from the index
                members[ref.key] = [dict(q) for q in (gangs.get(ref.key, ()) if gangs is not None else ())]
            known = members[ref.key]
            if all(key_of(q) != key for q in known):  # in case the index has not seen it yet
                known.append(p)
        return by_pod, members

    def _report_protected(self, name: str, protected: list[Protected]) -> None:
        """A pod kelvin would evict but must not: INFO with the reason when it starts being kept, DEBUG after."""
        before = self.protected_seen.get(name, set())
        now_kept: set[tuple[str, str]] = set()
        for p in protected:
            pod, reason = p.candidate.pod, p.candidate.reason.value
            key = (pod.uid or pod.key, reason)
            now_kept.add(key)
            if key in before:
                log.debug("protected %s from %s eviction: %s", pod.key, reason, p.why)
            else:
                log.info(
                    "keeping %s on node %s: it would be evicted (%s: %s) but is protected: %s",
                    pod.key,
                    name,
                    reason,
                    p.candidate.detail,
                    p.why,
                )
        if now_kept:
            self.protected_seen[name] = now_kept
        else:
            self.protected_seen.pop(name, None)

    async def _sync_taint(
        self, name: str, node_obj: Mapping[str, Any], st: hotness.NodeHotness, transition: hotness.Transition | None
    ) -> bool:
        tainted = has_thermal_taint(node_obj)
        if st.hot == tainted and transition is None:
            return False
        ref = ObjectRef(kind="Node", name=name, uid=(node_obj.get("metadata") or {}).get("uid"))
        verb = "taint" if st.hot else "untaint"
        if self.cfg.dry_run:
            if transition is not None:
                await self.kube.event(ref, "KelvinDryRunTaint", f"dry run: would {verb} {name}: {st.reason}")
            return False
        try:
            changed = await self.kube.set_taint(
                name, ann.THERMAL_TAINT_KEY, ann.THERMAL_TAINT_VALUE, self.cfg.taint_effect, present=st.hot
            )
        except KubeError as exc:  # a conflict or an outage: the next cycle tries again; evictions still go ahead
            log.warning("could not %s node %s: %s", verb, name, exc)
            return False
        if changed:
            self.metrics.taint_transitions.labels("added" if st.hot else "removed").inc()
            if st.hot:
                await self.kube.event(
                    ref,
                    "KelvinNodeHot",
                    f"tainted {ann.THERMAL_TAINT_KEY}={ann.THERMAL_TAINT_VALUE}:{self.cfg.taint_effect}: {st.reason}",
                    warning=True,
                )
            else:
                await self.kube.event(ref, "KelvinNodeCooled", f"removed the thermal taint: {st.reason}")
        return changed

    async def _pools(
        self, name: str, node_obj: Mapping[str, Any], gpu_node: GpuNode, views: list[PodView], now: float
    ) -> list[PoolViolation]:
        labels = (node_obj.get("metadata") or {}).get("labels") or {}
        mps = gpu_node.mps_enabled or str(labels.get(self.cfg.webhook.mps_label, "")).lower() == "true"
        before = self.pool_over_since.get(name, {})
        violations, still = memory_pools(gpu_node, views, self.cfg.pools, before, now, mps)
        self.pool_over_since[name] = still
        mode = self.cfg.pools.mode
        for v in violations:
            if v.pod.uid in before:
                continue  # one count and one Event per episode over the pool
            self.metrics.pool_violations.labels(mode.value, v.kind.value).inc()
            log.warning("%s: %s (mode %s)", v.pod.key, v.message(), mode.value)
            if mode is not PoolMode.AUDIT:
                grace = f"; eviction after {self.cfg.pools.grace_s:g} s" if mode is PoolMode.EVICT else ""
                await self.kube.event(pod_ref(v.pod), "KelvinGpuMemoryPoolExceeded", v.message() + grace, warning=True)
        return violations
