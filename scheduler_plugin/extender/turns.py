"""Turns on the event loop for the verbs' CPU work: one verb per pass of the loop, first come first served.

The verbs (filter, prioritize, explain, bind's pick) are CPU work on the event loop thread. The loop runs every
callback that is ready in one pass, then polls the sockets. Under load the bodies of many clients arrive in one poll,
so one pass would run all their verbs back to back: with 64 busy clients a pass lasts as long as 64 verbs (0.5 s and
more), and the loop accepts no connection, reads no socket and answers no /healthz in between. An established
connection waits for about one such pass; a new one needs several passes before its first request is even read
(accept; connection_made; the read; its task), so it waits several times as long (measured without turns: up to
10 s where established connections saw a p99 of 0.46 s; /healthz on a fresh connection 7.25 s).

:class:`LoopTurns` hands the verbs out one at a time, and a turn ends only in the *next* pass of the loop (the release
is scheduled with ``call_soon``), after the loop has polled the sockets: between two verbs it accepts, reads and
answers /healthz. A new connection's request then queues behind the others (FIFO) like any established one, and
/healthz waits for at most a verb or two. Without a queue a turn is taken at once: it costs nothing when idle.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class LoopTurns:
    """``async with turns:`` around one verb's CPU work (no awaits inside: it is one turn of the loop)."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()  # FIFO: a newcomer queues behind the waiters, even between two turns

    @property
    def busy(self) -> bool:
        """A turn is taken (or ends at the next pass of the loop)."""
        return self._lock.locked()

    async def __aenter__(self) -> None:
        await self._lock.acquire()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Not now: in the loop's next pass, after it has polled the sockets (accepts, reads, /healthz).
        asyncio.get_running_loop().call_soon(self._lock.release)
