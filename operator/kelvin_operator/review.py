"""The AdmissionReview envelope, checked before any admission logic: :func:`read_review` turns the request body into
the dict kopf's admission engine reads, or raises :class:`ReviewError` naming the field that is wrong.

What the API server sends (``admission.k8s.io/v1``) always passes. What a broken or hostile client sends (a body that
is not UTF-8 JSON, nested deeper than :data:`MAX_DEPTH`, an array, ``request`` missing or null, a Pod whose
``metadata`` or ``spec`` is not an object, containers that are not objects, annotations that are not strings) is the
request's fault: the webhook server answers it HTTP 400 with the message, never a 500 and never an admission
decision. Everything else in the Pod is kept as sent (the models allow extra fields), so the handlers see the object
unchanged, but the parts they read have the types they expect.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

#: Deepest nesting of a body that is parsed (pydantic-core's JSON parser stops there); a real Pod is ~15 deep.
MAX_DEPTH = 200

#: Operations of an AdmissionReview (admission.k8s.io/v1 ``request.operation``).
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class _Open(BaseModel):
    """Fields not named here are kept as sent."""

    model_config = ConfigDict(extra="allow", frozen=True)


class _Closed(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class GroupVersionResource(_Closed):
    group: StrictStr
    version: StrictStr
    resource: StrictStr


Quantity = StrictStr | StrictInt | StrictFloat


class Resources(_Open):
    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None


class EnvVar(_Open):
    name: StrictStr


class Container(_Open):
    name: StrictStr | None = None
    env: list[EnvVar] | None = None
    resources: Resources | None = None


class PodSpec(_Open):
    containers: list[Container] | None = None
    initContainers: list[Container] | None = None
    nodeSelector: dict[str, StrictStr] | None = None


class ObjectMeta(_Open):
    name: StrictStr | None = None
    namespace: StrictStr | None = None
    uid: StrictStr | None = None
    annotations: dict[str, StrictStr] | None = None
    labels: dict[str, StrictStr] | None = None


class Pod(_Open):
    """The parts of a Pod the admission handlers read (:mod:`kelvin_operator.webhooks`), typed."""

    metadata: ObjectMeta
    spec: PodSpec | None = None


class AdmissionRequest(_Open):
    uid: StrictStr
    operation: Operation
    resource: GroupVersionResource
    userInfo: dict[str, Any]
    subResource: StrictStr | None = None
    object: dict[str, Any] | None = None
    oldObject: dict[str, Any] | None = None
    dryRun: StrictBool | None = None


class AdmissionReview(_Open):
    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class ReviewError(ValueError):
    """The body is not an AdmissionReview kelvin can judge; the message names the field and the problem."""


_JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
}
_OBJECT_ERRORS = {"dict_type", "model_type", "model_attributes_type"}


def _json_type(value: object) -> str:
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)


def _describe(exc: ValidationError, prefix: str = "") -> str:
    """pydantic's errors as ``field: problem`` (the first three), the field as a dotted path."""
    errors = exc.errors(include_url=False)
    parts = []
    for err in errors[:3]:
        loc = ".".join(str(p) for p in (*([prefix] if prefix else []), *err["loc"]))
        if err["type"] == "missing":
            msg = "missing"
        elif err["type"] in _OBJECT_ERRORS:
            msg = f"must be an object, not {_json_type(err['input'])}"
        elif err["type"] == "literal_error":
            msg = f"{err['msg']} (got {err['input']!r:.60})"
        else:
            msg = err["msg"]
        parts.append(f"{loc or 'the body'}: {msg}")
    more = len(errors) - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def read_review(body: bytes) -> dict[str, Any]:
    """The AdmissionReview in ``body`` as kopf reads it, checked (see the module's docstring)."""
    try:
        review = AdmissionReview.model_validate_json(body)
    except ValidationError as exc:
        bad_json = [e["msg"] for e in exc.errors() if e["type"] == "json_invalid"]
        if bad_json:
            raise ReviewError(f"the body is not UTF-8 JSON nested at most {MAX_DEPTH} deep: {bad_json[0]}") from None
        raise ReviewError(f"not an admission.k8s.io/v1 AdmissionReview: {_describe(exc)}") from None
    req = review.request
    gvr = req.resource
    if (gvr.group, gvr.version, gvr.resource) != ("", "v1", "pods"):
        raise ReviewError(
            f"request.resource: kelvin's webhooks judge pods (v1), not {gvr.group}/{gvr.version}/{gvr.resource}"
        )
    if req.operation in ("CREATE", "UPDATE") and req.object is None:
        raise ReviewError(f"request.object: missing (a {req.operation} review carries the object)")
    if req.operation == "DELETE" and req.oldObject is None and req.object is None:
        raise ReviewError("request.oldObject: missing (a DELETE review carries the object deleted)")
    if req.subResource is None:
        for field, obj in (("object", req.object), ("oldObject", req.oldObject)):
            if obj is not None:
                try:
                    Pod.model_validate(obj)
                except ValidationError as exc:
                    raise ReviewError(f"not a Pod: {_describe(exc, f'request.{field}')}") from None
    return review.model_dump(exclude_unset=True)
