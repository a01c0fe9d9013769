"""JSON for the shared model: :class:`GpuNode` (with its GPUs, processes and assignments) to and from JSON.

The exporter's ``/v1/node`` writes it; the scrape source reads it back. Validation is pydantic's over the model's own
dataclasses, so a bad document fails with :class:`ModelJSONError` naming each bad field by its path
(``gpus.0.memory_total_bytes: Input should be a valid integer``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import TypeAdapter, ValidationError

from .gpu import GpuNode

_NODE = TypeAdapter(GpuNode)
_NODES = TypeAdapter(list[GpuNode])


GPU_ERRORS_HEADER = "X-Kelvin-Gpu-Errors"
"""Response header of the exporter's ``/v1/node``: the GPUs NVML could not read this time, left out of the body (the
scrape source logs it)."""


class ModelJSONError(ValueError):
    """A JSON document that is not a valid node; the message names every bad field."""


def _explain(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "document"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


def node_to_json(node: GpuNode) -> bytes:
    return _NODE.dump_json(node)


def nodes_to_json(nodes: Sequence[GpuNode]) -> bytes:
    return _NODES.dump_json(list(nodes))


def node_from_json(data: bytes | str) -> GpuNode:
    try:
        return _NODE.validate_json(data)
    except ValidationError as exc:
        raise ModelJSONError(f"invalid node: {_explain(exc)}") from None


def nodes_from_json(data: bytes | str) -> list[GpuNode]:
    try:
        return _NODES.validate_json(data)
    except ValidationError as exc:
        raise ModelJSONError(f"invalid nodes: {_explain(exc)}") from None
