"""The preempt verb's wire format (``k8s.io/kube-scheduler/extender/v1``), PascalCase like the other verbs.

``ExtenderPreemptionArgs``::

    {"Pod": {...},
     "NodeNameToVictims": {"node": {"Pods": [Pod, ...], "NumPDBViolations": 1}},        # nodeCacheCapable: false
     "NodeNameToMetaVictims": {"node": {"Pods": [{"UID": "..."}], "NumPDBViolations": 1}}}  # nodeCacheCapable: true

kube-scheduler fills one of the two maps (the victims its own, count-based, preemption chose on each candidate
node). The answer, ``ExtenderPreemptionResult``, is always ``{"NodeNameToMetaVictims": {...}}``: the nodes kept,
each with the UIDs of the pods to evict there (kube-scheduler finds them by UID among the node's pods) and the
PodDisruptionBudget violations that causes.

Decoded with msgspec (the victims' Pod objects into dicts: kelvin reads their annotations and priority) and checked
by hand, so that a malformed body gets a 400 naming the field: ``NodeNameToMetaVictims["n1"].Pods[0].UID: ...``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

from .errors import WireError, too_many_names
from .wire import _check_pod, _type_name


@dataclass(frozen=True, slots=True)
class NodeVictims:
    """kube-scheduler's victims on one node."""

    uids: list[str]
    pods: list[Mapping[str, Any]] | None
    """The victims' Pod objects (``NodeNameToVictims``), in ``uids`` order; ``None`` in meta mode."""
    pdb_violations: int


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    pod: Mapping[str, Any]
    nodes: dict[str, NodeVictims]
    meta: bool
    """The scheduler sent ``NodeNameToMetaVictims`` (UIDs only)."""


class _Args(msgspec.Struct):
    Pod: Any = None
    NodeNameToVictims: Any = None
    NodeNameToMetaVictims: Any = None


_ARGS = msgspec.json.Decoder(_Args)


def _count(value: Any, field: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise WireError(f"{field}: must be a non-negative integer, not {value!r}")
    return value


def _node_victims(name: str, raw: Any, field: str, meta: bool) -> NodeVictims:
    at = f"{field}[{orjson.dumps(name).decode()}]"
    if not isinstance(raw, dict):
        raise WireError(f"{at}: must be a Victims object with Pods and NumPDBViolations, not {_type_name(raw)}")
    pods_raw = raw.get("Pods")
    pods_raw = [] if pods_raw is None else pods_raw
    if not isinstance(pods_raw, list):
        raise WireError(f"{at}.Pods: must be a list, not {_type_name(pods_raw)}")
    uids: list[str] = []
    pods: list[Mapping[str, Any]] = []
    for i, p in enumerate(pods_raw):
        if not isinstance(p, dict):
            raise WireError(f"{at}.Pods[{i}]: must be an object, not {_type_name(p)}")
        if meta:
            uid = p.get("UID")
            where = f"{at}.Pods[{i}].UID"
        else:
            m = p.get("metadata")
            uid = m.get("uid") if isinstance(m, dict) else None
            where = f"{at}.Pods[{i}].metadata.uid"
            pods.append(p)
        if not isinstance(uid, str) or not uid:
            raise WireError(f"{where}: must be a non-empty string (the victim's pod UID), not {uid!r}")
        uids.append(uid)
    return NodeVictims(
        uids=uids,
        pods=None if meta else pods,
        pdb_violations=_count(raw.get("NumPDBViolations"), f"{at}.NumPDBViolations"),
    )


def parse_preemption(body: bytes, *, max_node_names: int | None = None) -> PreemptionArgs:
    """Decode an ``ExtenderPreemptionArgs`` body; raises :class:`WireError` naming the bad field (:class:`TooLarge`
    over ``max_node_names`` nodes)."""
    expected = "a JSON object with Pod and NodeNameToVictims or NodeNameToMetaVictims (ExtenderPreemptionArgs)"
    if not body:
        raise WireError(f"empty request body: expected {expected}")
    try:
        data = _ARGS.decode(body)
    except msgspec.ValidationError:
        raise WireError(f"request body must be {expected}") from None
    except msgspec.DecodeError as exc:
        raise WireError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise WireError("request body is not valid JSON: nested too deeply") from None
    _check_pod(data.Pod)
    if data.NodeNameToVictims is not None:
        field, raw, meta = "NodeNameToVictims", data.NodeNameToVictims, False
    elif data.NodeNameToMetaVictims is not None:
        field, raw, meta = "NodeNameToMetaVictims", data.NodeNameToMetaVictims, True
    else:
        raise WireError(
            "NodeNameToVictims and NodeNameToMetaVictims are both null: one of them must map nodes to victims"
        )
    if not isinstance(raw, dict):
        raise WireError(f"{field}: must be an object mapping node names to victims, not {_type_name(raw)}")
    if max_node_names is not None and len(raw) > max_node_names:
        raise too_many_names(field, len(raw), max_node_names)
    nodes = {name: _node_victims(name, v, field, meta) for name, v in raw.items()}
    return PreemptionArgs(pod=data.Pod, nodes=nodes, meta=meta)


def preemption_result(victims: Mapping[str, tuple[Sequence[str], int]]) -> dict[str, Any]:
    """An ``ExtenderPreemptionResult``: node -> (victim UIDs, PDB violations)."""
    return {
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb} for node, (uids, pdb) in victims.items()
        }
    }
