"""A pod's GPU request, parsed from the pod object (camelCase Kubernetes API JSON) or built directly."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from . import annotations as ann
from .claim import NEVER_FITS, charge_milli_array
from .deprecation import REMOVED_IN
from .gpu import MIB, MILLI_PER_GPU
from .pod import PodResources, RequestError, or_empty, pod_key, pod_parts
from .quantity import QuantityError, parse_bytes, parse_cpu_milli, parse_quantity
from .times import parse_time


class Topology(StrEnum):
    NVLINK_REQUIRED = "nvlink-required"
    NVLINK_PREFERRED = "nvlink-preferred"
    ANY = "any"


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What a pod asks of a node's GPUs.

    ``count`` GPUs, each needing ``milli`` thousandths of a GPU and/or ``memory_bytes`` of GPU memory. A whole GPU is
    ``milli == 1000`` and ``memory_bytes is None``. A shared GPU (``count == 1``) has ``milli < 1000`` or a memory pool.
    """

    count: int = 0
    milli: int | None = MILLI_PER_GPU
    memory_bytes: int | None = None
    models: frozenset[str] | None = None
    topology: Topology = Topology.ANY
    max_temperature: float | None = None
    cpu_milli: int = 0
    host_memory_bytes: int = 0
    pod_key: str = ""
    pod_uid: str = ""
    priority: int = 0
    pending_since: float | None = None
    """Unix time the pod began waiting to be placed (its creation; a pod evicted and created again waits anew),
    ``None`` when unknown. The ``thermal`` policy prices a pod's wait against the throttling of placing it now."""

    @property
    def wants_gpu(self) -> bool:
        return self.count > 0

    @property
    def shared(self) -> bool:
        return self.count == 1 and (self.memory_bytes is not None or (self.milli or MILLI_PER_GPU) < MILLI_PER_GPU)

    @property
    def whole(self) -> bool:
        return self.count > 0 and not self.shared

    def demand_milli(self, mem_total: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
        """Thousandths of each GPU slot this request needs on one GPU (broadcast over ``mem_total``'s shape)."""
        if not self.shared:
            return np.full(mem_total.shape, MILLI_PER_GPU, dtype=np.int32)
        share = self.milli or 0
        if self.memory_bytes is None:  # no pool: the share on every GPU, whatever its memory (charge_milli_array)
            return np.full(mem_total.shape, min(max(share, 1), NEVER_FITS), dtype=np.int32)
        pool = np.int64(self.memory_bytes)
        return charge_milli_array(np.int64(share), pool, mem_total).astype(np.int32)  # > 1000 means "never fits"

    def describe(self) -> str:
        if not self.wants_gpu:
            return "no GPU"
        if self.shared:
            parts = []
            if self.memory_bytes is not None:
                parts.append(f"{self.memory_bytes / 2**30:g} GiB")
            if self.milli is not None and self.milli < MILLI_PER_GPU:
                parts.append(f"{self.milli / 10:g}% of compute")
            return "a share of one GPU (" + ", ".join(parts) + ")"
        return f"{self.count} whole GPU" + ("s" if self.count > 1 else "")


MAX_GPUS_PER_POD = 1024
"""More whole GPUs than any node has; larger counts are rejected as malformed instead of overflowing arrays."""


def parse_gpu_count(raw: Any) -> int:
    """A count of GPUs (or shared-GPU slots) as one container gives it: a whole number, 0..:data:`MAX_GPUS_PER_POD`
    (extended resources are whole numbers). Raises ``QuantityError``."""
    q = parse_quantity(raw)
    if q != q.to_integral_value() or q < 0:
        raise QuantityError(f"{raw!r} is not a whole number of GPUs")
    if q > MAX_GPUS_PER_POD:
        raise QuantityError(f"{raw!r} is more than {MAX_GPUS_PER_POD} GPUs")
    return int(q)


def parse_pod(pod: Mapping[str, Any], *, lenient_gpu_memory: bool = False) -> GpuRequest:
    """Parse a Pod (API JSON, camelCase) into a :class:`GpuRequest`. Raises :class:`RequestError` on bad input.
    ``lenient_gpu_memory``: see :func:`parse_gpu_memory` (only for pods already bound)."""
    meta, spec = pod_parts(pod)
    annotations = or_empty(meta.get("annotations"))
    if not isinstance(annotations, Mapping):
        raise RequestError("metadata.annotations", annotations, "must be a mapping of strings")

    for key, value in annotations.items():
        if str(key).startswith(ann.PREFIX) and not isinstance(value, str):
            raise RequestError(str(key), value, "annotation values must be strings")
    raw_priority = spec.get("priority") or 0
    if isinstance(raw_priority, bool) or not isinstance(raw_priority, int):
        raise RequestError("spec.priority", raw_priority, "must be an integer")

    res = PodResources.of(pod)
    count = res.request(ann.GPU_RESOURCE, parse_gpu_count, limit=MAX_GPUS_PER_POD, unit=" GPUs")
    slots = res.request(ann.SHARED_GPU_RESOURCE, parse_gpu_count, limit=MAX_GPUS_PER_POD, unit=" slots")
    if slots:
        _check_shared_slot(slots, count, annotations)
        count = 1
    cpu = res.request("cpu", parse_cpu_milli, unit=" millicores")
    mem = res.request("memory", parse_bytes, unit=" bytes")
    created = meta.get("creationTimestamp")
    pending_since = None if created is None else parse_time(created)
    if created is not None and pending_since is None:
        raise RequestError("metadata.creationTimestamp", created, "must be an RFC 3339 time")
    req = request_from_annotations(
        annotations,
        count=count,
        cpu_milli=cpu,
        host_memory_bytes=mem,
        pod_key=pod_key(meta.get("namespace"), meta.get("name")),
        pod_uid=str(meta.get("uid") or ""),
        priority=raw_priority,
        lenient_gpu_memory=lenient_gpu_memory,
    )
    return req if pending_since is None else replace(req, pending_since=pending_since)


def parse_bound_pod(pod: Mapping[str, Any]) -> tuple[GpuRequest, str | None]:
    """A pod already bound (listed back, seen by the operator): strict first; a pool written as bare bytes
    (``"21474836480"``) is still read as that pool until kelvin :data:`~.deprecation.REMOVED_IN`, with the strict
    error returned as a warning for the caller to log. Any other problem raises :class:`RequestError`."""
    try:
        return parse_pod(pod), None
    except RequestError as exc:
        try:
            lenient = parse_pod(pod, lenient_gpu_memory=True)
        except RequestError:
            raise exc from None
        return lenient, (
            f"{exc}; read as bytes for now (deprecated: from kelvin {REMOVED_IN} a bound pod's {ann.GPU_MEMORY} "
            "needs a unit too)"
        )


def _check_shared_slot(slots: int, count: int, annotations: Mapping[str, Any]) -> None:
    """A ``kelvin.dev/shared-gpu`` request: one slot of one shared GPU, sized by a memory pool or a compute share."""
    if count:
        raise RequestError(
            ann.SHARED_GPU_RESOURCE,
            slots,
            f"a slot of a shared GPU cannot be combined with {count} whole GPU(s) ({ann.GPU_RESOURCE}); "
            f"request either {ann.SHARED_GPU_RESOURCE}: 1 or {ann.GPU_RESOURCE}",
        )
    if slots > 1:
        raise RequestError(
            ann.SHARED_GPU_RESOURCE,
            slots,
            f"a pod takes at most one slot of one shared GPU; request {ann.SHARED_GPU_RESOURCE}: 1, "
            f"or whole GPUs with {ann.GPU_RESOURCE}",
        )
    if annotations.get(ann.GPU_MEMORY) is None and annotations.get(ann.GPU_SHARE) is None:
        raise RequestError(
            ann.SHARED_GPU_RESOURCE,
            slots,
            f"a slot of a shared GPU needs its size: add the annotation {ann.GPU_MEMORY} (a memory pool, e.g. "
            f'"20Gi") or {ann.GPU_SHARE} (thousandths of the GPU, e.g. "500")',
        )


_MEMORY_UNIT = re.compile(r"(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)$")
# Annotation numbers are ASCII, as documented: int() and float() would also read "٥٠٠", "१००", "5_00" or "٧٨".
_ASCII_INT = re.compile(r"[0-9]+", re.ASCII)
_ASCII_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+", re.ASCII)
MIN_GPU_MEMORY = MIB
"""The smallest memory pool accepted: below it a value is a typo (``"20"`` would be 20 bytes), not a pool."""


def parse_gpu_memory(raw: object, *, lenient: bool = False) -> int:
    """The bytes of a ``kelvin.dev/gpu-memory`` value: a memory quantity with a unit, at least 1Mi.

    ``lenient`` also accepts a bare number of bytes (at least 1Mi), a deprecated reading kept for pods already bound
    (the listing of assignments, the operator) until kelvin :data:`~.deprecation.REMOVED_IN`; never at admission."""
    text = str(raw).strip()
    try:
        value = parse_bytes(text)
    except QuantityError as exc:
        raise RequestError(ann.GPU_MEMORY, raw, f"not a memory quantity ({exc}); use e.g. 20Gi") from exc
    if not _MEMORY_UNIT.search(text) and not (lenient and _ASCII_INT.fullmatch(text)):
        raise RequestError(
            ann.GPU_MEMORY, raw, "has no memory unit (a bare number would be bytes); give one, e.g. 20Gi or 512Mi"
        )
    if value <= 0:
        raise RequestError(ann.GPU_MEMORY, raw, "must be more than zero")
    if value < MIN_GPU_MEMORY:
        raise RequestError(ann.GPU_MEMORY, raw, "must be at least 1Mi (a GPU memory pool, e.g. 20Gi)")
    return value


def request_from_annotations(  # noqa: C901
    annotations: Mapping[str, Any],
    *,
    count: int,
    cpu_milli: int = 0,
    host_memory_bytes: int = 0,
    pod_key: str = "",
    pod_uid: str = "",
    priority: int = 0,
    lenient_gpu_memory: bool = False,
) -> GpuRequest:
    """Combine a whole-GPU count with kelvin's annotations, validating every one."""
    memory_bytes: int | None = None
    milli: int | None = MILLI_PER_GPU

    raw = annotations.get(ann.GPU_MEMORY)
    if raw is not None:
        memory_bytes = parse_gpu_memory(raw, lenient=lenient_gpu_memory)
        if count > 1:
            raise RequestError(
                ann.GPU_MEMORY,
                raw,
                f"a GPU memory pool means one shared GPU, but the pod requests {count} whole GPUs "
                f"({ann.GPU_RESOURCE}); drop the annotation or request 1 GPU",
            )
        count = 1
        milli = None

    raw = annotations.get(ann.GPU_SHARE)
    if raw is not None:
        text = str(raw).strip()
        if not _ASCII_INT.fullmatch(text):
            raise RequestError(ann.GPU_SHARE, raw, "must be an integer number of thousandths of a GPU, 1..1000")
        digits = text.lstrip("0") or "0"
        share = int(digits) if len(digits) <= 9 else MILLI_PER_GPU + 1  # (int() refuses over 4,300 digits)
        if not 1 <= share <= MILLI_PER_GPU:
            raise RequestError(ann.GPU_SHARE, raw, "must be between 1 and 1000 (thousandths of one GPU)")
        if count > 1:
            raise RequestError(ann.GPU_SHARE, raw, f"a share of one GPU cannot be combined with {count} whole GPUs")
        count = 1
        milli = share

    models: frozenset[str] | None = None
    raw = annotations.get(ann.GPU_MODELS)
    if raw is not None:
        items = [m.strip() for m in str(raw).split(",")]
        if not items or any(not m for m in items):
            raise RequestError(ann.GPU_MODELS, raw, "must be a comma-separated list of GPU model names, e.g. A100,H100")
        models = frozenset(items)

    topology = Topology.ANY
    raw = annotations.get(ann.TOPOLOGY)
    if raw is not None:
        try:
            topology = Topology(str(raw).strip())
        except ValueError as exc:
            allowed = ", ".join(t.value for t in Topology)
            raise RequestError(ann.TOPOLOGY, raw, f"must be one of {allowed}") from exc

    max_temp: float | None = None
    raw = annotations.get(ann.MAX_TEMPERATURE)
    if raw is not None:
        text = str(raw).strip().removesuffix("C").removesuffix("°")
        if not _ASCII_DECIMAL.fullmatch(text):
            raise RequestError(ann.MAX_TEMPERATURE, raw, "must be a temperature in Celsius, e.g. 75")
        max_temp = float(text)
        if not math.isfinite(max_temp) or not 20 <= max_temp <= 120:
            raise RequestError(ann.MAX_TEMPERATURE, raw, "must be between 20 and 120 (Celsius)")

    return GpuRequest(
        count=count,
        milli=milli,
        memory_bytes=memory_bytes,
        models=models,
        topology=topology,
        max_temperature=max_temp,
        cpu_milli=cpu_milli,
        host_memory_bytes=host_memory_bytes,
        pod_key=pod_key,
        pod_uid=pod_uid,
        priority=priority,
    )
