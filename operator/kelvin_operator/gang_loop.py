"""The operator's gang planner loop: plan gated gangs with the pure planner, write the plans, lift the gates.

One :class:`GangLoop` per operator. :meth:`GangLoop.run` takes the gated pods of one gang (from the kopf index),
the telemetry snapshot and the nodes' labels, and calls :func:`scheduler_plugin.gang.cycle.plan_gang`: a planned gang
gets one merge patch per member (plan annotations, kelvin's gate removed) and its capacity assumed in the planner's
own ledger (so the next gang planned before the pod listing shows it does not take it); a gang that cannot be placed
gets a Warning Event on its first member, once per distinct reason, and holds nothing. In dry run nothing is
written but the Events.

The planner uses the default scoring policies with the operator's ``hotness`` and ``gang`` settings (the policy
file's shared sections).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from scheduler_plugin.gang.cycle import Decision, gated_member, plan_gang
from scheduler_plugin.gang.planner import GangPlanner, assume
from scheduler_plugin.gang.topology import build_domains
from scheduler_plugin.model.pod import key_of
from scheduler_plugin.model.snapshot import Snapshot
from scheduler_plugin.policies.framework import Framework
from scheduler_plugin.policies.policy_file import PolicyConfig

from .k8s import ObjectRef
from .settings import OperatorConfig

log = logging.getLogger("kelvin.operator.gangs")


class GangKube(Protocol):
    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None: ...

    async def event(self, ref: ObjectRef, reason: str, message: str, *, warning: bool = False) -> None: ...


class GangLoop:
    def __init__(self, cfg: OperatorConfig, kube: GangKube, interval_s: float = 5.0) -> None:
        self.cfg = cfg
        self.kube = kube
        self.interval_s = interval_s
        self._last = float("-inf")
        fw = Framework.from_config(PolicyConfig(hotness=cfg.hotness))
        self.planner = GangPlanner(fw, cfg.gang, hotness=cfg.hotness)
        self._told: dict[str, str] = {}

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
        fleet = snapshot.arrays
        labels = [dict(node_labels.get(nd.name) or nd.labels) for nd in snapshot.nodes]
        domains = build_domains(fleet.names, labels, self.cfg.gang)
        fw = self.planner.fw
        d = plan_gang(members, by_key, members[0].ref.size, self.planner, fleet, domains, fw.context(fleet, now))
        if d.waiting:
            return d
        first = members[0]
        ref = ObjectRef("Pod", first.name, first.namespace)
        if not d.planned:
            if self._told.get(gang_key) != d.reason:
                self._told[gang_key] = d.reason
                log.info("%s", d.reason)
                await self.kube.event(ref, "GangNotPlaced", d.reason, warning=True)
            return d
        self._told.pop(gang_key, None)
        if d.plan is not None:
            assume(fw, d.plan, now)
        if not self.cfg.dry_run:
            for key, patch in d.patches.items():
                ns, _, name = key.partition("/")
                await self.kube.patch_pod(ns, name, patch)
        log.info("%s%s", d.reason, " (dry run: not written)" if self.cfg.dry_run else "")
        await self.kube.event(ref, "GangPlanned", d.reason)
        return d
