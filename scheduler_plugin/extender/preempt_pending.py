"""Preemptions kelvin answered whose victims its records still show: the preemptor's filter retries, never parks.

After the preempt verb, kube-scheduler deletes the victims and, once they are gone from its cache, filters the
preemptor again at once. kelvin learns that the victims left from its pod listing (every few seconds): until then
its records still give their GPUs to them, and the filter would refuse the node. A refusal (``FailedNodes``) parks
the pod in kube-scheduler's unschedulable queue until a cluster event its rejecting plugins care about, or the
5-minute flush: on the e2e cluster a pinned preemptor waited there with its node freed. So while a node kelvin
preempted on for a pod is refused because of victims still in kelvin's records, the filter answers an error, which
kube-scheduler retries with backoff (1 s, doubling to 10 s), as during a telemetry outage.

Pure: no I/O, the clock passed in. Bounded: at most :data:`MAX_PENDING` preemptors, each for :data:`TTL_S`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

TTL_S = 600.0
"""A record is dropped this long after the preemption (victims with long grace periods keep kube-scheduler's count
from fitting meanwhile, so the filter is not even called; this only bounds a record kelvin's listing never settles)."""

MAX_PENDING = 10_000


@dataclass(frozen=True)
class Pending:
    node: str
    victims: frozenset[str]
    """UIDs of the pods kelvin answered to evict there."""
    at: float


class PendingPreemptions:
    def __init__(self, ttl_s: float = TTL_S, size: int = MAX_PENDING) -> None:
        self.ttl_s = ttl_s
        self.size = size
        self._by_pod: OrderedDict[str, dict[str, Pending]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_pod)

    def record(self, pod_uid: str, victims: Mapping[str, Iterable[str]], now: float) -> None:
        """The preempt verb's answer for ``pod_uid``: node -> victim UIDs (kube-scheduler picks one node)."""
        if not pod_uid or not victims:
            return
        self._by_pod.pop(pod_uid, None)
        self._by_pod[pod_uid] = {n: Pending(n, frozenset(v), now) for n, v in victims.items()}
        while len(self._by_pod) > self.size:
            self._by_pod.popitem(last=False)

    def forget(self, pod_uid: str) -> None:
        self._by_pod.pop(pod_uid, None)

    def waiting(
        self, pod_uid: str, refused: Iterable[str], still_listed: Callable[[str], set[str]], now: float
    ) -> str | None:
        """Why the filter of ``pod_uid`` should be retried rather than refused: a node of ``refused`` where kelvin
        preempted for it and ``still_listed(node)`` (UIDs kelvin's records show holding GPUs there) still has some
        of the victims; None otherwise (the record is dropped once it expired or its victims are all gone)."""
        nodes = self._by_pod.get(pod_uid)
        if nodes is None:
            return None
        for name in list(nodes):
            p = nodes[name]
            if now - p.at > self.ttl_s:
                del nodes[name]
                continue
            if name not in refused:
                continue
            left = p.victims & still_listed(name)
            if not left:
                del nodes[name]
                continue
            return (
                f"kelvin preempted {len(p.victims)} pod(s) on {name} for this pod and its pod listing still shows "
                f"{len(left)} of them holding GPUs there; retried once the listing catches up"
            )
        if not nodes:
            self._by_pod.pop(pod_uid, None)
        return None
