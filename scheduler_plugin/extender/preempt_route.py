"""The preempt verb's row of the verbs table (``routes.py``): served at ``/preempt`` and ``/scheduler/preempt``,
parsed by :func:`.preempt_wire.parse_preemption`, answered by :class:`.preempt.PreemptVerb` in its turn; an
unexpected failure is a 503 (kube-scheduler then goes on with its own victims)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from .preempt import PreemptVerb
from .preempt_wire import PreemptionArgs, parse_preemption
from .verbs import Verb, in_turn, served_at, unavailable

if TYPE_CHECKING:
    from .service import Extender


def preempt_verb(ext: Extender) -> Verb[PreemptionArgs]:
    return Verb(
        "preempt",
        served_at("preempt"),
        partial(parse_preemption, max_node_names=ext.settings.max_node_names),
        in_turn(ext.turn, PreemptVerb(ext)),
        unavailable,
    )
