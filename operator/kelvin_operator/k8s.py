"""The only module of the operator that talks to the Kubernetes API (through scheduler_plugin.kubeapi.KubeClient).

Writes are few and narrow: the policy/v1 Eviction subresource (never DELETE, never force), pod annotations for the
checkpoint handshake, the thermal taint on nodes, and core/v1 Events.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from scheduler_plugin.kubeapi import KubeClient, KubeError
from scheduler_plugin.model.times import format_time

log = logging.getLogger("kelvin.operator.k8s")
COMPONENT = "kelvin-operator"


class EvictResult(StrEnum):
    EVICTED = "evicted"
    PDB_BLOCKED = "pdb_blocked"
    GONE = "gone"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class EvictOutcome:
    result: EvictResult
    message: str = ""


@dataclass(frozen=True, slots=True)
class ObjectRef:
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None
    api_version: str = "v1"


class Kube(Protocol):
    """What the evictor and reconciler need from the API (a fake in pure tests, :class:`OperatorKube` for real)."""

    async def evict(self, namespace: str, name: str) -> EvictOutcome: ...

    async def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None: ...

    async def set_taint(self, node: str, key: str, value: str, effect: str, present: bool) -> bool: ...

    async def event(self, ref: ObjectRef, reason: str, message: str, *, warning: bool = False) -> None: ...


#: Where Events about cluster-scoped objects (Nodes) go: the API server accepts only "default" for a core/v1 Event
#: whose involvedObject has no namespace (as kubelet and kube-controller-manager record Node events); any other is
#: refused with 422 "involvedObject.namespace ... does not match event.namespace".
CLUSTER_SCOPED_EVENTS_NAMESPACE = "default"


class OperatorKube:
    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.instance = os.environ.get("HOSTNAME", "kelvin-operator")

    async def evict(self, namespace: str, name: str) -> EvictOutcome:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        try:
            await self.client.post(f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body)
        except KubeError as exc:
            if exc.status == 429:
                return EvictOutcome(EvictResult.PDB_BLOCKED, str(exc.body.get("message") or exc))
            if exc.status == 404:
                return EvictOutcome(EvictResult.GONE, "pod no longer exists")
            return EvictOutcome(EvictResult.ERROR, str(exc))
        return EvictOutcome(EvictResult.EVICTED)

    async def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        await self.client.patch_merge(
            f"/api/v1/namespaces/{namespace}/pods/{name}", {"metadata": {"annotations": dict(annotations)}}
        )

    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """A JSON merge patch of a pod (the gang planner: its plan annotations and its scheduling gates)."""
        await self.client.patch_merge(f"/api/v1/namespaces/{namespace}/pods/{name}", dict(patch))

    async def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        """A batch/v1 Job (the gang planner reads an Indexed Job's ``spec.parallelism``); raises ``KubeError``."""
        return await self.client.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")

    async def set_taint(self, node: str, key: str, value: str, effect: str, present: bool) -> bool:
        """Add (``present``) or remove the taint ``key``; returns whether the node changed.

        The merge patch carries the node's resourceVersion, so a concurrent change makes it fail (409) rather than
        overwrite other taints; the next cycle retries.
        """
        obj = await self.client.get(f"/api/v1/nodes/{node}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if not rv:
            # Without it the merge patch could not fail on a concurrent change and would replace the taint list.
            raise KubeError(0, f"GET /api/v1/nodes/{node}: node has no metadata.resourceVersion; not patching taints")
        taints: list[dict[str, Any]] = list((obj.get("spec") or {}).get("taints") or [])
        ours = [t for t in taints if t.get("key") == key]
        wanted = {"key": key, "value": value, "effect": effect}
        if present:
            if len(ours) == 1 and ours[0].get("value") == value and ours[0].get("effect") == effect:
                return False
            new = [t for t in taints if t.get("key") != key] + [{**wanted, "timeAdded": format_time_s()}]
        else:
            if not ours:
                return False
            new = [t for t in taints if t.get("key") != key]
        patch: dict[str, Any] = {"spec": {"taints": new}, "metadata": {"resourceVersion": rv}}
        await self.client.patch_merge(f"/api/v1/nodes/{node}", patch)
        return True

    async def event(self, ref: ObjectRef, reason: str, message: str, *, warning: bool = False) -> None:
        """Post a core/v1 Event; failures are logged, never raised (an Event is not worth a failed cycle)."""
        ns = ref.namespace or CLUSTER_SCOPED_EVENTS_NAMESPACE
        now = format_time_s()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{ref.name}.{uuid.uuid4().hex[:16]}", "namespace": ns},
            "involvedObject": {
                k: v
                for k, v in {
                    "apiVersion": ref.api_version,
                    "kind": ref.kind,
                    "name": ref.name,
                    "namespace": ref.namespace,
                    "uid": ref.uid,
                }.items()
                if v
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": "kelvin.dev/operator",
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.client.post(f"/api/v1/namespaces/{ns}/events", body)
        except KubeError as exc:
            log.warning("could not post event %s on %s %s: %s", reason, ref.kind, ref.name, exc)


def format_time_s() -> str:
    """Now, RFC 3339 to the second (the format of Kubernetes' own timestamps)."""
    return format_time(time.time()).split(".")[0] + "Z"
