"""Straggler remediation as a gang (docs/jobs.md): pure decisions over the thermal candidates of one node.

In a synchronous job the slowest member sets the step time, and evicting one member stops the whole job anyway. So
a thermal candidate (a pod on a node that throttles or is predicted to: the hot-node strategy) that is a member of a
gang is not evicted on its own: :func:`gang_moves` turns it into one :class:`GangMove` per gang, every live member
of the gang (on any node) to be checkpointed and evicted together, and re-planned elsewhere when its controller
recreates the pods. A gang marked elastic (``kelvin.dev/gang-elastic: "true"`` on the straggler) loses only the
straggler: its candidate stays a single one. Whether the move pays is priced over the gang (:func:`gang_move_pays`:
the whole gang runs at its slowest member's speed, and leaving costs every member's work since its checkpoint:
``scheduler_plugin/gang_eviction.py``, the rule the job simulator's thermal scenario runs too), not by the
straggler's own per-pod rule. :func:`move_protection` keeps a gang whole when any member is protected. The
evictor acts (limits, handshake, Eviction API, dry run, Events); nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from scheduler_plugin.gang import GangError, GangPolicy, GangRef, read_gang
from scheduler_plugin.gang.readers import JOB_COMPLETION_INDEX, JOBSET_NAME, LWS_NAME
from scheduler_plugin.gang_eviction import MemberWork, gang_move_pays
from scheduler_plugin.model import annotations as ann

from .planner import protection
from .pods import PodView, age_s, pod_view, restart_cost_s
from .settings import ProtectionConfig, ThermalEvictionConfig
from .strategies import Candidate, Reason


@dataclass(frozen=True, slots=True)
class GangMove:
    """A running gang to move as a whole because of ``straggler``."""

    gang: str
    """The gang's key (``namespace/kind:name``)."""
    straggler: Candidate
    """The member on the hot node (the hottest, when several are)."""
    members: tuple[PodView, ...]
    """Every live, bound member of the gang, the straggler included, by key."""

    @property
    def detail(self) -> str:
        return (
            f"gang {self.gang} moved as a whole ({len(self.members)} members): its member {self.straggler.pod.key} "
            f"straggles ({self.straggler.detail})"
        )


#: A pod carries one of these (as a label or an annotation) when any gang reader can recognise it.
GANG_MARKERS = (ann.GANG, JOBSET_NAME, LWS_NAME, JOB_COMPLETION_INDEX)


def gang_of(pod: Mapping[str, Any], policy: GangPolicy) -> GangRef | None:
    """The pod's gang, ``None`` for a pod of none (or whose gang cannot be read: admission refuses those)."""
    meta = pod.get("metadata") or {}
    labels, annots = meta.get("labels") or {}, meta.get("annotations") or {}
    if not any(k in labels or k in annots for k in GANG_MARKERS):
        return None  # most pods: no reader would recognise them, so none is run
    try:
        return read_gang(pod, policy)
    except GangError:
        return None


def is_elastic(pod: PodView) -> bool:
    return pod.annotations.get(ann.GANG_ELASTIC, "").strip().lower() == "true"


def member_work(pod: PodView, now: float) -> MemberWork:
    return MemberWork(pod.gpu_count, age_s(pod, now), restart_cost_s(pod, now))


def gang_moves(
    candidates: Sequence[Candidate],
    gang_by_pod: Mapping[str, GangRef],
    members: Mapping[str, Sequence[Mapping[str, Any]]],
    now: float = 0.0,
    rule: ThermalEvictionConfig | None = None,
) -> tuple[list[Candidate], list[GangMove]]:
    """(the candidates to evict one by one, the gangs to move whole). ``gang_by_pod``: pod key -> its gang, for the
    node's pods; ``members``: gang key -> the pods of its members the operator knows (any node). Only thermal
    candidates of non-elastic gangs become moves; a member's other reasons (noisy neighbour, memory pool) stay its
    own. Under ``rule`` ``pays`` a gang moves only when :func:`gang_move_pays` says so over all its members (the
    thermal strategy leaves that decision to the gang for their pods: ``Candidate.clock_ratio``); a gang that does
    not pay stays, its straggler included. Without ``rule`` (or ``warm``) every such gang moves."""
    singles: list[Candidate] = []
    worst: dict[str, Candidate] = {}
    ratio: dict[str, float] = {}
    for c in candidates:
        ref = gang_by_pod.get(c.pod.key)
        if ref is None or c.reason is not Reason.THERMAL or is_elastic(c.pod):
            singles.append(c)
            continue
        if c.clock_ratio is not None:
            ratio[ref.key] = min(ratio.get(ref.key, 1.0), c.clock_ratio)
        prev = worst.get(ref.key)
        if prev is None or (c.heat, c.pod.key) > (prev.heat, prev.pod.key):
            worst[ref.key] = c
    moves = []
    for gang, c in sorted(worst.items()):
        views = {c.pod.key: c.pod}
        for p in members.get(gang, ()):
            v = pod_view(p)
            if v.node and v.phase not in ("Succeeded", "Failed") and v.key not in views:
                views[v.key] = v
        straggler = c
        if rule is not None and rule.rule == "pays" and gang in ratio:
            verdict = gang_move_pays(
                [member_work(v, now) for v in views.values()], ratio[gang], rule.restart_s, rule.max_remaining_s
            )
            if not verdict.move:
                continue
            straggler = replace(c, detail=f"{c.detail}; {verdict.why}")
        moves.append(GangMove(gang, straggler, tuple(views[k] for k in sorted(views))))
    # a member of a moved gang is not also evicted alone for another reason
    in_moves = {k for m in moves for k in _keys(members.get(m.gang, ()))} | {m.straggler.pod.key for m in moves}
    return [c for c in singles if c.pod.key not in in_moves], moves


def _keys(pods: Sequence[Mapping[str, Any]]) -> set[str]:
    return {pod_view(p).key for p in pods}


def move_protection(move: GangMove, now: float, cfg: ProtectionConfig) -> str | None:
    """Why the gang must not be moved (a member is protected: the gang is kept whole), or ``None``."""
    for m in move.members:
        why = protection(m, now, cfg)
        if why is not None:
            return f"member {m.key} is protected: {why}"
    return None
