"""KubeClient (scheduler_plugin/kubeapi.py, aiohttp) against a real HTTP(S) server on loopback, in a thread of its own
so that tests can call the client from several event loops: sessions, errors, TLS and the request it sends."""

from __future__ import annotations

import asyncio
import http.server
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from kelvin_operator.tls import self_signed

from scheduler_plugin.kubeapi import KubeClient, KubeConfig, KubeError


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    peer: tuple[str, int]


@dataclass
class Api:
    """What the server answers (status, body, delay) and what it saw."""

    url: str = ""
    status: int = 200
    body: bytes = b'{"kind":"Pod"}'
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)


def _serve(api: Api, tls: ssl.SSLContext | None = None) -> Iterator[Api]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive

        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            api.seen.append(Seen(self.command, self.path, dict(self.headers), body, self.client_address[:2]))
            time.sleep(api.delay_s)
            self.send_response(api.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(api.body)))
            for name, value in api.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(api.body)

        do_GET = do_POST = do_PATCH = do_DELETE = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    api.url = f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def api() -> Iterator[Api]:
    yield from _serve(Api())


@pytest.fixture
def cert(tmp_path: Path) -> tuple[Path, Path]:
    return self_signed(tmp_path, ["localhost", "127.0.0.1"])


def _tls(cert: tuple[Path, Path], client_cert: bool) -> ssl.SSLContext:
    crt, key = cert
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    if client_cert:  # asks for a client certificate signed by (here: equal to) the server's own
        ctx.load_verify_locations(crt)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@pytest.fixture
def tls_api(cert: tuple[Path, Path]) -> Iterator[Api]:
    yield from _serve(Api(), _tls(cert, client_cert=True))


@pytest.fixture
def tls_api_no_client_cert(cert: tuple[Path, Path]) -> Iterator[Api]:
    yield from _serve(Api(), _tls(cert, client_cert=False))


def test_built_outside_a_loop_and_closed_without_a_call() -> None:
    client = KubeClient(KubeConfig(server="http://127.0.0.1:9"))
    asyncio.run(client.close())
    asyncio.run(client.close())  # twice is fine


@pytest.mark.filterwarnings("error::ResourceWarning")
def test_one_session_per_loop_and_keep_alive(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    """Calls on one loop share one connection; a call from a new loop (asyncio.run again, as a CLI might) gets a new
    session instead of reusing one bound to a closed loop, and the old one is dropped without warnings."""
    client = KubeClient(KubeConfig(server=api.url))

    async def three() -> None:
        for _ in range(3):
            assert await client.get("/api/v1/pods/p") == {"kind": "Pod"}

    asyncio.run(three())
    (first_session,) = client._sessions.values()
    connector = first_session.connector
    asyncio.run(three())  # the first loop is closed now: with one session for all loops this call fails
    assert first_session.closed and connector is not None and connector.closed  # dropped
    (second_session,) = client._sessions.values()
    asyncio.run(client.close())
    assert second_session.closed and not client._sessions
    first, second = {s.peer for s in api.seen[:3]}, {s.peer for s in api.seen[3:]}
    assert len(first) == 1 and len(second) == 1 and first != second
    assert not [r for r in caplog.records if "Unclosed" in r.getMessage()]  # aiohttp logs leaked sessions so


def test_the_request_carries_the_token_the_body_and_the_params(api: Api) -> None:
    client = KubeClient(KubeConfig(server=api.url, token="t0k"))

    async def calls() -> None:
        try:
            await client.get("/api/v1/pods", {"fieldSelector": "spec.nodeName=n1"})
            await client.post("/api/v1/namespaces/d/pods/p/binding", {"kind": "Binding"})
            await client.patch_merge("/api/v1/nodes/n1", {"metadata": {"labels": {"a": "b"}}})
            await client.patch_json("/api/v1/nodes/n1", [{"op": "remove", "path": "/x"}])
            await client.delete("/api/v1/namespaces/d/pods/p")
        finally:
            await client.close()

    asyncio.run(calls())
    assert [(s.method, s.path) for s in api.seen] == [
        ("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1"),
        ("POST", "/api/v1/namespaces/d/pods/p/binding"),
        ("PATCH", "/api/v1/nodes/n1"),
        ("PATCH", "/api/v1/nodes/n1"),
        ("DELETE", "/api/v1/namespaces/d/pods/p"),
    ]
    assert all(s.headers["Authorization"] == "Bearer t0k" for s in api.seen)
    assert all(s.headers["Accept"] == "application/json" for s in api.seen)
    assert [s.headers.get("Content-Type") for s in api.seen] == [
        None,
        "application/json",
        "application/merge-patch+json",
        "application/json-patch+json",
        None,
    ]
    assert orjson.loads(api.seen[1].body) == {"kind": "Binding"}


def _call(client: KubeClient, path: str = "/api/v1/nodes/n1") -> KubeError:
    async def call() -> None:
        try:
            await client.get(path)
        finally:
            await client.close()

    with pytest.raises(KubeError) as err:
        asyncio.run(call())
    return err.value


def test_an_error_status_carries_the_message_and_reason_of_the_status_body(api: Api) -> None:
    api.status, api.body = 404, b'{"kind":"Status","reason":"NotFound","message":"nodes \\"n1\\" not found"}'
    err = _call(KubeClient(KubeConfig(server=api.url)))
    assert err.status == 404 and err.reason == "NotFound"
    assert str(err) == 'HTTP 404: GET /api/v1/nodes/n1: nodes "n1" not found'


def test_an_error_without_a_json_body_carries_its_text(api: Api) -> None:
    api.status, api.body = 503, b"upstream down"
    err = _call(KubeClient(KubeConfig(server=api.url)))
    assert err.status == 503 and str(err) == "HTTP 503: GET /api/v1/nodes/n1: upstream down"


def test_a_malformed_success_is_an_error(api: Api) -> None:
    api.body = b"[1, 2]"
    err = _call(KubeClient(KubeConfig(server=api.url)))
    assert err.status == 200 and "malformed answer from the API server (HTTP 200, not a JSON object" in str(err)


def test_a_redirect_is_not_followed_nor_taken_for_success(api: Api) -> None:
    """A 307 (from a proxy: the API server never redirects) did not apply the Binding: an error, not ``{}``."""
    api.status, api.body, api.headers = 307, b"{}", {"Location": "/elsewhere"}
    client = KubeClient(KubeConfig(server=api.url))

    async def call() -> dict[str, Any]:
        try:
            return await client.post("/api/v1/namespaces/d/pods/p/binding", {"kind": "Binding"})
        finally:
            await client.close()

    with pytest.raises(KubeError) as err:
        asyncio.run(call())
    assert err.value.status == 307
    assert [(s.method, s.path) for s in api.seen] == [("POST", "/api/v1/namespaces/d/pods/p/binding")]


def test_an_unreachable_server_is_status_0() -> None:
    err = _call(KubeClient(KubeConfig(server="http://127.0.0.1:9"), timeout_s=2.0))
    assert err.status == 0 and "GET /api/v1/nodes/n1: API server unreachable" in str(err)
    assert err.sent is False  # no connection: the request cannot have been applied


def test_a_timeout_is_status_0(api: Api) -> None:
    api.delay_s = 5.0
    started = time.monotonic()
    err = _call(KubeClient(KubeConfig(server=api.url), timeout_s=0.2))
    assert err.status == 0 and "API server unreachable" in str(err)
    assert err.sent is True  # the request went out: the API server may have applied it
    assert time.monotonic() - started < 3.0  # gave up long before the 5 s answer


def test_tls_with_the_ca_and_a_client_certificate(tls_api: Api, cert: tuple[Path, Path]) -> None:
    crt, key = cert
    client = KubeClient(KubeConfig(server=tls_api.url, ca_file=str(crt), cert_file=str(crt), key_file=str(key)))

    async def call() -> dict[str, Any]:
        try:
            return await client.get("/api/v1/nodes/n1")
        finally:
            await client.close()

    assert asyncio.run(call()) == {"kind": "Pod"}


def test_tls_without_the_servers_ca_is_refused(tls_api: Api, cert: tuple[Path, Path], tmp_path: Path) -> None:
    crt, key = cert
    (tmp_path / "other").mkdir()
    other_ca, _ = self_signed(tmp_path / "other", ["127.0.0.1"])
    err = _call(
        KubeClient(KubeConfig(server=tls_api.url, ca_file=str(other_ca), cert_file=str(crt), key_file=str(key)))
    )
    assert err.status == 0 and "certificate verify failed" in str(err)


def test_tls_insecure_still_presents_the_client_certificate(tls_api: Api, cert: tuple[Path, Path]) -> None:
    """``insecure-skip-tls-verify`` with client-certificate auth (kind, some kubeadm kubeconfigs): the server is not
    checked, but the client certificate must still be sent, or the API server refuses the handshake."""
    crt, key = cert
    client = KubeClient(KubeConfig(server=tls_api.url, insecure=True, cert_file=str(crt), key_file=str(key)))

    async def call() -> dict[str, Any]:
        try:
            return await client.get("/api/v1/nodes/n1")
        finally:
            await client.close()

    assert asyncio.run(call()) == {"kind": "Pod"}


def test_tls_insecure_skips_the_check(tls_api_no_client_cert: Api) -> None:
    client = KubeClient(KubeConfig(server=tls_api_no_client_cert.url, insecure=True))

    async def call() -> dict[str, Any]:
        try:
            return await client.get("/api/v1/nodes/n1")
        finally:
            await client.close()

    assert asyncio.run(call()) == {"kind": "Pod"}
    assert _call(KubeClient(KubeConfig(server=tls_api_no_client_cert.url))).status == 0  # verified: unknown CA
