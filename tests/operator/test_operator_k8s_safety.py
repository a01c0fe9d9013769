"""The operator never acts on an API answer it cannot read: a malformed success body is an error, and taints are
only patched with the node's resourceVersion (so a merge patch cannot replace a taint list it did not see).

The API is a real HTTP server on loopback (aiohttp) that answers every request with one canned body."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import orjson
import pytest
from aiohttp import web
from kelvin_operator.k8s import OperatorKube

from scheduler_plugin.kubeapi import KubeClient, KubeConfig, KubeError


@dataclass
class Seen:
    method: str
    path: str
    content: bytes


@dataclass
class FakeApi:
    """Answers each request with ``answer`` (status, body) and records it."""

    answer: tuple[int, bytes] = (200, b"{}")
    seen: list[Seen] = field(default_factory=list)
    client: KubeClient | None = None

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(Seen(request.method, request.path, await request.read()))
        status, body = self.answer
        return web.Response(status=status, body=body, content_type="application/json")


@pytest.fixture
async def api() -> AsyncIterator[FakeApi]:
    fake = FakeApi()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fake.client = KubeClient(KubeConfig(server=f"http://127.0.0.1:{port}"), timeout_s=5.0)
    yield fake
    await fake.client.close()
    await runner.cleanup()


def kube(api: FakeApi, status: int, body: bytes) -> tuple[OperatorKube, Callable[[], list[Seen]]]:
    assert api.client is not None
    api.answer = (status, body)
    return OperatorKube(api.client), lambda: api.seen


TRUNCATED = b'{"metadata":{"name":"n1","resourceVersion":"7"},"spec":{"taints":[{"key":"other","effect":"NoSchedule"}]'


@pytest.mark.parametrize("body", [TRUNCATED, b"[1, 2]", b"<html>oops</html>"])
async def test_a_malformed_success_is_an_error_and_no_patch_is_sent(api: FakeApi, body: bytes) -> None:
    op, seen = kube(api, 200, body)
    with pytest.raises(KubeError, match="GET /api/v1/nodes/n1: malformed answer from the API server"):
        await op.set_taint("n1", "kelvin.dev/thermal", "hot", "NoSchedule", True)
    assert [r.method for r in seen()] == ["GET"]


async def test_taints_are_not_patched_without_a_resource_version(api: FakeApi) -> None:
    node = {"metadata": {"name": "n1"}, "spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]}}
    op, seen = kube(api, 200, orjson.dumps(node))
    with pytest.raises(KubeError, match=r"no metadata\.resourceVersion"):
        await op.set_taint("n1", "kelvin.dev/thermal", "hot", "NoSchedule", True)
    assert [r.method for r in seen()] == ["GET"]


async def test_the_patch_keeps_other_taints_and_carries_the_resource_version(api: FakeApi) -> None:
    node = {
        "metadata": {"name": "n1", "resourceVersion": "7"},
        "spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]},
    }
    op, seen = kube(api, 200, orjson.dumps(node))
    assert await op.set_taint("n1", "kelvin.dev/thermal", "hot", "NoSchedule", True)
    patch = orjson.loads(seen()[-1].content)
    assert seen()[-1].method == "PATCH" and seen()[-1].path == "/api/v1/nodes/n1"
    assert patch["metadata"] == {"resourceVersion": "7"}
    assert [t["key"] for t in patch["spec"]["taints"]] == ["other", "kelvin.dev/thermal"]
