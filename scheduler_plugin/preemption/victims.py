"""Preemption candidates and the units they are evicted in.

A :class:`Candidate` is one pod on the node that holds GPUs there (its :class:`GpuAssignment`), with what evicting it
costs. Candidates are evicted in :class:`Unit` s: a pod alone, or every member of its gang (``kelvin.dev/gang``) on
the node together, costed as the whole gang (evicting one member stops the job on every node). A unit is
*protected*, never a victim, when one of its members (anywhere) has the preemptor's priority or more, or says
``kelvin.dev/evictable: "false"``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..model import MILLI_PER_GPU, GpuAssignment
from ..model.eviction import EvictionFacts
from .pdb import violations

#: Progress assumed lost per GPU when a pod's start and checkpoint are both unknown (a bind kelvin has not listed
#: back yet, a pod without times): one hour, so that an unknown pod is never the cheapest victim by accident.
UNKNOWN_PROGRESS_S = 3600.0


@dataclass(frozen=True, slots=True)
class Candidate:
    """One pod on the node that could be evicted."""

    uid: str
    pod_key: str
    priority: int
    assignment: GpuAssignment
    """The GPUs it holds on this node (their own indices) and its claim (charged as at bind)."""
    evictable: bool = True
    gang: str | None = None
    pdb_violation: bool = False
    """Evicting it would violate a PodDisruptionBudget (kube-scheduler said so: its ``NumPDBViolations``)."""
    budgets: tuple[int, ...] = ()
    """The PodDisruptionBudgets kelvin listed that evicting it takes one from (indices into the ``allowed`` of
    :func:`build_units`; :func:`.pdb.matching`)."""
    lost_gpu_seconds: float = 0.0
    """Work an eviction loses: GPUs held x seconds since its last checkpoint (or its start)."""

    @classmethod
    def of(
        cls,
        a: GpuAssignment,
        now: float,
        *,
        facts: EvictionFacts | None = None,
        priority: int | None = None,
        pdb_violation: bool = False,
        budgets: tuple[int, ...] = (),
    ) -> Candidate:
        """The candidate of an assignment; ``facts`` default to the assignment's own (``None``: unknown)."""
        f = facts if facts is not None else a.eviction
        return cls(
            uid=a.pod_uid or a.pod_key,
            pod_key=a.pod_key,
            priority=a.priority if priority is None else priority,
            assignment=a,
            evictable=True if f is None else f.evictable,
            gang=None if f is None else f.gang,
            pdb_violation=pdb_violation,
            budgets=budgets,
            lost_gpu_seconds=lost_gpu_seconds(a, f, now),
        )


def lost_gpu_seconds(a: GpuAssignment, facts: EvictionFacts | None, now: float) -> float:
    """GPUs held (a share counts its thousandths) x seconds of work since the pod's last checkpoint or start."""
    gpus = len(a.gpu_indices) * (1.0 if a.milli is None else min(a.milli, 1000) / 1000.0 or 0.001)
    since = None if facts is None else facts.progress_since()
    seconds = UNKNOWN_PROGRESS_S if since is None else max(0.0, now - since)
    return gpus * seconds


def kube_count(a: GpuAssignment) -> tuple[int, int]:
    """What evicting the pod of ``a`` gives back as kube-scheduler counts it: (whole GPUs, ``nvidia.com/gpu``;
    shared-GPU slots, ``kelvin.dev/shared-gpu``: one a share)."""
    if a.memory_bytes is None and a.milli == MILLI_PER_GPU:
        return len(a.gpu_indices), 0
    return 0, 1


def kube_free(assignments: Iterable[GpuAssignment], gpus: int, slots_per_gpu: int) -> tuple[int, int]:
    """What kube-scheduler's count sees free on a node of ``gpus`` GPUs whose pods are ``assignments``: (whole GPUs,
    ``nvidia.com/gpu``: one a GPU; shared-GPU slots, ``kelvin.dev/shared-gpu``: ``slots_per_gpu`` a GPU, as the device
    plugin advertises them), less what the pods request (:func:`kube_count`)."""
    counts = [kube_count(a) for a in assignments]
    whole = gpus - sum(w for w, _ in counts)
    slots = gpus * slots_per_gpu - sum(s for _, s in counts)
    return max(0, whole), max(0, slots)


@dataclass(frozen=True, slots=True)
class GangCost:
    """What evicting a gang costs, counted over all its members in the fleet (not only this node's)."""

    members: int
    lost_gpu_seconds: float
    max_priority: int
    protected: bool
    """One member is not evictable."""


@dataclass(frozen=True, slots=True)
class Unit:
    """Pods evicted together: one pod, or the members of one gang on the node."""

    key: str
    members: tuple[Candidate, ...]
    victims: int
    """Pods the eviction stops in all (a gang's members on every node)."""
    lost_gpu_seconds: float
    pdb_violations: int
    """Evicting this unit alone: the members kube-scheduler says violate a budget, plus the budgets kelvin listed
    it exhausts (:func:`.pdb.violations`)."""
    max_priority: int
    protected: bool
    flagged: int = 0
    """Members kube-scheduler says violate a budget."""
    budget_hits: tuple[int, ...] = ()
    """The listed budget of every (member, matching budget) pair: a set's violations count them together."""

    def cost(self) -> tuple[int, int, float, int]:
        return (self.pdb_violations, self.victims, self.lost_gpu_seconds, self.max_priority)


def gang_costs(assignments: Iterable[GpuAssignment], now: float) -> dict[str, GangCost]:
    """Per gang, the cost of evicting all its members (every assignment of the fleet that names a gang)."""
    acc: dict[str, list[float]] = {}
    protected: set[str] = set()
    for a in assignments:
        f = a.eviction
        if f is None or f.gang is None:
            continue
        row = acc.setdefault(f.gang, [0, 0.0, float("-inf")])
        row[0] += 1
        row[1] += lost_gpu_seconds(a, f, now)
        row[2] = max(row[2], a.priority)
        if not f.evictable:
            protected.add(f.gang)
    return {g: GangCost(int(m), lost, int(p), g in protected) for g, (m, lost, p) in acc.items()}


def build_units(
    candidates: Iterable[Candidate],
    preemptor_priority: int,
    gangs: Mapping[str, GangCost] | None = None,
    allowed: Sequence[int] = (),
) -> list[Unit]:
    """The candidates grouped into units, each with its cost and whether it is protected. ``allowed``: the
    ``disruptionsAllowed`` of each listed budget (:attr:`Candidate.budgets` index it)."""
    groups: dict[str, list[Candidate]] = {}
    for c in candidates:
        groups.setdefault(f"gang:{c.gang}" if c.gang else f"pod:{c.uid}", []).append(c)
    units = []
    for key, members in groups.items():
        gang = members[0].gang
        here_lost = sum(c.lost_gpu_seconds for c in members)
        here_prio = max(c.priority for c in members)
        protected = any(not c.evictable for c in members)
        victims, lost, prio = len(members), here_lost, here_prio
        g = None if gang is None or gangs is None else gangs.get(gang)
        if g is not None:
            victims = max(victims, g.members)
            lost = max(lost, g.lost_gpu_seconds)
            prio = max(prio, g.max_priority)
            protected = protected or g.protected
        flagged = sum(c.pdb_violation for c in members)
        hits = tuple(b for c in members for b in c.budgets)
        units.append(
            Unit(
                key=key,
                members=tuple(members),
                victims=victims,
                lost_gpu_seconds=lost,
                pdb_violations=flagged + violations(hits, allowed),
                max_priority=prio,
                protected=protected or prio >= preemptor_priority,
                flagged=flagged,
                budget_hits=hits,
            )
        )
    return units
