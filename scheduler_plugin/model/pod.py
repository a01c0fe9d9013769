"""The one reader of a Pod (Kubernetes API JSON, camelCase): its ``namespace/name`` key, its containers' resources,
and Kubernetes' effective request of a resource. Every part of kelvin that reads a pod's containers reads them here.

Rules (as the API server and kube-scheduler apply them):

- **Requests and limits.** A container's request of a resource is ``resources.requests[name]``, else
  ``resources.limits[name]``: the API server defaults a missing request to the limit ("If you specify a limit for a
  resource, but do not specify any request [...] Kubernetes copies the limit you specified and uses it as the
  requested value", https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/). For an extended
  resource (``nvidia.com/gpu``, ``kelvin.dev/shared-gpu``) the two, when both are given, must be equal ("You can
  specify GPU in both limits and requests but these two values must be equal",
  https://kubernetes.io/docs/tasks/manage-gpus/scheduling-gpus/); a pod where they differ is refused, naming the
  container, rather than read one way here and another way there.
- **Effective request** (https://kubernetes.io/docs/concepts/resource-management/effective-pod-requests-limits/):
  init containers run one at a time, each alongside the sidecar containers (init containers with
  ``restartPolicy: Always``) listed before it; after initialisation the app containers run alongside every sidecar.
  The pod's effective request is the larger of the two phases' peaks, plus ``spec.overhead``::

      max(max over regular init containers (its request + the sidecars before it), sum(app) + sum(sidecars))

  With no sidecar this is ``max(max(init), sum(app))``.
- **Strictness.** Every reader here raises :class:`RequestError` naming the field and the problem. Each caller type
  decides what an unreadable pod means, once (see ``docs/architecture.md``, "Reading pods"): the extender answers
  HTTP 400; the webhooks reject the pod at admission (validating) or leave it to the validating webhook (mutating);
  the operator records the error on its view of the pod and counts what it can read (:func:`readable_request`); the
  device plugin refuses the pod's Allocate with the error and never hands its GPUs to another pod.
- **Key.** A pod is known by ``namespace/name`` (:func:`pod_key`); a pod without a namespace is in ``default``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .quantity import MAX_INT64, QuantityError

DEFAULT_NAMESPACE = "default"


class RequestError(ValueError):
    """A pod whose GPU request cannot be understood. ``field`` names the annotation or resource at fault."""

    def __init__(self, field: str, value: object, problem: str) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        super().__init__(f"{field}={value!r}: {problem}")


def pod_key(namespace: object, name: object) -> str:
    """``namespace/name``: how kelvin names a pod (records, ledgers, logs). An empty namespace is ``default``."""
    return f"{namespace or DEFAULT_NAMESPACE}/{name or ''}"


def key_of(pod: object) -> str:
    """:func:`pod_key` of a pod object; never raises (an odd pod is ``default/``)."""
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    if not isinstance(meta, Mapping):
        return pod_key(None, None)
    return pod_key(meta.get("namespace"), meta.get("name"))


def or_empty(value: Any) -> Any:
    """An absent (null) field reads as empty; any other value is type-checked by the caller (``""`` or ``[]`` where
    an object belongs is an error, not an empty object)."""
    return {} if value is None else value


def pod_parts(pod: object) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The pod's ``metadata`` and ``spec`` (absent ones read as empty), or :class:`RequestError`."""
    if not isinstance(pod, Mapping):
        raise RequestError("Pod", type(pod).__name__, "must be an object")
    meta = or_empty(pod.get("metadata"))
    spec = or_empty(pod.get("spec"))
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        raise RequestError("Pod", "metadata/spec", "metadata and spec must be objects")
    return meta, spec


class ContainerKind(StrEnum):
    INIT = "init"
    """A regular init container: runs to completion, one at a time, before the app containers."""
    SIDECAR = "sidecar"
    """An init container with ``restartPolicy: Always``: starts in order and keeps running beside the app."""
    APP = "app"


def is_extended(resource: str) -> bool:
    """An extended resource (``vendor.example/thing``, not ``*kubernetes.io/``): whole numbers, never overcommitted
    (its request equals its limit)."""
    domain, slash, _ = resource.partition("/")
    return bool(slash) and not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


@dataclass(frozen=True, slots=True)
class Container:
    """One container's resources as written (quantities unparsed)."""

    name: str
    kind: ContainerKind
    requests: Mapping[str, Any]
    limits: Mapping[str, Any]

    def field(self, resource: str) -> str:
        """How errors name one of this container's resources."""
        return f"container {self.name!r} resource {resource}"

    def mentions(self, resource: str) -> bool:
        """The resource appears in the requests or the limits (any value, zero too), as kube-scheduler decides which
        extenders a pod concerns (an extender's ``managedResources``)."""
        return resource in self.requests or resource in self.limits

    def request(self, resource: str, parse: Callable[[Any], int]) -> int:
        """The container's request of ``resource`` (0 when absent): the request, defaulted from the limit. Raises
        :class:`RequestError` for a value ``parse`` refuses, or an extended resource whose request and limit
        differ."""
        raw = self.requests.get(resource, self.limits.get(resource))
        if raw is None:
            return 0
        value = self._parse(resource, raw, parse)
        if is_extended(resource) and resource in self.requests and resource in self.limits:
            limit = self._parse(resource, self.limits[resource], parse)
            if limit != value:
                raise RequestError(
                    self.field(resource),
                    {"requests": raw, "limits": self.limits[resource]},
                    "the request and the limit of an extended resource must be equal (the API server refuses a "
                    "pod where they differ); give it in resources.limits only",
                )
        return value

    def _parse(self, resource: str, raw: Any, parse: Callable[[Any], int]) -> int:
        try:
            return parse(raw)
        except QuantityError as exc:
            raise RequestError(self.field(resource), raw, str(exc)) from exc


def _mapping(value: Any, field: str) -> Mapping[str, Any]:
    value = or_empty(value)
    if not isinstance(value, Mapping):
        raise RequestError(field, value, "must be a mapping")
    return value


def _group(spec: Mapping[str, Any], group: str) -> list[Container]:
    items = spec.get(group)
    items = [] if items is None else items
    if not isinstance(items, list):
        raise RequestError(f"spec.{group}", items, "must be a list of containers")
    out = []
    for c in items:
        if not isinstance(c, Mapping):
            raise RequestError(f"spec.{group}", c, "every container must be an object")
        name = c.get("name", "?")
        where = f"spec.{group}[{name}].resources"
        res = _mapping(c.get("resources"), where)
        if group == "containers":
            kind = ContainerKind.APP
        else:
            kind = ContainerKind.SIDECAR if c.get("restartPolicy") == "Always" else ContainerKind.INIT
        requests = _mapping(res.get("requests"), f"{where}.requests")
        limits = _mapping(res.get("limits"), f"{where}.limits")
        out.append(Container(str(name), kind, requests, limits))
    return out


def containers(pod: object) -> tuple[Container, ...]:
    """The pod's containers in the order the kubelet starts them (and calls a device plugin's Allocate for them):
    init containers (regular and sidecar) as listed, then the app containers. Raises :class:`RequestError`."""
    _, spec = pod_parts(pod)
    return (*_group(spec, "initContainers"), *_group(spec, "containers"))


def effective(kinds: Sequence[ContainerKind], values: Sequence[int]) -> int:
    """Kubernetes' effective request of a resource from each container's request (see the module's docstring), not
    counting ``spec.overhead``. ``kinds`` in :func:`containers`' order."""
    app = sidecars = init_peak = 0
    for kind, v in zip(kinds, values, strict=True):
        if kind is ContainerKind.APP:
            app += v
        elif kind is ContainerKind.SIDECAR:
            sidecars += v
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, v + sidecars)
    return max(app + sidecars, init_peak)


@dataclass(frozen=True, slots=True)
class PodResources:
    """A pod's containers and ``spec.overhead``, read once (:meth:`of`) for every resource asked of them."""

    containers: tuple[Container, ...]
    overhead: Mapping[str, Any]

    @classmethod
    def of(cls, pod: object) -> PodResources:
        """Raises :class:`RequestError` when the containers or the overhead are not what a Pod holds."""
        _, spec = pod_parts(pod)
        return cls(containers(pod), _mapping(spec.get("overhead"), "spec.overhead"))

    def request(self, resource: str, parse: Callable[[Any], int], *, limit: int = MAX_INT64, unit: str = "") -> int:
        """The pod's effective request of ``resource`` plus ``spec.overhead``; :class:`RequestError` on any bad value.

        Checked against ``limit`` like each single value is: every container alone may be in range while their sum
        is not (two containers of ``7Ei`` overflow int64), and what kelvin keeps of a pod must fit the int64
        arithmetic of every later request's scoring."""
        cs = self.containers
        total = effective([c.kind for c in cs], [c.request(resource, parse) for c in cs])
        overhead_raw = self.overhead.get(resource)
        try:
            overhead = parse(overhead_raw) if overhead_raw is not None else 0
        except QuantityError as exc:
            raise RequestError(f"spec.overhead.{resource}", overhead_raw, str(exc)) from exc
        result = int(total + overhead)
        if result > limit:
            raise RequestError(
                f"resource {resource}",
                f"{result}{unit}",
                f"the pod's effective request (the larger of the app and sidecar containers' sum and the largest "
                f"init container with the sidecars before it, plus spec.overhead) is more than {limit}{unit}",
            )
        return result

    def mentions(self, resources: Sequence[str]) -> bool:
        """Some container (init containers too) names one of ``resources`` in its requests or limits."""
        return any(c.mentions(r) for c in self.containers for r in resources)


def readable_request(pod: object, resource: str, parse: Callable[[Any], int]) -> int:
    """What the operator counts of a pod whose request cannot be parsed: the effective request over the values that
    can be read (an unreadable value counts 0, unreadable containers none; no overhead, no bound). Never raises."""
    try:
        cs = containers(pod)
    except RequestError:
        return 0
    values = []
    for c in cs:
        try:
            values.append(c.request(resource, parse))
        except RequestError:
            values.append(0)
    return effective([c.kind for c in cs], values)
