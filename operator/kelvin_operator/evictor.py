"""The one evictor: the only code that removes pods. It alone owns the limits, the checkpoint handshake, the
policy/v1 Eviction API (a 429 from a PodDisruptionBudget means "later"), dry run, Events and eviction metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scheduler_plugin.kubeapi import KubeError
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.times import format_time

from .handshake import Step, decide
from .k8s import EvictResult, Kube, ObjectRef
from .limits import EvictionBudget
from .metrics import OperatorMetrics
from .pods import PodView
from .settings import OperatorConfig
from .stragglers import GangMove
from .strategies import Candidate

log = logging.getLogger("kelvin.operator.evictor")


@dataclass(frozen=True, slots=True)
class Outcome:
    pod: str
    reason: str
    result: str
    """``evicted``, ``pdb_blocked``, ``error``, ``dry_run``, ``limited``, ``gone``, ``checkpoint_requested``,
    ``checkpoint_pending``."""
    message: str = ""


def pod_ref(pod: PodView) -> ObjectRef:
    return ObjectRef(kind="Pod", name=pod.name, namespace=pod.namespace, uid=pod.uid or None)


class Evictor:
    """The only code that removes pods: works through the ranked candidates of one node (:meth:`act`).

    Owns the acting, not the deciding: the eviction limits (through the :class:`EvictionBudget` it is given), the
    checkpoint handshake, the policy/v1 Eviction API (a 429 from a PodDisruptionBudget means "later"), dry run, the
    Events and the eviction metrics. Built by the :class:`~kelvin_operator.reconcile.Reconciler` and living as long as
    it; its only state besides the budget is what it reported last cycle. Not thread-safe: called from the
    operator's event loop (the nodes' cycles interleave there, so each :meth:`act` keeps its own sets).

    An outcome that repeats while nothing changes (an eviction a PodDisruptionBudget keeps refusing, a limit that
    keeps holding a pod back, a dry run that would evict the same pod again) is reported once per episode: an INFO
    line and, where it has one, an Event on the first cycle; DEBUG and no new Event on the cycles after, for as long
    as the pod gets that same outcome cycle after cycle. Metrics count every cycle's outcome."""

    def __init__(self, kube: Kube, cfg: OperatorConfig, metrics: OperatorMetrics, budget: EvictionBudget) -> None:
        self.kube = kube
        self.cfg = cfg
        self.metrics = metrics
        self.budget = budget
        #: Per node, the (pod, result) pairs of the repeating outcomes (``pdb_blocked``, ``limited``, ``dry_run``) its
        #: last cycle reported.
        self.reported: dict[str, set[tuple[str, str]]] = {}
        #: The gangs a dry run already said it would move (their Events are posted once).
        self.gangs_told: set[str] = set()

    @property
    def dry(self) -> str:
        return "true" if self.cfg.dry_run else "false"

    async def act(self, node: str, ranked: Sequence[Candidate], now: float) -> list[Outcome]:
        """Work through ``ranked`` (safest first) within the limits. Call ``budget.new_cycle(node)`` before."""
        out: list[Outcome] = []
        before = self.reported.get(node, set())
        seen: set[tuple[str, str]] = set()

        def first(pod: PodView, result: str) -> bool:
            """Whether ``pod``'s ``result`` starts an episode (its last cycle on this node had another outcome)."""
            key = (pod.uid or pod.key, result)
            seen.add(key)
            return key not in before

        for c in ranked:
            refusal = self.budget.refusal(node, c.pod.namespace, now)
            if refusal is not None:
                self.metrics.evictions.labels(c.reason.value, "limited", self.dry).inc()
                say = log.info if first(c.pod, "limited") else log.debug
                say("not evicting %s (%s): %s", c.pod.key, c.reason.value, refusal)
                out.append(Outcome(c.pod.key, c.reason.value, "limited", refusal))
                continue
            out.append(await self._one(node, c, now, first))
        if seen:
            self.reported[node] = seen
        else:
            self.reported.pop(node, None)
        return out

    async def act_gang(self, node: str, move: GangMove, now: float) -> list[Outcome]:
        """Move a running gang as a whole (call ``budget.new_cycle(node)`` before; ``node``: the straggler's).

        The limits count a gang move as one eviction (one job disrupted, whatever its size), charged to the
        straggler's node and namespace: a gang of four would otherwise never fit the per-namespace default of two.
        Every member that asks for it (``kelvin.dev/checkpoint: "true"``) gets the checkpoint handshake; the gang is
        evicted once every one of them has answered or timed out, each member through the Eviction API (a member
        a PodDisruptionBudget blocks is retried on the next cycle while the straggler stays hot). Dry run: Events
        only."""
        c = move.straggler
        reason = c.reason.value
        refusal = self.budget.refusal(node, c.pod.namespace, now)
        if refusal is not None:
            self.metrics.gang_moves.labels("limited").inc()
            log.info("not moving gang %s: %s", move.gang, refusal)
            return [Outcome(m.key, reason, "limited", refusal) for m in move.members]
        pending: list[Outcome] = []
        for m in move.members:
            if not m.wants_checkpoint:
                continue
            d = decide(m.annotations, now, self.cfg.checkpoint.timeout_s)
            if d.step is Step.REQUEST and not self.cfg.dry_run:
                stamp = format_time(now)
                try:
                    await self.kube.annotate_pod(m.namespace, m.name, {ann.CHECKPOINT_REQUESTED: stamp})
                except KubeError as exc:
                    log.warning("could not request a checkpoint from %s: %s", m.key, exc)
                    pending.append(Outcome(m.key, reason, "error", str(exc)))
                    continue
                await self.kube.event(
                    pod_ref(m),
                    "CheckpointRequested",
                    f"kelvin will evict this pod with its gang ({move.detail}); checkpoint and answer "
                    f"{ann.CHECKPOINT_DONE}=<RFC 3339 time> within {self.cfg.checkpoint.timeout_s:g} s",
                )
                log.info("checkpoint requested from %s (gang %s) at %s", m.key, move.gang, stamp)
                pending.append(Outcome(m.key, reason, "checkpoint_requested", move.detail))
            elif d.step is Step.WAIT:
                pending.append(
                    Outcome(m.key, reason, "checkpoint_pending", f"waiting {d.waited_s:.0f} s for checkpoint")
                )
        if pending:
            self.budget.hold_node_slot(node)
            self.metrics.gang_moves.labels("checkpoint_pending").inc()
            return pending
        self.budget.record(node, c.pod.namespace, now)
        if self.cfg.dry_run:
            self.metrics.gang_moves.labels("dry_run").inc()
            told = move.gang in self.gangs_told
            self.gangs_told.add(move.gang)
            for m in move.members:
                self.metrics.evictions.labels(reason, "dry_run", "true").inc()
                if not told:
                    await self.kube.event(
                        pod_ref(m), "KelvinDryRunEviction", f"dry run: would evict ({reason}): {move.detail}"
                    )
            (log.debug if told else log.info)("dry run: would move %s", move.detail)
            return [Outcome(m.key, reason, "dry_run", move.detail) for m in move.members]
        out = [await self._evict_member(m, reason, move, now) for m in move.members]
        evicted = sum(o.result in ("evicted", "gone") for o in out)
        self.metrics.gang_moves.labels("evicted" if evicted == len(out) else "partly").inc()
        await self.kube.event(
            pod_ref(c.pod),
            "GangEvicted",
            f"{move.detail}: {evicted} of {len(out)} members evicted; the gang is planned again when recreated",
            warning=evicted != len(out),
        )
        log.info("%s: %d of %d members evicted", move.detail, evicted, len(out))
        return out

    async def _evict_member(self, m: PodView, reason: str, move: GangMove, now: float) -> Outcome:
        res = await self.kube.evict(m.namespace, m.name)
        if res.result is EvictResult.EVICTED:
            self.metrics.evictions.labels(reason, "evicted", "false").inc()
            how = ""
            if m.wants_checkpoint:
                step = decide(m.annotations, now, self.cfg.checkpoint.timeout_s)
                self.metrics.handshake.labels(step.step.value).observe(step.waited_s)
                how = f" after the gang's checkpoint handshake ({step.step.value}, {step.waited_s:.0f} s)"
            await self.kube.event(pod_ref(m), "KelvinEvicted", f"evicted ({reason}){how}: {move.detail}")
            return Outcome(m.key, reason, "evicted", move.detail)
        if res.result is EvictResult.PDB_BLOCKED:
            self.metrics.evictions.labels(reason, "pdb_blocked", "false").inc()
            await self.kube.event(
                pod_ref(m),
                "KelvinEvictionBlocked",
                f"eviction with its gang ({reason}) refused by a PodDisruptionBudget, will retry: {res.message}",
                warning=True,
            )
            return Outcome(m.key, reason, "pdb_blocked", res.message)
        if res.result is EvictResult.GONE:
            return Outcome(m.key, reason, "gone", res.message)
        self.metrics.evictions.labels(reason, "error", "false").inc()
        log.warning("eviction of %s (gang %s) failed: %s", m.key, move.gang, res.message)
        return Outcome(m.key, reason, "error", res.message)

    async def _one(self, node: str, c: Candidate, now: float, first: Callable[[PodView, str], bool]) -> Outcome:
        pod, reason = c.pod, c.reason.value
        step = None
        if pod.wants_checkpoint:
            d = decide(pod.annotations, now, self.cfg.checkpoint.timeout_s)
            step = d
            if d.step is Step.REQUEST and not self.cfg.dry_run:
                stamp = format_time(now)
                try:
                    await self.kube.annotate_pod(pod.namespace, pod.name, {ann.CHECKPOINT_REQUESTED: stamp})
                except KubeError as exc:
                    log.warning("could not request a checkpoint from %s: %s", pod.key, exc)
                    return Outcome(pod.key, reason, "error", str(exc))
                await self.kube.event(
                    pod_ref(pod),
                    "CheckpointRequested",
                    f"kelvin will evict this pod ({reason}: {c.detail}); checkpoint and answer "
                    f"{ann.CHECKPOINT_DONE}=<RFC 3339 time> within {self.cfg.checkpoint.timeout_s:g} s",
                )
                self.budget.hold_node_slot(node)
                log.info("checkpoint requested from %s at %s", pod.key, stamp)
                return Outcome(pod.key, reason, "checkpoint_requested", c.detail)
            if d.step is Step.WAIT:
                self.budget.hold_node_slot(node)
                return Outcome(pod.key, reason, "checkpoint_pending", f"waiting {d.waited_s:.0f} s for checkpoint")

        if self.cfg.dry_run:
            self.budget.record(node, pod.namespace, now)
            self.metrics.evictions.labels(reason, "dry_run", "true").inc()
            if not first(pod, "dry_run"):
                log.debug("dry run: would evict %s (%s): %s", pod.key, reason, c.detail)
                return Outcome(pod.key, reason, "dry_run", c.detail)
            await self.kube.event(pod_ref(pod), "KelvinDryRunEviction", f"dry run: would evict ({reason}): {c.detail}")
            log.info("dry run: would evict %s (%s): %s", pod.key, reason, c.detail)
            return Outcome(pod.key, reason, "dry_run", c.detail)

        res = await self.kube.evict(pod.namespace, pod.name)
        if res.result is EvictResult.EVICTED:
            self.budget.record(node, pod.namespace, now)
            self.metrics.evictions.labels(reason, "evicted", "false").inc()
            if step is not None and step.evict:
                self.metrics.handshake.labels(step.step.value).observe(step.waited_s)
            how = "" if step is None else f" after checkpoint handshake ({step.step.value}, {step.waited_s:.0f} s)"
            await self.kube.event(pod_ref(pod), "KelvinEvicted", f"evicted ({reason}){how}: {c.detail}")
            log.info("evicted %s (%s)%s: %s", pod.key, reason, how, c.detail)
            return Outcome(pod.key, reason, "evicted", c.detail)
        if res.result is EvictResult.PDB_BLOCKED:
            self.metrics.evictions.labels(reason, "pdb_blocked", "false").inc()
            if not first(pod, "pdb_blocked"):
                log.debug("eviction of %s still blocked by a PodDisruptionBudget: %s", pod.key, res.message)
                return Outcome(pod.key, reason, "pdb_blocked", res.message)
            await self.kube.event(
                pod_ref(pod),
                "KelvinEvictionBlocked",
                f"eviction ({reason}) refused by a PodDisruptionBudget, will retry: {res.message}",
                warning=True,
            )
            log.info("eviction of %s blocked by a PodDisruptionBudget: %s", pod.key, res.message)
            return Outcome(pod.key, reason, "pdb_blocked", res.message)
        if res.result is EvictResult.GONE:
            return Outcome(pod.key, reason, "gone", res.message)
        self.metrics.evictions.labels(reason, "error", "false").inc()
        log.warning("eviction of %s failed: %s", pod.key, res.message)
        return Outcome(pod.key, reason, "error", res.message)
