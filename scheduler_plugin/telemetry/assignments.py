"""kelvin's record of GPU shares on a real cluster: the ``kelvin.dev/gpu-assigned`` annotations the binder writes.

Telemetry shows memory in use, not who holds a share of a GPU; the pods kelvin bound carry the GPU indices it chose.
:func:`assignments_from_pods` turns a pod list into :class:`~scheduler_plugin.model.GpuAssignment` records (pure);
:class:`AssignedSource` wraps any telemetry source and merges the records of a periodic pod list into its nodes, so
that the snapshot's ``GpuNode.assignments`` (and the ledger's reconcile) see every pod kelvin placed.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..kubeapi import KubeClient, KubeError
from ..model import GpuAssignment, GpuNode, RequestError, parse_bound_pod
from ..model import annotations as ann
from ..model.claim import claim_of, parse_gpu_indices
from ..model.eviction import eviction_facts
from ..model.pod import key_of
from .source import SourceError, TelemetrySource

log = logging.getLogger(__name__)

_DONE_PHASES = frozenset({"Succeeded", "Failed"})


def assignment_of_pod(pod: Mapping[str, Any]) -> tuple[str, GpuAssignment] | None:
    """(node, assignment) for a running or pending pod kelvin bound; None for any other pod."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    annotations = meta.get("annotations") or {}
    if status.get("phase") in _DONE_PHASES:
        return None
    raw = annotations.get(ann.GPU_ASSIGNED)
    gpus = parse_gpu_indices(raw)
    node = spec.get("nodeName") or annotations.get(ann.GPU_ASSIGNED_NODE)
    if raw is not None and gpus is None:
        key = key_of(pod)
        _warn_once(
            str(meta.get("uid") or key),
            "pod %s: %s=%r is not a list of GPU indices; ignored",
            key,
            ann.GPU_ASSIGNED,
            raw,
        )
    if gpus is None or not isinstance(node, str) or not node:
        return None
    if annotations.get(ann.GPU_ASSIGNED_NODE) not in (None, node):
        return None  # the indices refer to another node: a stale annotation
    key = key_of(pod)
    uid = str(meta.get("uid") or "") or None
    try:
        req, warning = parse_bound_pod(pod)
    except RequestError as exc:
        log.info("pod %s: %s; counting its GPUs %s as whole", key, exc, gpus)
        return node, GpuAssignment(pod_key=key, gpu_indices=gpus, pod_uid=uid, eviction=eviction_facts(pod))
    if warning:
        _warn_once(uid or key, "pod %s: %s", key, warning)
    return node, replace(claim_of(req, gpus, pod_key=key, pod_uid=uid), eviction=eviction_facts(pod))


_WARNED: OrderedDict[str, None] = OrderedDict()
_WARNED_MAX = 10_000


def _warn_once(pod: str, msg: str, *args: object) -> None:
    """Log a warning about ``pod`` the first time only (the listing repeats every few seconds); bounded memory."""
    if pod in _WARNED:
        return
    _WARNED[pod] = None
    while len(_WARNED) > _WARNED_MAX:
        _WARNED.popitem(last=False)
    log.warning(msg, *args)


def planned_assignment_of_pod(pod: Mapping[str, Any]) -> tuple[str, GpuAssignment] | None:
    """(node, assignment) for a gang member the operator planned that is not bound yet (``kelvin.dev/gang-planned-*``,
    docs/jobs.md): its planned GPUs count as taken, so no other pod takes them before it binds. Recorded without the
    pod's UID: the pod is not bound, and the extender's bind must not take the plan for an earlier bind of it."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if (pod.get("spec") or {}).get("nodeName") or ann.GPU_ASSIGNED in annotations:
        return None
    node = annotations.get(ann.GANG_PLANNED_NODE)
    gpus = parse_gpu_indices(annotations.get(ann.GANG_PLANNED_GPUS))
    if not isinstance(node, str) or not node or not gpus or (pod.get("status") or {}).get("phase") in _DONE_PHASES:
        return None
    key = key_of(pod)
    try:
        req, _ = parse_bound_pod(pod)
    except RequestError:
        return node, GpuAssignment(pod_key=key, gpu_indices=gpus, gang_plan=True)
    return node, replace(claim_of(req, gpus, pod_key=key), pod_uid=None, gang_plan=True)


def assignments_from_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, list[GpuAssignment]]:
    out: dict[str, list[GpuAssignment]] = {}
    for pod in pods:
        got = assignment_of_pod(pod) or planned_assignment_of_pod(pod)
        if got is not None:
            out.setdefault(got[0], []).append(got[1])
    return out


def merge_assignments(nodes: Sequence[GpuNode], extra: Mapping[str, Sequence[GpuAssignment]]) -> list[GpuNode]:
    """Nodes with ``extra`` assignments added (a pod the node already lists is not added twice)."""
    out = []
    for nd in nodes:
        add = extra.get(nd.name)
        if not add:
            out.append(nd)
            continue
        have = {a.pod_key for a in nd.assignments}
        new = tuple(a for a in add if a.pod_key not in have)
        out.append(replace(nd, assignments=nd.assignments + new) if new else nd)
    return out


async def list_assigned_pods(client: KubeClient, page_size: int = 500) -> dict[str, list[GpuAssignment]]:
    """List every pod (paginated) and return kelvin's GPU assignments per node."""
    pods: list[Mapping[str, Any]] = []
    cont = ""
    while True:
        params = {"limit": str(page_size)}
        if cont:
            params["continue"] = cont
        body = await client.get("/api/v1/pods", params=params)
        pods.extend(p for p in body.get("items") or [] if isinstance(p, Mapping))
        cont = str((body.get("metadata") or {}).get("continue") or "")
        if not cont:
            return assignments_from_pods(pods)


class AssignedSource:
    """A telemetry source whose nodes also carry the assignments recorded on pods (listed at most every
    ``list_interval_s``; when a list fails, the previous record is used and the failure logged)."""

    def __init__(
        self,
        inner: TelemetrySource,
        client: KubeClient,
        *,
        list_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.client = client
        self.list_interval_s = list_interval_s
        self.clock = clock
        self._record: dict[str, list[GpuAssignment]] = {}
        self._listed_at = float("-inf")
        self.list_error: str | None = None

    async def fetch(self) -> Sequence[GpuNode]:
        nodes = await self.inner.fetch()
        now = self.clock()
        if now - self._listed_at >= self.list_interval_s:
            try:
                self._record = await list_assigned_pods(self.client)
                self._listed_at = now
                self.list_error = None
            except KubeError as exc:
                self.list_error = str(exc)
                log.warning("listing pods for GPU assignments failed, using the previous record: %s", exc)
                if not self._record and exc.status in (401, 403):
                    raise SourceError(f"cannot list pods for GPU assignments: {exc}") from exc
        return merge_assignments(nodes, self._record)

    @property
    def bad_samples(self) -> Mapping[str, int]:
        """The inner source's counts of dropped or corrected samples (see :class:`~.sanity.SampleIssues`)."""
        counts = getattr(self.inner, "bad_samples", None)
        return counts if isinstance(counts, Mapping) else {}

    async def close(self) -> None:
        await self.inner.close()
