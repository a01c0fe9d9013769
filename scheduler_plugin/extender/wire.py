"""The kube-scheduler extender wire format (``k8s.io/kube-scheduler/extender/v1``), PascalCase on the wire.

The pydantic models document and validate the format; the embedded Pod and Node objects stay plain API JSON
(camelCase dicts) and are never validated field by field: a 5,000-node request must not pay for that. The hot path
uses :func:`parse_args`, which decodes with orjson and checks only the shape kelvin relies on, and
:func:`filter_result` / :func:`priority_list` to build replies that :func:`dumps` serialises with orjson.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field


class WireError(ValueError):
    """A request body kelvin cannot read; the message names the field and the problem (answered with HTTP 400)."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class NodeList(_Wire):
    """``v1.NodeList``: ``{"metadata": {}, "items": [Node, ...]}``."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    items: list[dict[str, Any]] = Field(default_factory=list)


class ExtenderArgs(_Wire):
    """Body of ``filter`` and ``prioritize``. ``Nodes`` when nodeCacheCapable is false, else ``NodeNames``."""

    Pod: dict[str, Any]
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class ExtenderFilterResult(_Wire):
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(_Wire):
    Host: str
    Score: int = Field(ge=0, le=10)


class ExtenderBindingArgs(_Wire):
    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class ExtenderBindingResult(_Wire):
    Error: str = ""


class ExplainArgs(_Wire):
    """Body of kelvin's own ``/explain``: a pod (API JSON) and the node to explain it on."""

    pod: dict[str, Any]
    node: str = Field(min_length=1)
    candidates: list[str] | None = None
    """Nodes the node competed with (scores are normalised among them); default: every node in the snapshot."""


@dataclass(frozen=True, slots=True)
class ParsedArgs:
    """What the hot path needs from :class:`ExtenderArgs`."""

    pod: Mapping[str, Any]
    names: list[str]
    node_objects: list[dict[str, Any]] | None
    """The Node objects as received (nodeCacheCapable false), in ``names`` order; ``None`` in names mode."""

    @property
    def node_cache_capable(self) -> bool:
        return self.node_objects is None


def _loads(body: bytes) -> Any:
    if not body:
        raise WireError("empty request body: expected a JSON object with Pod and Nodes or NodeNames")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"request body is not valid JSON: {exc}") from None


def _type_name(v: object) -> str:
    return "null" if v is None else type(v).__name__


def parse_args(body: bytes) -> ParsedArgs:
    """Decode an ``ExtenderArgs`` body. Raises :class:`WireError` naming the bad field."""
    data = _loads(body)
    if not isinstance(data, dict):
        raise WireError(f"request body must be a JSON object (ExtenderArgs), not {_type_name(data)}")
    pod = data.get("Pod")
    if not isinstance(pod, dict):
        raise WireError(f"Pod: must be a Pod object, not {_type_name(pod)}")
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise WireError("Pod.metadata.name: missing (the Pod must carry its metadata)")
    names_raw = data.get("NodeNames")
    nodes_raw = data.get("Nodes")
    if names_raw is not None:
        if not isinstance(names_raw, list):
            raise WireError(f"NodeNames: must be a list of node names, not {_type_name(names_raw)}")
        if not set(map(type, names_raw)) <= {str}:  # one C-level pass; JSON strings decode to exactly str
            i, n = next((i, n) for i, n in enumerate(names_raw) if not isinstance(n, str))
            raise WireError(f"NodeNames[{i}]: must be a string, not {_type_name(n)}")
        return ParsedArgs(pod=pod, names=names_raw, node_objects=None)
    if nodes_raw is None:
        raise WireError("Nodes and NodeNames are both null: one of them must list the candidate nodes")
    if not isinstance(nodes_raw, dict):
        raise WireError(f"Nodes: must be a NodeList object, not {_type_name(nodes_raw)}")
    items = nodes_raw.get("items")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise WireError(f"Nodes.items: must be a list of Node objects, not {_type_name(items)}")
    names: list[str] = []
    for i, nd in enumerate(items):
        meta = nd.get("metadata") if isinstance(nd, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str):
            raise WireError(f"Nodes.items[{i}].metadata.name: missing or not a string")
        names.append(name)
    return ParsedArgs(pod=pod, names=names, node_objects=items)


def parse_binding(body: bytes) -> ExtenderBindingArgs:
    data = _loads(body)
    if not isinstance(data, dict):
        raise WireError(f"request body must be a JSON object (ExtenderBindingArgs), not {_type_name(data)}")
    for key in ("PodName", "PodNamespace", "Node"):
        v = data.get(key)
        if not isinstance(v, str) or not v:
            raise WireError(f"{key}: must be a non-empty string, not {v!r}")
    uid = data.get("PodUID", "")
    if not isinstance(uid, str):
        raise WireError(f"PodUID: must be a string, not {_type_name(uid)}")
    return ExtenderBindingArgs(
        PodName=data["PodName"], PodNamespace=data["PodNamespace"], PodUID=uid, Node=data["Node"]
    )


def filter_result(
    args: ParsedArgs,
    passed: Sequence[int],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    error: str = "",
) -> dict[str, Any]:
    """An ``ExtenderFilterResult`` dict in the mode of the request. ``passed`` are positions in ``args.names``."""
    if args.node_objects is None:
        return {
            "Nodes": None,
            "NodeNames": list(map(args.names.__getitem__, passed)),
            "FailedNodes": dict(failed),
            "FailedAndUnresolvableNodes": dict(unresolvable),
            "Error": error,
        }
    return {
        "Nodes": {"metadata": {}, "items": [args.node_objects[i] for i in passed]},
        "NodeNames": None,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }


def error_result(message: str) -> dict[str, Any]:
    """A filter reply carrying only ``Error``: kube-scheduler marks the pod unschedulable with this message
    (``PodScheduled=False``, reason ``SchedulerError``) and retries with backoff; ignorable extenders are skipped."""
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}


def priority_list(names: Sequence[str], scores: Sequence[int]) -> list[dict[str, Any]]:
    """A ``HostPriorityList``; ``scores`` are Python ints (``ndarray.tolist()``), one per name."""
    return [{"Host": n, "Score": s} for n, s in zip(names, scores, strict=True)]


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
