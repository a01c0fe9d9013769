"""Admission for gangs (multi-pod jobs, docs/jobs.md): pure decisions over a pod, wired up by the webhooks.

* :func:`refusal`: a pod whose gang cannot be understood is refused, naming the annotation and the fix (a
  ``kelvin.dev/gang-size`` that is not a positive integer, a ``kelvin.dev/gang-topology`` level the policy does not
  define, ``required=`` at a level no node carries the label of, a JobSet or LeaderWorkerSet pod missing its size).
* :func:`gated`: the pod's ``spec.schedulingGates`` with kelvin's ``kelvin.dev/gang`` gate added to a gang member
  (``None`` when there is nothing to add), so kube-scheduler does not place it before the operator has planned the
  whole gang and lifted the gate. Only when ``webhook.gangGates`` is on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler_plugin.gang import GangError, GangPolicy, read_gang
from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.snapshot import Snapshot


def refusal(
    pod: Mapping[str, Any],
    policy: GangPolicy,
    snapshot: Snapshot | None,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> str | None:
    """``None`` when the pod's gang (if any) is admissible, else the message to refuse it with. ``node_labels``: the
    Node objects' labels (the operator's index), which telemetry sources such as Prometheus do not carry."""
    try:
        ref = read_gang(pod, policy)
    except GangError as exc:
        return f"invalid gang: {exc}"
    if ref is None or ref.topology is None or not ref.topology.required:
        return None
    level = next((lv for lv in policy.levels if lv.name == ref.topology.level), None)
    nodes = snapshot.nodes if snapshot is not None else ()
    labels = node_labels or {}
    if level is not None and nodes and not any(level.label in (labels.get(nd.name) or nd.labels) for nd in nodes):
        return (
            f"invalid gang: {ann.GANG_TOPOLOGY}={ref.topology.describe()!r}: no node carries the label "
            f"{level.label} of level {level.name!r}, so the gang could never be placed; label the nodes, or ask "
            f"preferred={level.name}"
        )
    return None


def gated(pod: Mapping[str, Any], policy: GangPolicy) -> list[dict[str, Any]] | None:
    """The pod's scheduling gates with ``kelvin.dev/gang`` added, for a gang member without it; else ``None``. A pod
    whose gang cannot be read is left to the validating webhook."""
    try:
        ref = read_gang(pod, policy)
    except GangError:
        return None
    if ref is None:
        return None
    spec = pod.get("spec") or {}
    gates = spec.get("schedulingGates") if isinstance(spec, Mapping) else None
    current = [dict(g) for g in gates or [] if isinstance(g, Mapping)]
    if any(g.get("name") == ann.GANG_SCHEDULING_GATE for g in current):
        return None
    return [*current, {"name": ann.GANG_SCHEDULING_GATE}]
