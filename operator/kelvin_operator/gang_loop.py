"""The operator's gang planner loop: plan gated gangs with the pure planner, write the plans, lift the gates.

One :class:`GangLoop` per operator. :meth:`GangLoop.run` takes the gated pods of one gang (from the kopf index),
the telemetry snapshot and the nodes' labels, and calls :func:`scheduler_plugin.gang.cycle.plan_gang`: a planned gang
gets one merge patch per member (plan annotations, kelvin's gate removed) and its capacity assumed in the planner's
own ledger (so the next gang planned before the pod listing shows it does not take it); a gang that cannot be placed
gets a Warning Event on its first member, once per distinct reason, and holds nothing. In dry run nothing is
written but the Events.

:meth:`GangLoop.replan` takes the ungated members of one gang (planned or bound) and re-plans it when the plan of a
member not yet bound went stale (``scheduler_plugin.gang.cycle.replan_gang``): new plan annotations, a
``GangReplanned`` Event with the reason, ``kelvin_operator_gang_replans_total``.

An Indexed Job's gang size is the Job's ``spec.parallelism``: read from the API (the pod's owner reference) when the
pods carry no ``kelvin.dev/gang-size``; a Job that cannot be read leaves the gang gated, with a ``GangSizeUnknown``
Warning Event once per reason.

The planner uses the default scoring policies with the operator's ``hotness`` and ``gang`` settings (the policy
file's shared sections).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from scheduler_plugin.gang.cycle import Decision, GatedMember, gated_member, plan_gang, replan_gang
from scheduler_plugin.gang.planner import GangPlanner, assume
from scheduler_plugin.gang.readers import JOB_NAME, size_of_job
from scheduler_plugin.gang.topology import build_domains
from scheduler_plugin.kubeapi import KubeError
from scheduler_plugin.model.gpu import GpuNode
from scheduler_plugin.model.pod import key_of
from scheduler_plugin.model.snapshot import Snapshot
from scheduler_plugin.policies.framework import Framework
from scheduler_plugin.policies.policy_file import PolicyConfig

from .k8s import ObjectRef
from .metrics import OperatorMetrics
from .settings import OperatorConfig

log = logging.getLogger("kelvin.operator.gangs")


class GangKube(Protocol):
    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None: ...

    async def event(self, ref: ObjectRef, reason: str, message: str, *, warning: bool = False) -> None: ...

    async def get_job(self, namespace: str, name: str) -> Mapping[str, Any]: ...


def job_of(pod: Mapping[str, Any]) -> str | None:
    """The name of the Job that owns ``pod`` (its controller owner reference), else its ``job-name`` label."""
    meta = pod.get("metadata") or {}
    for o in meta.get("ownerReferences") or []:
        if isinstance(o, Mapping) and o.get("kind") == "Job" and str(o.get("apiVersion", "")).startswith("batch/"):
            return str(o.get("name") or "") or None
    labels = meta.get("labels") or {}
    name = labels.get(JOB_NAME) if isinstance(labels, Mapping) else None
    return str(name) if name else None


class GangLoop:
    def __init__(
        self, cfg: OperatorConfig, kube: GangKube, interval_s: float = 5.0, metrics: OperatorMetrics | None = None
    ) -> None:
        self.cfg = cfg
        self.kube = kube
        self.interval_s = interval_s
        self.metrics = metrics or OperatorMetrics()
        self._last = float("-inf")
        fw = Framework.from_config(PolicyConfig(hotness=cfg.hotness))
        self.planner = GangPlanner(fw, cfg.gang, hotness=cfg.hotness)
        self._told: dict[str, str] = {}
        #: Dry run: the re-plan last reported per gang (not written, so found stale again on every pass).
        self._dry_replanned: dict[str, str] = {}

    def due(self, now: float) -> bool:
        """Whether a planning pass is due (at most one per ``interval_s``); marks it started."""
        if now - self._last < self.interval_s:
            return False
        self._last = now
        return True

    async def run(
        self,
        pods: Sequence[Mapping[str, Any]],
        snapshot: Snapshot,
        node_labels: Mapping[str, Mapping[str, str]],
        now: float,
    ) -> Decision | None:
        """Plan the gang of ``pods`` (its gated members); ``None`` when none of them is a gated member."""
        members = [m for p in pods if (m := gated_member(p, self.cfg.gang)) is not None]
        if not members:
            return None
        gang_key = members[0].ref.key
        members = [m for m in members if m.ref.key == gang_key]
        by_key = {key_of(p): p for p in pods}
        first = members[0]
        ref = ObjectRef("Pod", first.name, first.namespace)
        size = first.ref.size
        if size is None:
            size, unknown = await self._job_size(first, by_key[first.key])
            if size is None:
                await self._tell(gang_key, ref, "GangSizeUnknown", unknown)
                return Decision(gang_key, {}, unknown, False, waiting=True)
        fleet = snapshot.arrays
        labels = [dict(node_labels.get(nd.name) or nd.labels) for nd in snapshot.nodes]
        domains = build_domains(fleet.names, labels, self.cfg.gang)
        fw = self.planner.fw
        d = plan_gang(members, by_key, size, self.planner, fleet, domains, fw.context(fleet, now))
        if d.waiting:
            return d
        if not d.planned:
            await self._tell(gang_key, ref, "GangNotPlaced", d.reason)
            return d
        self._told.pop(gang_key, None)
        await self._write(d, now)
        await self.kube.event(ref, "GangPlanned", d.reason)
        return d

    async def replan(
        self,
        pods: Sequence[Mapping[str, Any]],
        snapshot: Snapshot,
        node_labels: Mapping[str, Mapping[str, str]],
        now: float,
    ) -> Decision | None:
        """Re-plan the gang of ``pods`` (its ungated members) if a member not yet bound has a stale plan; ``None``
        when nothing is stale."""

        def labels_of(nd: GpuNode) -> Mapping[str, str]:
            return node_labels.get(nd.name) or nd.labels

        d = replan_gang(pods, self.planner, snapshot, labels_of, now)
        if d is None:
            return None
        first = next(iter(sorted(d.stale)))
        ns, _, name = first.partition("/")
        ref = ObjectRef("Pod", name, ns)
        if not d.planned:
            self.metrics.gang_replans.labels("waiting").inc()
            await self._tell(d.gang, ref, "GangNotPlaced", d.reason)
            return d
        self._told.pop(d.gang, None)
        if self.cfg.dry_run and self._dry_replanned.get(d.gang) == d.reason:
            return d  # nothing was written, so the same plan is stale again every pass: told once
        self._dry_replanned[d.gang] = d.reason
        self.metrics.gang_replans.labels("replanned").inc()
        await self._write(d, now)
        await self.kube.event(ref, "GangReplanned", d.reason)
        return d

    async def _write(self, d: Decision, now: float) -> None:
        """Assume the plan in the planner's ledger and write its patches (not in dry run)."""
        if d.plan is not None:
            assume(self.planner.fw, d.plan, now)
        if not self.cfg.dry_run:
            # a re-plan is written member by member: first the members whose old plan still holds (they could bind
            # on it meanwhile), then the stale ones (the extender refuses those anyway); a member that binds on its
            # old plan in between is caught by the next pass (cycle.outside_bound_domain)
            for key, patch in sorted(d.patches.items(), key=lambda kv: kv[0] in d.stale):
                ns, _, name = key.partition("/")
                await self.kube.patch_pod(ns, name, patch)
        log.info("%s%s", d.reason, " (dry run: not written)" if self.cfg.dry_run else "")

    async def _tell(self, gang: str, ref: ObjectRef, reason: str, message: str) -> None:
        """A Warning Event on ``ref``, once per distinct message for ``gang``."""
        if self._told.get(gang) == message:
            return
        self._told[gang] = message
        log.info("%s", message)
        await self.kube.event(ref, reason, message, warning=True)

    async def _job_size(self, member: GatedMember, pod: Mapping[str, Any]) -> tuple[int | None, str]:
        """An Indexed Job gang's size (its Job's ``spec.parallelism``), or ``None`` and why it is not known."""
        job = job_of(pod)
        gang = member.ref.key
        if member.ref.kind != "indexed-job" or job is None:
            return None, f"gang {gang}: its size is not known (no kelvin.dev/gang-size and no Job owns the pods)"
        try:
            body = await self.kube.get_job(member.namespace, job)
        except KubeError as exc:
            what = "is not found" if exc.status == 404 else f"cannot be read ({exc})"
            return None, (
                f"gang {gang}: its Job {member.namespace}/{job} {what}, so its size (spec.parallelism) is not known; "
                "the members stay gated (set kelvin.dev/gang-size on the pod template to plan without it)"
            )
        size = size_of_job(body)
        if size is None:
            return None, f"gang {gang}: its Job {member.namespace}/{job} has no usable spec.parallelism"
        return size, ""
