"""What kelvin has bound, per pod UID: what makes ``/bind`` idempotent.

kube-scheduler may send the same ``ExtenderBindingArgs`` twice (a retry after its httpTimeout, a restarted binding
cycle, a replayed request). Without a record, a second bind of a pod picks GPUs again (the first ones are taken in the
overlay by then) and charges the pod twice: ``gpus 2``, then ``gpus 3``. With it, a repeat of a bind that succeeded
succeeds again without a new charge or API call; one that arrives while the first is still at the API server waits
for that first outcome; one whose first attempt may or may not have been applied (no answer, a 5xx, the deadline)
re-sends the same GPUs instead of choosing new ones. A bind the API server refused leaves no record: the retry is a
fresh bind.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum

from ..model import GpuAssignment

#: UIDs remembered (least recently used dropped first): far more pods than bind within the ledger's TTL.
BIND_RECORDS = 20_000


class BindState(Enum):
    PENDING = "pending"
    """At the API server now."""
    BOUND = "bound"
    """The Binding was created."""
    UNCERTAIN = "uncertain"
    """The Binding may or may not have been applied; its GPUs stay assumed."""


@dataclass(slots=True)
class BindRecord:
    node: str
    state: BindState = BindState.PENDING
    gpus: tuple[int, ...] = ()
    assignment: GpuAssignment | None = None
    """The claim assumed in the ledger for this bind (``None``: no GPUs, or not assumed yet)."""
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the attempt that created the record has its outcome (the state is no longer PENDING)."""


class BindRecords:
    """Bounded LRU of :class:`BindRecord` by pod UID."""

    def __init__(self, size: int = BIND_RECORDS) -> None:
        self.size = size
        self._d: OrderedDict[str, BindRecord] = OrderedDict()

    def get(self, uid: str) -> BindRecord | None:
        rec = self._d.get(uid)
        if rec is not None:
            self._d.move_to_end(uid)
        return rec

    def start(self, uid: str, node: str) -> BindRecord:
        """A PENDING record for a new attempt of ``uid`` on ``node`` (replacing any earlier one)."""
        rec = self._d[uid] = BindRecord(node)
        self._d.move_to_end(uid)
        while len(self._d) > self.size:
            self._d.popitem(last=False)
        return rec

    def settle(self, uid: str, rec: BindRecord, state: BindState | None) -> None:
        """End ``rec``'s attempt in ``state``; ``None`` drops the record (the bind certainly did not happen)."""
        if state is None:
            if self._d.get(uid) is rec:
                del self._d[uid]
        else:
            rec.state = state
        rec.settled.set()

    def __len__(self) -> int:
        return len(self._d)
