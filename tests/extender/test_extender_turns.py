"""The event loop polls its sockets between any two verbs (issue 14 item 17: a new connection waited for whole
passes of queued verbs before it was even accepted). Deterministic: no timings, only the order of events."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from ext_helpers import args, make_extender, pod

from scheduler_plugin.extender.app import create_app
from scheduler_plugin.extender.turns import LoopTurns


class SocketProbe:
    """A socket pair whose reading end the event loop watches: ``poke()`` writes a byte, and the loop's reader
    callback counts it only when the loop polls its sockets."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.r, self.w = socket.socketpair()
        self.r.setblocking(False)
        self.read = 0
        loop.add_reader(self.r.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        self.read += len(self.r.recv(4096))

    def poke(self) -> None:
        self.w.send(b"x")

    def close(self) -> None:
        self.loop.remove_reader(self.r.fileno())
        self.r.close()
        self.w.close()


@pytest.fixture
async def probe() -> AsyncIterator[SocketProbe]:
    p = SocketProbe(asyncio.get_running_loop())
    yield p
    p.close()


async def test_turns_poll_the_sockets_between_two_verbs(probe: SocketProbe) -> None:
    turns = LoopTurns()
    seen: list[int] = []

    async def verb() -> None:
        async with turns:
            seen.append(probe.read)  # how many earlier pokes the loop has read from its sockets
            probe.poke()

    await asyncio.gather(*(verb() for _ in range(6)))  # all six ready in the same pass of the loop
    assert seen == [0, 1, 2, 3, 4, 5]


async def test_turns_are_first_come_first_served_and_free_when_idle() -> None:
    turns = LoopTurns()
    order: list[int] = []

    async def verb(i: int) -> None:
        async with turns:
            order.append(i)

    await asyncio.gather(*(verb(i) for i in range(5)))
    assert order == [0, 1, 2, 3, 4]
    for _ in range(3):  # the last turn ends in a later pass of the loop
        await asyncio.sleep(0)
    assert not turns.busy


async def test_a_cancelled_waiter_does_not_hold_up_the_turns() -> None:
    turns = LoopTurns()
    ran: list[str] = []

    async def verb(name: str) -> None:
        async with turns:
            ran.append(name)

    first = asyncio.create_task(verb("first"))
    gone = asyncio.create_task(verb("gone"))
    last = asyncio.create_task(verb("last"))
    await asyncio.sleep(0)  # first has the turn, the others wait
    gone.cancel()
    await asyncio.gather(first, last, return_exceptions=True)
    assert ran == ["first", "last"] and gone.cancelled()


async def test_the_extender_polls_its_sockets_between_the_verbs_of_concurrent_requests(probe: SocketProbe) -> None:
    """Through the app: concurrent filter and prioritize requests whose verbs would all have run in one pass."""
    ext = make_extender()[0]
    await ext.cache.start()
    seen: list[int] = []
    real_filter, real_prioritize = ext.filter, ext.prioritize

    def watched(real: Any) -> Any:
        def verb(a: Any) -> Any:
            seen.append(probe.read)
            probe.poke()
            return real(a)

        return verb

    ext.filter = watched(real_filter)  # type: ignore[method-assign]
    ext.prioritize = watched(real_prioritize)  # type: ignore[method-assign]
    try:
        transport = httpx.ASGITransport(app=create_app(ext))
        async with httpx.AsyncClient(transport=transport, base_url="http://kelvin") as c:
            body = args(pod())
            replies = await asyncio.gather(
                *(c.post("/filter" if i % 2 else "/prioritize", content=body) for i in range(8))
            )
    finally:
        await ext.cache.stop()
    assert [r.status_code for r in replies] == [200] * 8
    assert seen == list(range(8))
