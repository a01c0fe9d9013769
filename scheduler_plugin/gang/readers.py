"""Who is a gang: readers that find a pod's gang from its labels and annotations, tried in order.

A reader returns a :class:`GangRef` (the gang's key, its minimum size, the member's rank and the topology it asks
for) or ``None`` when the pod is not one of its kind. Readers are registered in :data:`READERS` by name, most
specific first; the first one that recognises a pod wins. kelvin's own annotations come first, so they can override
what a JobSet or Job says. The upstream Workload API (KEP-4671) can be added as one more reader.

Bad input raises :class:`GangError` naming the annotation (or label) and the fix; the admission webhook turns it into
a refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..model import annotations as ann
from ..model.pod import RequestError
from .levels import GangPolicy

# JobSet (jobset.sigs.k8s.io) labels and annotations, stamped on every pod of a JobSet's Jobs.
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"
JOBSET_JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
JOBSET_RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
# LeaderWorkerSet (leaderworkerset.sigs.k8s.io): one gang per group (the leader and its workers).
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
# Kubernetes Indexed Jobs (batch/v1).
JOB_NAME = "batch.kubernetes.io/job-name"
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

MAX_GANG_SIZE = 100_000


class GangError(RequestError):
    """A pod whose gang cannot be understood: ``field`` names the annotation or label at fault (the same shape as a
    bad GPU request's error, so callers that report one report the other)."""


@dataclass(frozen=True, slots=True)
class TopologyAsk:
    level: str
    """A level name of the policy's ``gang.levels`` (or ``node`` / ``cluster``)."""
    required: bool
    """``required``: the whole gang in one domain of ``level`` or not at all; ``preferred``: the tightest level that
    fits, from ``level`` outwards."""

    def describe(self) -> str:
        return f"{'required' if self.required else 'preferred'}={self.level}"


@dataclass(frozen=True, slots=True)
class GangRef:
    """What one pod says about its gang."""

    key: str
    """``namespace/kind:name``: unique per gang (members of one gang share it)."""
    kind: str
    """The reader that recognised it (``kelvin``, ``jobset``, ``leaderworkerset``, ``indexed-job``)."""
    size: int | None
    """Minimum members planned at once; ``None`` when only the owner knows it (an Indexed Job's parallelism)."""
    index: int | None
    """The member's rank (consecutive ranks are placed close), ``None`` when the pod has none."""
    topology: TopologyAsk | None
    """What ``kelvin.dev/gang-topology`` asks; ``None``: preferred at the innermost level."""


def _meta(pod: Mapping[str, Any]) -> tuple[str, Mapping[str, str], Mapping[str, str]]:
    md = pod.get("metadata") or {}
    if not isinstance(md, Mapping):
        return "", {}, {}
    labels = md.get("labels") or {}
    annots = md.get("annotations") or {}
    ns = md.get("namespace") or "default"
    return (
        str(ns),
        labels if isinstance(labels, Mapping) else {},
        annots if isinstance(annots, Mapping) else {},
    )


def _get(labels: Mapping[str, str], annots: Mapping[str, str], key: str) -> str | None:
    """A key the controllers write as a label, an annotation or both."""
    v = labels.get(key, annots.get(key))
    return None if v is None else str(v)


def _count(field: str, raw: str, lo: int) -> int:
    text = raw.strip()
    if not text.isdigit() or len(text) > 7:
        raise GangError(field, raw, f"must be an integer from {lo} to {MAX_GANG_SIZE}")
    v = int(text)
    if not lo <= v <= MAX_GANG_SIZE:
        raise GangError(field, raw, f"must be an integer from {lo} to {MAX_GANG_SIZE}")
    return v


def parse_topology(raw: str | None, policy: GangPolicy) -> TopologyAsk | None:
    """``required=<level>`` or ``preferred=<level>`` against the policy's levels; ``None`` when unset."""
    if raw is None:
        return None
    kind, eq, level = raw.strip().partition("=")
    names = policy.level_names
    if not eq or kind not in ("required", "preferred"):
        raise GangError(
            ann.GANG_TOPOLOGY, raw, f"must be required=<level> or preferred=<level>, a level of {', '.join(names)}"
        )
    if level not in names:
        raise GangError(
            ann.GANG_TOPOLOGY,
            raw,
            f"level {level!r} is not defined by the policy's gang.levels; use one of {', '.join(names)}",
        )
    return TopologyAsk(level, kind == "required")


def _rank(labels: Mapping[str, str], annots: Mapping[str, str]) -> int | None:
    """The member's rank from the first index the pod carries: kelvin's, the JobSet's and Job's, the LWS worker's."""
    raw = annots.get(ann.GANG_INDEX)
    if raw is not None:
        return _count(ann.GANG_INDEX, str(raw), 0)
    gi = _get(labels, annots, JOBSET_JOB_GLOBAL_INDEX)
    ci = _get(labels, annots, JOB_COMPLETION_INDEX)
    if gi is not None:
        # one pod per Job is the JobSet layout of distributed training; several make ranks job-major
        base = _count(JOBSET_JOB_GLOBAL_INDEX, gi, 0)
        return base * 1_000_000 + (_count(JOB_COMPLETION_INDEX, ci, 0) if ci is not None else 0)
    if ci is not None:
        return _count(JOB_COMPLETION_INDEX, ci, 0)
    wi = _get(labels, annots, LWS_WORKER_INDEX)
    return None if wi is None else _count(LWS_WORKER_INDEX, wi, 0)


Reader = Callable[[str, Mapping[str, str], Mapping[str, str]], tuple[str, str, int | None] | None]
"""(namespace, labels, annotations) -> (kind, name, size) of the gang, or None when not of this kind."""


def read_kelvin(ns: str, labels: Mapping[str, str], annots: Mapping[str, str]) -> tuple[str, str, int | None] | None:
    name = annots.get(ann.GANG)
    size = annots.get(ann.GANG_SIZE)
    if name is None:
        if size is not None:
            raise GangError(ann.GANG_SIZE, size, f"needs {ann.GANG} (the gang's name) on the same pod")
        return None
    name = str(name).strip()
    if not name or len(name) > 253:
        raise GangError(ann.GANG, name, "must be the gang's name, 1 to 253 characters")
    if size is None:
        raise GangError(ann.GANG, name, f"needs {ann.GANG_SIZE}: the number of members placed at once")
    return "kelvin", name, _count(ann.GANG_SIZE, str(size), 1)


def read_jobset(ns: str, labels: Mapping[str, str], annots: Mapping[str, str]) -> tuple[str, str, int | None] | None:
    name = _get(labels, annots, JOBSET_NAME)
    if name is None:
        return None
    replicas = _get(labels, annots, JOBSET_GLOBAL_REPLICAS)
    if replicas is None:
        raise GangError(JOBSET_GLOBAL_REPLICAS, None, f"missing on a JobSet pod; set {ann.GANG_SIZE} instead")
    attempt = _get(labels, annots, JOBSET_RESTART_ATTEMPT) or "0"
    return "jobset", f"{name}@{attempt}", _count(JOBSET_GLOBAL_REPLICAS, replicas, 1)


def read_lws(ns: str, labels: Mapping[str, str], annots: Mapping[str, str]) -> tuple[str, str, int | None] | None:
    name = _get(labels, annots, LWS_NAME)
    if name is None:
        return None
    group = _get(labels, annots, LWS_GROUP_INDEX)
    size = _get(labels, annots, LWS_SIZE)
    if group is None or size is None:
        missing = LWS_GROUP_INDEX if group is None else LWS_SIZE
        raise GangError(missing, None, "missing on a LeaderWorkerSet pod")
    return "leaderworkerset", f"{name}-{_count(LWS_GROUP_INDEX, group, 0)}", _count(LWS_SIZE, size, 1)


def read_indexed_job(
    ns: str, labels: Mapping[str, str], annots: Mapping[str, str]
) -> tuple[str, str, int | None] | None:
    name = _get(labels, annots, JOB_NAME)
    if name is None or _get(labels, annots, JOB_COMPLETION_INDEX) is None:
        return None  # a NonIndexed Job's pods are interchangeable: not a gang
    return "indexed-job", name, None  # its size is the Job's parallelism (size_of_job)


#: name -> reader, tried in this order. Add the Workload API (KEP-4671) here when it leaves alpha.
READERS: dict[str, Reader] = {
    "kelvin": read_kelvin,
    "jobset": read_jobset,
    "leaderworkerset": read_lws,
    "indexed-job": read_indexed_job,
}


def read_gang(
    pod: Mapping[str, Any], policy: GangPolicy, readers: Mapping[str, Reader] | None = None
) -> GangRef | None:
    """The pod's gang, or ``None`` when it belongs to none. Raises :class:`GangError` for bad gang input."""
    ns, labels, annots = _meta(pod)
    topo = parse_topology(annots.get(ann.GANG_TOPOLOGY), policy)
    for reader in (readers or READERS).values():
        found = reader(ns, labels, annots)
        if found is not None:
            kind, name, size = found
            return GangRef(f"{ns}/{kind}:{name}", kind, size, _rank(labels, annots), topo)
    if topo is not None:
        raise GangError(ann.GANG_TOPOLOGY, annots.get(ann.GANG_TOPOLOGY), f"needs {ann.GANG} and {ann.GANG_SIZE}")
    return None


def size_of_job(job: Mapping[str, Any]) -> int | None:
    """An Indexed Job's gang size: its ``spec.parallelism`` (default 1), at most its completions."""
    spec = job.get("spec") or {}
    if not isinstance(spec, Mapping):
        return None
    par = spec.get("parallelism", 1)
    comp = spec.get("completions")
    if not isinstance(par, int) or par < 1:
        return None
    return min(par, comp) if isinstance(comp, int) and comp > 0 else par
