"""The checkpoint handshake, as a pure decision over a pod's annotations (so it survives operator restarts).

1. The operator writes ``kelvin.dev/checkpoint-requested=<RFC 3339 time>`` on a pod annotated
   ``kelvin.dev/checkpoint: "true"`` that it wants to evict.
2. The workload checkpoints and writes ``kelvin.dev/checkpoint-done=<RFC 3339 time>``, later than the request.
3. The operator evicts it then, or once ``timeout_s`` has passed since the request.

A request older than :func:`stale_after` (twice the timeout, at least ten minutes more than it) belongs to an
earlier attempt: the node cooled, or a PodDisruptionBudget kept blocking the eviction. It is asked again, so a pod
is never evicted on a checkpoint from hours ago.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from scheduler_plugin.model import annotations as ann
from scheduler_plugin.model.times import parse_time


class Step(StrEnum):
    REQUEST = "request"
    WAIT = "wait"
    EVICT_DONE = "done"
    EVICT_TIMEOUT = "timeout"


@dataclass(frozen=True, slots=True)
class Decision:
    step: Step
    requested_at: float | None = None
    waited_s: float = 0.0

    @property
    def evict(self) -> bool:
        return self.step in (Step.EVICT_DONE, Step.EVICT_TIMEOUT)


def stale_after(timeout_s: float) -> float:
    """Seconds after which a checkpoint request no longer belongs to the current eviction attempt."""
    return max(2.0 * timeout_s, timeout_s + 600.0)


def decide(annotations: Mapping[str, str], now: float, timeout_s: float) -> Decision:
    requested = parse_time(annotations.get(ann.CHECKPOINT_REQUESTED))
    if requested is None or requested > now + 60.0 or now - requested > stale_after(timeout_s):
        # never asked, unreadable, from the future (a clock gone wrong), or left over from an earlier attempt
        return Decision(Step.REQUEST)
    waited = max(0.0, now - requested)
    done = parse_time(annotations.get(ann.CHECKPOINT_DONE))
    if done is not None and done > requested:
        return Decision(Step.EVICT_DONE, requested, max(0.0, done - requested))
    if waited >= timeout_s:
        return Decision(Step.EVICT_TIMEOUT, requested, waited)
    return Decision(Step.WAIT, requested, waited)
