"""Sharing one event loop between requests and background work: :class:`RequestGate`.

The extender's routes mark each verb as being served (:meth:`RequestGate.serving`); the snapshot cache's build calls
:meth:`RequestGate.pause` between slices, and so does a source whose fetch builds many objects (the simulated fleet).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterator

#: Least share of the event loop that a snapshot refresh gets while requests keep it busy (see :class:`RequestGate`):
#: a 20,000-node refresh (about 4 s of CPU on a 2-core box) then completes within about 16 s however heavy the load.
DEFAULT_BACKGROUND_SHARE = 0.25
#: The share once the snapshot is about to go stale (see ``SnapshotCache.urgency``).
URGENT_BACKGROUND_SHARE = 0.75


class RequestGate:
    """Shares the event loop between the hot path (requests) and background work (building a snapshot).

    The extender's routes wrap each verb in :meth:`serving`; the snapshot build calls :meth:`pause` between slices.
    Background work runs in *turns*: :meth:`pause` returns at once while the current turn lasts, and when it is over
    steps aside: it yields to the event loop and, while requests are being served, keeps waiting (polling every
    ``poll_s``) for up to ``max_defer_s``. The next turn then lasts ``share / (1 - share)`` of the time it waited
    (at least ``min_turn_s``, at most ``max_turn_s``), so that background work gets at least ``share`` of the event
    loop however many requests arrive (as long as no single request holds the loop for more than ``max_turn_s * (1 -
    share) / share``): a refresh is slowed down by load, never starved by it (deferred slice by slice without that
    share, a 20,000-node refresh under two clients looping ``/filter`` would never finish, and every node would go
    stale). A request
    waits for at most one turn. Without requests a turn is ``min_turn_s`` and the work runs at full speed. Single
    event loop: no locks.

    ``urgency`` (0 to 1, read at each step-aside) raises the share linearly up to ``max_share``: the snapshot cache
    reports how close its snapshot is to going stale, so that on a starved CPU requests get slower before every node
    is refused as stale.
    """

    def __init__(
        self,
        *,
        share: float = DEFAULT_BACKGROUND_SHARE,
        max_share: float = URGENT_BACKGROUND_SHARE,
        min_turn_s: float = 0.002,
        max_turn_s: float = 0.2,
        poll_s: float = 0.0005,
        max_defer_s: float = 0.02,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not 0.0 < share <= max_share < 1.0:
            raise ValueError(f"need 0 < share <= max_share < 1, got share={share!r}, max_share={max_share!r}")
        if not 0 < min_turn_s <= max_turn_s:
            raise ValueError(f"need 0 < min_turn_s <= max_turn_s, got {min_turn_s!r} and {max_turn_s!r}")
        self.share = share
        """Least share of the event loop's time that background work gets while requests keep it busy."""
        self.max_share = max_share
        self.urgency: Callable[[], float] | None = None
        """How urgent the background work is now, 0 to 1 (None: never urgent)."""
        self.min_turn_s = min_turn_s
        self.max_turn_s = max_turn_s
        """Longest turn, whatever the wait before it (a long request, the process not scheduled): what a request
        may have to wait for background work."""
        self.poll_s = poll_s
        self.max_defer_s = max_defer_s
        self.clock = clock
        self.active = 0
        """Requests being served now."""
        self.awaiting_io = 0
        """Of those, requests waiting on another server (a bind's API call): they use no CPU meanwhile."""
        self._turn_ends = -math.inf

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1

    @contextlib.contextmanager
    def awaiting(self) -> Iterator[None]:
        """Within :meth:`serving`: the request now waits on I/O (e.g. a bind on the API server), so background work
        need not step aside for it (nor make its answer wait for a long turn when it comes back)."""
        self.awaiting_io += 1
        try:
            yield
        finally:
            self.awaiting_io -= 1

    @property
    def busy(self) -> int:
        """Requests being served that are not waiting on I/O."""
        return self.active - self.awaiting_io

    async def pause(self) -> None:
        stepped_aside = self.clock()
        if stepped_aside < self._turn_ends:
            return  # this turn of background work is not over yet
        await asyncio.sleep(0)
        deadline = stepped_aside + self.max_defer_s
        while self.busy > 0 and self.clock() < deadline:
            await asyncio.sleep(self.poll_s)
        resumed = self.clock()
        share = self.share
        if self.urgency is not None:
            share += (self.max_share - share) * min(1.0, max(0.0, self.urgency()))
        earned = (resumed - stepped_aside) * share / (1.0 - share)
        self._turn_ends = resumed + min(self.max_turn_s, max(self.min_turn_s, earned))
