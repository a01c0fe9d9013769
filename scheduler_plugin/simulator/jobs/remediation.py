"""Straggler remediation in the job simulator's thermal scenario: kelvin's operator moving a gang off a throttling
node when that pays, by the rule the operator runs (:func:`scheduler_plugin.gang_eviction.gang_move_pays`).

A job with a member on a poorly cooled node runs at the scenario's straggler speed. Where kelvin's operator runs
(the ``kelvin-pod`` and ``kelvin-gang`` schedulers; kube-scheduler alone and the TAS-like greedy have none), every
``check_s`` of such a run it asks the gang rule: staying costs the gang's remaining work (its run time so far, capped
at the thermal eviction rule's ``maxRemainingSeconds``) slowed on every member's GPUs, leaving costs every member's
work since its last checkpoint (jobs checkpoint every ``checkpoint_s``) plus the rule's ``restartSeconds``. A move
evicts the whole job: its GPUs are freed, its work up to the last checkpoint is kept, it goes back to the queue and
pays the restart when it starts again. A move is priced against where the job would land: when the well cooled nodes
have no room for it (counting the GPUs it frees there), it would run on a poorly cooled node again, so the rule is
asked with the straggler's speed at the new place too and the job stays (:func:`cooler_place`). At most
``max_moves`` moves per job. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...gang_eviction import GangVerdict, MemberWork, gang_move_pays
from ...operator_settings import ThermalEvictionConfig

_RULE = ThermalEvictionConfig()


@dataclass(frozen=True, slots=True)
class Remediation:
    check_s: float = 60.0
    """How often the operator looks at a straggling job (its node cycle)."""
    checkpoint_s: float = 600.0
    """Jobs save a checkpoint every this many seconds of work (an assumption: no trace says it)."""
    restart_s: float = _RULE.restart_s
    max_remaining_s: float = _RULE.max_remaining_s
    max_moves: int = 2

    def lost_s(self, work_s: float) -> float:
        """Work since the last checkpoint after ``work_s`` of work."""
        return work_s - self.saved_s(work_s)

    def saved_s(self, work_s: float) -> float:
        """Work kept by the last checkpoint after ``work_s`` of work."""
        return (work_s // self.checkpoint_s) * self.checkpoint_s if self.checkpoint_s > 0 else 0.0

    def verdict(
        self, members: int, gpus_per_member: int, work_s: float, speed: float, new_speed: float = 1.0
    ) -> GangVerdict:
        """Whether moving a job of ``members`` members that has worked ``work_s`` at ``speed`` pays, when it would
        run at ``new_speed`` where it lands."""
        m = MemberWork(gpus_per_member, work_s, self.lost_s(work_s))
        return gang_move_pays([m] * members, speed, self.restart_s, self.max_remaining_s, new_speed)


def cooler_place(
    whole_free: np.ndarray, poor: np.ndarray, placed: Sequence[tuple[int, int]], members: int, gpus_per_member: int
) -> bool:
    """Whether the well cooled nodes have room for a job of ``members`` pods of ``gpus_per_member`` GPUs once it has
    left: ``whole_free`` (N,) whole free GPUs per node now, ``poor`` (N,) the poorly cooled nodes, ``placed`` the
    job's (node, GPUs) it would free."""
    free = whole_free.copy()
    for row, gpus in placed:
        free[row] += gpus
    return int((free[~poor] // max(gpus_per_member, 1)).sum()) >= members
