"""The preempt verb: for each node kube-scheduler proposes, the victims kelvin would evict, or the node dropped.

kube-scheduler calls it after its own (count-based) preemption found candidate nodes and victims on them. For each
node kelvin chooses, among the pods it knows hold GPUs there (its records: the ``kelvin.dev/gpu-assigned`` pods of
the snapshot, plus the binds in its ledger), the cheapest set whose release lets the preemptor pass kelvin's filters
(:func:`scheduler_plugin.preemption.choose_victims`); a node where no set does is left out of the answer, so
kube-scheduler does not preempt there.

What kelvin reads of a victim: its GPUs and priority from its record; its ``kelvin.dev/evictable``, gang, start and
checkpoint times from its record (the listing of pods) or, with ``nodeCacheCapable: false``, from the Pod object
kube-scheduler sent. PodDisruptionBudgets: kelvin lists them itself (:mod:`.pdb_lister`, with a Kubernetes API) and
counts, per victim set, the victims each budget matches beyond its ``disruptionsAllowed``
(:mod:`scheduler_plugin.preemption.pdb`), so it knows which pods are protected, proposed by kube-scheduler or not.
Without a fresh list (no API, a list that failed for longer than ``MAX_AGE_S``) or for a pod whose labels it does
not know, kelvin falls back to kube-scheduler's count of *its* victims on the node (``NumPDBViolations``): with 0
none of them violates one; otherwise every one of them counts as violating (it cannot tell which).

Reported, never guessed: a node not in kelvin's snapshot, a victim UID kelvin has no record of (nodeCacheCapable
true), or a victim Pod that asks for GPUs kelvin did not assign, are logged and left out. A proposed victim whose Pod
asks for no GPU (nodeCacheCapable false) is kept: kube-scheduler chose it for what kelvin does not see (CPU, memory,
ports). When kelvin's records show room for the pod without evicting anyone, kube-scheduler's own victims are kept
(what it needs is not a GPU). A preemptor that belongs to a gang is never preempted for (one member alone would not
make the job run): every node is dropped.

Bounded work: the nodes are judged in kube-scheduler's order of preference (fewest proposed victims first), and
judging stops once :data:`MAX_KEPT_NODES` nodes are kept or after :data:`TIME_BUDGET_S`; the rest are left out.
Of the nodes judged, only those of least cost (:mod:`scheduler_plugin.preemption.choice`'s order) are answered:
kube-scheduler then picks among equals, never a node whose victims lose more progress.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..model import GpuAssignment, RequestError, parse_pod
from ..model.eviction import EvictionFacts, eviction_facts
from ..model.pod import key_of
from ..policies.framework import Framework
from ..preemption import Candidate, choose_victims
from ..preemption.choice import Choice, Cost
from ..preemption.pdb import BudgetIndex, violations
from ..preemption.victims import GangCost, gang_costs, kube_count, kube_free
from .preempt_wire import NodeVictims, PreemptionArgs, preemption_result

if TYPE_CHECKING:
    from .service import Extender

log = logging.getLogger(__name__)

MAX_KEPT_NODES = 16
"""Nodes answered with victims at most: kube-scheduler picks one of them; judging every candidate it sends (up to
max(100, 10 % of the nodes)) would cost seconds on a big fleet."""

TIME_BUDGET_S = 2.0
"""Judging stops after this long (the nodes not judged are left out): well below kube-scheduler's extender
``httpTimeout`` (5 s by default), whose expiry fails the preemption."""


class PreemptVerb:
    """The preempt verb over an :class:`Extender`'s snapshot, ledger and policy.

    Judges with a framework of its own, built from the same policy (same filters, same arguments): its per-snapshot
    caches then hold the small variant fleets of preemption, not the hot path's."""

    def __init__(self, ext: Extender) -> None:
        self.ext = ext
        self.framework = Framework.from_config(ext.policy, plugins=ext.plugins)

    def __call__(self, args: PreemptionArgs) -> dict[str, Any]:
        ext = self.ext
        m = ext.metrics
        answer: dict[str, tuple[list[str], int]] = {}
        try:
            req = parse_pod(args.pod)
        except RequestError as exc:
            log.info("preempt: invalid pod %s: %s; no node kept", key_of(args.pod), exc)
            m.decisions.labels("preempt", "rejected").inc(len(args.nodes))
            return preemption_result(answer)
        if not req.wants_gpu:  # kelvin has no say: kube-scheduler's victims stand
            return preemption_result({n: (v.uids, v.pdb_violations) for n, v in args.nodes.items() if v.uids})
        snap = ext.cache.snapshot
        fleet = snap.arrays
        now = ext.clock()
        ctx = ext.framework.context(fleet, now)
        if self._refused(args, req.pod_key, ext.outage(ctx.stale, now)):
            m.decisions.labels("preempt", "rejected").inc(len(args.nodes))
            return preemption_result(answer)
        view = ext.framework.view(fleet, ctx)  # the ledger's binds count as taken
        assumed = ext.ledger.entries(now)
        budgets = ext.pdbs.index() if ext.pdbs is not None else None
        allowed = budgets.allowed if budgets is not None else ()
        gangs: Mapping[str, GangCost] | None = None
        costs: dict[str, Cost] = {}
        started = time.perf_counter()
        # kube-scheduler's own preference first (fewest victims): the nodes it would pick are judged first
        order = sorted(args.nodes.items(), key=lambda kv: (len(kv[1].uids), kv[1].pdb_violations))
        for done, (name, proposed) in enumerate(order):
            if len(answer) >= MAX_KEPT_NODES or time.perf_counter() - started > TIME_BUDGET_S:
                left = len(order) - done
                log.info(
                    "preempt: %s: %d node(s) kept, %d more not judged (at most %d nodes, %.1f s a request)",
                    req.pod_key, len(answer), left, MAX_KEPT_NODES, TIME_BUDGET_S,
                )  # fmt: skip
                m.decisions.labels("preempt", "rejected").inc(left)
                break
            row = fleet.index.get(name)
            nd = snap.node(name)
            if row is None or nd is None:
                log.warning("preempt: node %s is not in kelvin's snapshot; left out", name)
                m.preempt_unknown.labels("node").inc()
                m.decisions.labels("preempt", "rejected").inc()
                continue
            records = _records(nd.assignments, assumed.get(name, ()))
            cands, keep = self._candidates(name, proposed, records, now, budgets)
            if gangs is None and any(c.gang for c in cands):
                gangs = gang_costs(_all_records(snap.nodes, assumed), now)
            free = kube_free(records, len(nd.gpus), ext.settings.shared_slots_per_gpu)
            must = kube_counted(proposed.uids, cands, req.shared, req.count, free)
            choice = choose_victims(
                self.framework, view, row, req, cands, now, gangs=gangs, pick=False, allowed=allowed, must_free=must
            )
            if choice is None:
                log.info(
                    "preempt: %s: no set of lower-priority pods on %s frees a placement; left out", req.pod_key, name
                )
                m.decisions.labels("preempt", "rejected").inc()
                continue
            uids, pdb = _node_answer(choice, cands, keep, proposed, allowed)
            if not uids:
                log.info(
                    "preempt: %s: kelvin sees room on %s without evicting a pod it knows; left out", req.pod_key, name
                )
                m.decisions.labels("preempt", "rejected").inc()
                continue
            answer[name] = (uids, pdb)
            if choice.units:
                costs[name] = choice.cost
            log.info(
                "preempt: %s on %s: evict %s (kube-scheduler proposed %d; %s search, %d variants)",
                req.pod_key,
                name,
                ", ".join(c.pod_key for c in choice.victims) or "its own victims",
                len(proposed.uids),
                "exact" if choice.exact else "bounded",
                choice.evaluated,
            )
        answer = self._cheapest(req.pod_key, answer, costs)
        for uids, _ in answer.values():
            m.decisions.labels("preempt", "passed").inc()
            m.preempt_victims.inc(len(uids))
        # the preemptor's next filter, once kube-scheduler deleted these, is retried until kelvin's listing sees them go
        ext.pending_preemptions.record(req.pod_uid, {n: uids for n, (uids, _) in answer.items()}, now)
        return preemption_result(answer)

    @staticmethod
    def _refused(args: PreemptionArgs, pod_key: str, down: str | None) -> bool:
        """Whether no node is kept at all: the preemptor is a gang member, or kelvin's telemetry is out (logged)."""
        gang = eviction_facts(args.pod).gang
        if gang is not None:
            log.info(
                "preempt: %s is a member of gang %s: kelvin never preempts for one member; no node kept", pod_key, gang
            )
            return True
        if down is not None:
            log.warning("preempt: %s: %s; no node kept", pod_key, down)
            return True
        return False

    def _cheapest(
        self, pod_key: str, answer: dict[str, tuple[list[str], int]], costs: Mapping[str, Cost]
    ) -> dict[str, tuple[list[str], int]]:
        """Only the nodes of least cost are answered (ties all kept), and those where kelvin evicts no GPU pod:
        kube-scheduler picks one of the answered nodes by its own rules (PDB violations, victims' priorities, their
        count, start times), which know nothing of the progress a victim loses, so a costlier node left in could be
        the one it picks."""
        if not costs:
            return answer
        best = min(costs.values())
        dropped = [n for n, c in costs.items() if c != best]
        if dropped:
            log.info(
                "preempt: %s: %d node(s) left out, costlier than the cheapest (%s)",
                pod_key, len(dropped), ", ".join(sorted(dropped)[:5]),
            )  # fmt: skip
            self.ext.metrics.decisions.labels("preempt", "rejected").inc(len(dropped))
        return {n: v for n, v in answer.items() if n not in dropped}

    def _candidates(
        self,
        node: str,
        proposed: NodeVictims,
        records: list[GpuAssignment],
        now: float,
        budgets: BudgetIndex | None = None,
    ) -> tuple[list[Candidate], list[tuple[str, tuple[int, ...] | None]]]:
        """(candidates from kelvin's records, proposed victims that hold no GPU and are kept as they are: their UID
        and the listed budgets they match, None when kelvin cannot tell)."""
        by_uid = {a.pod_uid: a for a in records if a.pod_uid}
        pods = dict(zip(proposed.uids, proposed.pods, strict=True)) if proposed.pods is not None else {}
        violating = set(proposed.uids) if proposed.pdb_violations > 0 else set()
        keep: list[tuple[str, tuple[int, ...] | None]] = []
        for uid in proposed.uids:
            if uid in by_uid:
                continue
            pod = pods.get(uid)
            if pod is not None:
                try:
                    wants = parse_pod(pod).wants_gpu
                except RequestError:
                    wants = True
                if not wants:
                    keep.append((uid, None if budgets is None else budgets.matching(key_of(pod), _labels(pod))))
                    continue
            self.ext.metrics.preempt_unknown.labels("pod").inc()
            log.warning(
                "preempt: victim %s on %s: kelvin has no record of its GPUs on that node; left out",
                key_of(pod) if pod is not None else f"uid {uid}",
                node,
            )
        cands = []
        for a in by_uid.values():
            pod = pods.get(a.pod_uid or "")
            facts: EvictionFacts | None = eviction_facts(pod) if pod is not None else None
            priority = _priority(pod) if pod is not None else None
            known = facts if facts is not None else a.eviction
            if budgets is not None and known is not None:  # kelvin's own list: which budgets this pod falls under
                hits = budgets.matching(a.pod_key, known.label_map)
                cands.append(Candidate.of(a, now, facts=facts, priority=priority, budgets=hits))
            else:
                flag = a.pod_uid in violating
                cands.append(Candidate.of(a, now, facts=facts, priority=priority, pdb_violation=flag))
        return cands, keep


def _records(listed: Iterable[GpuAssignment], assumed: Iterable[GpuAssignment]) -> list[GpuAssignment]:
    out = list(listed)
    seen = {a.pod_key for a in out}
    out.extend(a for a in assumed if a.pod_key not in seen)
    return out


def _all_records(nodes: Iterable[Any], assumed: Mapping[str, Iterable[GpuAssignment]]) -> list[GpuAssignment]:
    out: list[GpuAssignment] = []
    for nd in nodes:
        out.extend(_records(nd.assignments, assumed.get(nd.name, ())))
    return out


def kube_counted(
    uids: Iterable[str], cands: Iterable[Candidate], shared: bool, count: int, free: tuple[int, int]
) -> tuple[int, int]:
    """The least that kube-scheduler's count needs freed on the node, in the resource the preemptor asks: (whole GPUs,
    shared-GPU slots). ``free``: what its count sees free on the node now (:func:`~..preemption.victims.kube_free`).

    Never more than the preemptor lacks by that count (``count`` whole GPUs, or its one slot, less what is free): a
    victim kube-scheduler chose for another resource (CPU, memory, a slot it did not lack) need not be matched. Never
    more than its own victims (those kelvin has records of) give back either: kube-scheduler reprieves every victim
    whose return still fits, so each was needed; a whole-GPU preemptor's victims give at least their GPUs less the
    smallest victim's plus one (a victim of 4 GPUs may have been kept for a need of 2)."""
    proposed = set(uids)
    counts = [kube_count(c.assignment) for c in cands if c.uid in proposed]
    if shared:
        return 0, min(sum(s for _, s in counts), max(0, 1 - free[1]))
    whole = [w for w, _ in counts if w]
    return min(sum(whole) - min(whole) + 1 if whole else 0, max(0, count - free[0])), 0


def _node_answer(
    choice: Choice,
    cands: Iterable[Candidate],
    keep: list[tuple[str, tuple[int, ...] | None]],
    proposed: NodeVictims,
    allowed: tuple[int, ...],
) -> tuple[list[str], int]:
    """The victims' UIDs answered for one node, and their PDB violations."""
    if not choice.units:  # room for the GPUs already: what kube-scheduler lacks is not a GPU
        known = {c.uid for c in cands} | {uid for uid, _ in keep}
        uids = [u for u in proposed.uids if u in known]
        return uids, min(proposed.pdb_violations, len(uids))
    uids = [c.uid for c in choice.victims] + [uid for uid, _ in keep]
    return uids, _answer_pdb(choice.victims, keep, proposed.pdb_violations > 0, allowed)


def _answer_pdb(
    victims: Iterable[Candidate],
    keep: Iterable[tuple[str, tuple[int, ...] | None]],
    flagged_node: bool,
    allowed: tuple[int, ...],
) -> int:
    """The PDB violations of the answer's victims on a node: kelvin's victims and the kept non-GPU ones together."""
    vs = list(victims)
    hits = [b for c in vs for b in c.budgets]
    unknown = 0
    for _uid, budgets in keep:
        if budgets is None:
            unknown += int(flagged_node)
        else:
            hits.extend(budgets)
    return sum(c.pdb_violation for c in vs) + violations(hits, allowed) + unknown


def _labels(pod: Mapping[str, Any]) -> dict[str, str]:
    meta = pod.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping):
        return {}
    return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}


def _priority(pod: Mapping[str, Any]) -> int | None:
    spec = pod.get("spec")
    p = spec.get("priority") if isinstance(spec, Mapping) else None
    return p if isinstance(p, int) and not isinstance(p, bool) else None
