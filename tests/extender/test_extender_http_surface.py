"""What the verbs listener serves and nothing more (issue 14 item 19): no OpenAPI schema or docs pages, a 404 for a
path with a trailing slash (not a 307), a 415 naming a Content-Encoding kelvin does not decode, and exit status 0
after a SIGTERM."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from ext_helpers import args, make_extender, pod
from fastapi.testclient import TestClient

from scheduler_plugin.extender.app import create_app, create_metrics_app


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(create_app(make_extender()[0])) as c:
        yield c


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"])
def test_no_schema_or_docs_pages(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 404
    with TestClient(create_metrics_app(make_extender()[0])) as m:
        assert m.get(path).status_code == 404


@pytest.mark.parametrize(
    "path", ["/filter/", "/prioritize/", "/bind/", "/explain/", "/scheduler/filter/", "/healthz/", "/metrics/"]
)
def test_a_trailing_slash_is_404_not_a_redirect(client: TestClient, path: str) -> None:
    r = client.request("POST" if "healthz" not in path and "metrics" not in path else "GET", path, content=b"{}")
    assert r.status_code == 404 and "location" not in r.headers
    r = client.request("POST", path, content=args(pod()), follow_redirects=False)
    assert r.status_code in (404, 405) and not r.is_redirect


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind", "/explain", "/preempt", "/scheduler/filter"])
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_a_verb_asked_without_post_is_405_naming_post(client: TestClient, path: str, method: str) -> None:
    """The verbs are served ahead of FastAPI's router (routes.ExtenderApp); another method than POST is a 405 with
    ``Allow: POST`` and a message, as a router would answer, and never reaches the verb."""
    r = client.request(method, path)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert "answers POST only" in r.json()["Error"] and method in r.json()["Error"]


async def test_a_body_in_many_asgi_messages_is_read_whole() -> None:
    """The server hands a big body over in pieces (``more_body``): the verb reads them all before parsing."""
    ext = make_extender()[0]
    app = create_app(ext)
    body = args(pod())
    pieces = [body[i : i + 7] for i in range(0, len(body), 7)]
    events = [{"type": "http.request", "body": b, "more_body": True} for b in pieces[:-1]]
    events.append({"type": "http.request", "body": pieces[-1], "more_body": False})
    scope = {"type": "http", "method": "POST", "path": "/filter", "headers": [(b"content-length", b"%d" % len(body))]}

    async def receive() -> dict[str, Any]:
        return events.pop(0)

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    assert not events and len(pieces) > 10
    assert sent[0]["status"] == 200  # the first piece alone would be a 400 (not valid JSON)
    assert json.loads(sent[1]["body"]) == ext.filter(body)


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "explain"])
@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "GZIP"])
def test_a_compressed_body_is_415_naming_the_encoding(client: TestClient, verb: str, encoding: str) -> None:
    r = client.post(f"/{verb}", content=gzip.compress(args(pod())), headers={"Content-Encoding": encoding})
    assert r.status_code == 415, r.text
    assert f"Content-Encoding {encoding.lower()!r} is not supported" in r.json()["Error"]
    counted = [line for line in client.get("/metrics").text.splitlines() if line.startswith("kelvin_extender_requests")]
    assert any('code="415"' in line and f'verb="{verb}"' in line for line in counted)


def test_identity_encoding_is_read_as_usual(client: TestClient) -> None:
    r = client.post("/filter", content=args(pod()), headers={"Content-Encoding": "identity"})
    assert r.status_code == 200 and r.json()["Error"] == ""


_SERVE = """
from scheduler_plugin.settings import Settings
from scheduler_plugin.extender.app import build_extender
from scheduler_plugin.extender.server import ExtenderServers, listen

settings = Settings(metrics_port=0, fleet_nodes=2)
servers = ExtenderServers(build_extender(settings), settings, sockets=(listen("127.0.0.1", 0, "port"), None))
print(servers.verbs_url, flush=True)
servers.run()
"""


@pytest.mark.slow
def test_sigterm_stops_the_extender_with_exit_status_0() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KELVIN_", "KUBE"))}
    proc = subprocess.Popen([sys.executable, "-c", _SERVE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().decode().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read().decode() if proc.stderr else url
        deadline = time.monotonic() + 60
        while True:  # until it serves (bounded): the signal must reach a running server
            try:
                if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the extender did not start serving"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
