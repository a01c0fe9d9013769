"""The operator never acts on an API answer it cannot read: a malformed success body is an error, and taints are
only patched with the node's resourceVersion (so a merge patch cannot replace a taint list it did not see)."""

from __future__ import annotations

import httpx
import pytest
from kelvin_operator.k8s import OperatorKube

from scheduler_plugin.kube import KubeClient, KubeConfig, KubeError


def kube(handler: httpx.MockTransport) -> tuple[KubeClient, list[httpx.Request]]:
    client = KubeClient(KubeConfig(server="http://api.test"))
    seen: list[httpx.Request] = []

    def record(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return handler.handle_request(req)

    client._http = httpx.AsyncClient(base_url="http://api.test", transport=httpx.MockTransport(record))
    return client, seen


TRUNCATED = b'{"metadata":{"name":"n1","resourceVersion":"7"},"spec":{"taints":[{"key":"other","effect":"NoSchedule"}]'


@pytest.mark.parametrize("body", [TRUNCATED, b"[1, 2]", b"<html>oops</html>"])
async def test_a_malformed_success_is_an_error_and_no_patch_is_sent(body: bytes) -> None:
    client, seen = kube(httpx.MockTransport(lambda req: httpx.Response(200, content=body)))
    with pytest.raises(KubeError, match="GET /api/v1/nodes/n1: malformed answer from the API server"):
        await OperatorKube(client).set_taint("n1", "kelvin.dev/thermal", "hot", "NoSchedule", True)
    assert [r.method for r in seen] == ["GET"]


async def test_taints_are_not_patched_without_a_resource_version() -> None:
    node = {"metadata": {"name": "n1"}, "spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]}}
    client, seen = kube(httpx.MockTransport(lambda req: httpx.Response(200, json=node)))
    with pytest.raises(KubeError, match=r"no metadata\.resourceVersion"):
        await OperatorKube(client).set_taint("n1", "kelvin.dev/thermal", "hot", "NoSchedule", True)
    assert [r.method for r in seen] == ["GET"]


async def test_the_patch_keeps_other_taints_and_carries_the_resource_version() -> None:
    import json

    node = {
        "metadata": {"name": "n1", "resourceVersion": "7"},
        "spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]},
    }
    client, seen = kube(httpx.MockTransport(lambda req: httpx.Response(200, json=node)))
    assert await OperatorKube(client).set_taint("n1", "kelvin.dev/thermal", "hot", "NoSchedule", True)
    patch = json.loads(seen[-1].content)
    assert seen[-1].method == "PATCH" and patch["metadata"] == {"resourceVersion": "7"}
    assert [t["key"] for t in patch["spec"]["taints"]] == ["other", "kelvin.dev/thermal"]
