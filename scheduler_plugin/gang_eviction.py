"""When moving a synchronous gang off a throttling member pays: the thermal eviction rule priced over the gang,
shared by the operator's straggler remediation (``kelvin_operator.stragglers``) and the job simulator's thermal
scenario (``scheduler_plugin.simulator.jobs``), so both run the same decision.

Beside :mod:`scheduler_plugin.thermal_eviction` (the per-pod rule): in a synchronous job the slowest member sets the
step time, so the straggler's throttling slows *every* member, and evicting it stops the whole job, so leaving throws
away *every* member's work since its last checkpoint. A gang marked elastic loses only the straggler and keeps the
per-pod rule. Pure: numbers in, a verdict out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .thermal_eviction import slowdown_cost_s


@dataclass(frozen=True, slots=True)
class MemberWork:
    """What one member of a running gang stands to lose: its GPUs, how long it has run, the work since its last
    checkpoint (what an eviction throws away)."""

    gpus: int
    age_s: float
    lost_s: float


@dataclass(frozen=True, slots=True)
class GangVerdict:
    move: bool
    stay_gpu_s: float
    """GPU-seconds staying costs: every member runs at the straggler's clock ratio for the gang's remaining work."""
    leave_gpu_s: float
    """GPU-seconds leaving costs: every member's work since its last checkpoint, plus a restart, on its GPUs, plus the
    remaining work slowed at the new place's predicted clock ratio (0 where it is predicted at full clocks)."""

    @property
    def why(self) -> str:
        verb = "pays" if self.move else "does not pay"
        return (
            f"moving the gang {verb}: staying costs {self.stay_gpu_s / 3600:.2f} GPU-h (the whole gang at its "
            f"straggler's speed), leaving {self.leave_gpu_s / 3600:.2f} GPU-h (every member's work since its "
            "checkpoint and a restart, and any slowdown where it lands)"
        )


def gang_move_pays(
    members: Sequence[MemberWork],
    clock_ratio: float,
    restart_s: float,
    max_remaining_s: float,
    new_clock_ratio: float = 1.0,
) -> GangVerdict:
    """The thermal eviction rule priced over a synchronous gang (``pays``): the slowest member sets every member's
    step time, so staying costs the gang's remaining work (its members' common run time so far, the youngest
    member's age, capped at ``max_remaining_s``: a job that has run ``t`` tends to run about ``t`` more) slowed by
    the straggler's ``clock_ratio``, on *every* member's GPUs; leaving costs *every* member's work since its last
    checkpoint plus ``restart_s``, on its GPUs, plus the same remaining work slowed by ``new_clock_ratio``, the
    clock ratio predicted where the gang would run next (1.0: a cooler place with room for it; the straggler's own
    ratio when there is none, so the gang would land on a throttling node again and moving never pays). A per-pod
    rule (:func:`scheduler_plugin.thermal_eviction.judge`) weighs the straggler's own GPUs and lost work only, which
    is right for an elastic gang (it loses the straggler alone) and wrong for a synchronous one. Pure."""
    if not members:
        return GangVerdict(False, 0.0, 0.0)
    remaining = min(min(m.age_s for m in members), max_remaining_s)
    gpus = sum(max(m.gpus, 1) for m in members)
    stay = slowdown_cost_s(remaining, clock_ratio) * gpus
    leave = sum((m.lost_s + restart_s) * max(m.gpus, 1) for m in members)
    leave += slowdown_cost_s(remaining, new_clock_ratio) * gpus
    return GangVerdict(stay > leave, stay, leave)
