"""A slow API server cannot hold a bind past kelvin's deadline (below kube-scheduler's httpTimeout), and a burst of
binds reaches the API server a bounded number at a time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from ext_helpers import args, make_extender, pod

from scheduler_plugin.extender.app import create_app
from scheduler_plugin.extender.binder import BIND_TIMEOUT_S, KubeBinder
from scheduler_plugin.kubeapi import KubeClient, KubeConfig
from scheduler_plugin.settings import Settings


class StalledApiServer:
    """Accepts connections, reads what is sent and never answers (an overloaded or wedged API server)."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0
        self.changed = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        self.changed.set()
        while data := await reader.read(65536):
            self.requests += data.count(b"HTTP/1.1\r\n")
            self.changed.set()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        for w in self._writers:
            w.close()
        assert self._server is not None
        self._server.close()


@pytest.fixture
async def stalled() -> AsyncIterator[tuple[StalledApiServer, str]]:
    server = StalledApiServer()
    async with server as url:
        yield server, url


def test_the_default_deadline_is_below_kube_schedulers_http_timeout() -> None:
    assert 0 < BIND_TIMEOUT_S < 5.0  # kube-scheduler's default extender httpTimeout
    assert Settings().bind_timeout_s == BIND_TIMEOUT_S  # the setting's default


async def test_bind_gives_up_before_the_scheduler_does(stalled: tuple[StalledApiServer, str]) -> None:
    server, url = stalled
    client = KubeClient(KubeConfig(server=url), timeout_s=30.0)  # the client alone would wait 30 s
    ext, _, _ = make_extender(binder=KubeBinder(client))
    ext.bind_timeout_s = 0.3
    await ext.cache.refresh_once()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(ext)), base_url="http://kelvin") as c:
        await c.post("/filter", content=args(pod(gpus=1)))
        body = {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "gpu-node-2"}
        r = await asyncio.wait_for(c.post("/bind", json=body), 10)
    err = r.json()["Error"]
    assert "binding pod default/p1 to gpu-node-2" in err
    assert "did not answer within 0.3 s" in err and "httpTimeout" in err
    assert server.requests == 1
    # The Binding may still land: its GPUs stay assumed until the TTL or the pod list says otherwise.
    assert [a.pod_key for a in ext.ledger.entries(ext.clock())["gpu-node-2"]] == ["default/p1"]
    await client.close()


async def test_reading_an_unseen_pod_has_the_same_deadline(stalled: tuple[StalledApiServer, str]) -> None:
    _, url = stalled
    client = KubeClient(KubeConfig(server=url), timeout_s=30.0)
    ext, _, _ = make_extender(binder=KubeBinder(client))
    ext.bind_timeout_s = 0.3
    await ext.cache.refresh_once()
    body = {"PodName": "p9", "PodNamespace": "default", "PodUID": "uid-p9", "Node": "gpu-node-2"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(ext)), base_url="http://kelvin") as c:
        r = await asyncio.wait_for(c.post("/bind", json=body), 10)
    err = r.json()["Error"]
    assert "cannot read pod default/p9" in err and "did not answer within 0.3 s" in err
    assert len(ext.ledger) == 0
    await client.close()


async def test_a_burst_of_binds_reaches_the_api_server_a_bounded_number_at_a_time(
    stalled: tuple[StalledApiServer, str],
) -> None:
    server, url = stalled
    client = KubeClient(KubeConfig(server=url), timeout_s=30.0)
    binder = KubeBinder(client, max_in_flight=2)
    binds = [asyncio.create_task(binder.bind("default", f"p{i}", "", "gpu-node-1", (i,))) for i in range(6)]
    while server.requests < 2:
        server.changed.clear()
        await asyncio.wait_for(server.changed.wait(), 10)
    # Wait (no fixed sleep) until the other four are queued on the binder's slots; without the bound they would
    # never queue there (they would be on the wire instead) and this times out.
    async with asyncio.timeout(10):
        while len(binder._slots._waiters or ()) < 4:  # type: ignore[attr-defined]
            await asyncio.sleep(0)
    assert server.requests == 2 and server.connections == 2
    for t in binds:
        t.cancel()
    await asyncio.gather(*binds, return_exceptions=True)
    await client.close()
    with pytest.raises(ValueError, match="max_in_flight"):
        KubeBinder(client, max_in_flight=0)


class BlockedBinder:
    """Binds only when released: a bind waiting on the API server."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def get_pod(self, namespace: str, name: str) -> None:
        return None

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: tuple[int, ...]) -> None:
        self.started.set()
        await self.release.wait()

    async def close(self) -> None:
        return None


async def test_a_bind_waiting_on_the_api_server_does_not_hold_back_the_refresh() -> None:
    binder = BlockedBinder()
    ext, _, _ = make_extender(binder=binder)
    await ext.cache.refresh_once()
    gate = ext.cache.gate
    gate.max_defer_s = 3600.0  # a refresh would wait for a busy request all that time
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(ext)), base_url="http://kelvin") as c:
        await c.post("/filter", content=args(pod(gpus=1)))
        body = {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "gpu-node-2"}
        bind = asyncio.create_task(c.post("/bind", json=body))
        await asyncio.wait_for(binder.started.wait(), 10)
        assert gate.active == 1 and gate.busy == 0
        assert await asyncio.wait_for(ext.cache.refresh_once(), 10)  # not deferred behind the pending bind
        binder.release.set()
        r = await asyncio.wait_for(bind, 10)
    assert r.json() == {"Error": ""}
    assert gate.active == 0 and gate.awaiting_io == 0


async def test_the_deadline_counts_from_the_requests_arrival() -> None:
    """A request that waited before bind ran (its body, a turn of the refresh) has less time left: a bind that
    arrived a deadline ago fails at once instead of waiting on the API server."""
    binder = BlockedBinder()
    ext, _, _ = make_extender(binder=binder)
    ext.bind_timeout_s = 30.0
    await ext.cache.refresh_once()
    ext.filter(args(pod(gpus=1)))
    body = b'{"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "gpu-node-2"}'
    arrived = asyncio.get_running_loop().time() - 30.0
    # The binder never answers: were the arrival ignored, the bind would wait the full 30 s and time out here.
    r = await asyncio.wait_for(ext.bind(body, arrived=arrived), 5)
    assert "did not answer within 30 s" in r["Error"]


async def test_the_route_takes_the_arrival_before_reading_the_body() -> None:
    ext, _, _ = make_extender(binder=BlockedBinder())
    seen: dict[str, float] = {}

    async def spy(body: object, arrived: float | None = None) -> dict[str, str]:
        assert arrived is not None
        seen["arrived"] = arrived
        return {"Error": "spied"}

    ext.bind = spy  # type: ignore[method-assign]

    async def chunks() -> AsyncIterator[bytes]:
        seen["body_read"] = asyncio.get_running_loop().time()
        yield b'{"PodName": "p1", "PodNamespace": "default", "PodUID": "", "Node": "gpu-node-2"}'

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(ext)), base_url="http://kelvin") as c:
        r = await c.post("/bind", content=chunks())
    assert r.json() == {"Error": "spied"}
    assert seen["arrived"] <= seen["body_read"]
