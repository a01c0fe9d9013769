"""The exporter's listener on 127.0.0.1 with raw sockets: gzip negotiation by q-value, HEAD on every GET route, the
connection cap and idle timeout with bounded threads, HTTP/0.9 and malformed request lines closed at once."""

from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scheduler_plugin.exporter.app import Exporter
from scheduler_plugin.exporter.exposition import gzip_accepted
from scheduler_plugin.exporter.limits import ServeLimits
from scheduler_plugin.nvml.fake import FakeNvml, write_proc

ROUTES = ("/metrics", "/v1/node", "/healthz")


def serve(tmp_path: Path, limits: ServeLimits) -> tuple[Exporter, int]:
    fake = FakeNvml(4, "H100-SXM-80GB", seed=3, vary=False)
    write_proc(fake, tmp_path / "proc", tmp_path / "pods")
    exporter = Exporter(
        fake, "n1", proc_root=tmp_path / "proc", pods_dir=tmp_path / "pods", watch_xid=False, limits=limits
    )
    return exporter, exporter.start("127.0.0.1", 0)


@pytest.fixture
def port(tmp_path: Path) -> Iterator[int]:
    exporter, bound = serve(tmp_path, ServeLimits(header_timeout_s=30, idle_timeout_s=30))
    try:
        yield bound
    finally:
        exporter.stop()


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and the seconds that took."""
    start, got = time.monotonic(), b""
    while chunk := sock.recv(65536):
        got += chunk
    return got, time.monotonic() - start


def read_response(sock: socket.socket, *, head: bool = False) -> tuple[int, dict[str, str], bytes, bytes]:
    """One response off a keep-alive connection: status, headers (lower-case names), body, bytes read past it."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-head: {buf!r}"
        buf += chunk
    raw, rest = buf.split(b"\r\n\r\n", 1)
    status_line, *lines = raw.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    length = 0 if head else int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        rest += chunk
    return int(status_line.split()[1]), headers, rest[:length], rest[length:]


# -- gzip: q-values honoured ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        ("gzip", True),
        ("GZIP", True),
        ("deflate, gzip;q=0.5", True),
        ("x-gzip", True),
        ("*", True),
        ("gzip;q=0", False),
        ("gzip; q=0.000", False),
        ("gzip;q=0, *;q=1", False),  # gzip named and refused: the wildcard does not bring it back
        ("*;q=0", False),
        ("identity", False),
        ("br, deflate", False),
        ("gzip;q=abc", False),
        ("gzip;q=nan", False),
        ("gzip;q=2", False),
        ("", False),
    ],
)
def test_gzip_is_chosen_by_its_q_value(header: str, accepted: bool) -> None:
    assert gzip_accepted(header) is accepted


def test_gzip_q0_gets_an_uncompressed_scrape(port: int) -> None:
    url = f"http://127.0.0.1:{port}/metrics"
    refused = httpx.get(url, headers={"Accept-Encoding": "gzip;q=0"}, timeout=5)
    assert refused.status_code == 200 and "content-encoding" not in refused.headers
    assert refused.content.startswith(b"# HELP ")
    wanted = httpx.get(url, headers={"Accept-Encoding": "gzip"}, timeout=5)
    assert wanted.headers["content-encoding"] == "gzip"
    assert "Accept-Encoding" in wanted.headers["vary"]
    sock = connect(port)  # httpx decodes gzip itself: check the bytes on the wire are gzip
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
    _, headers, body, _ = read_response(sock)
    sock.close()
    assert headers["content-encoding"] == "gzip" and gzip.decompress(body).startswith(b"# HELP ")


# -- HEAD on every GET route -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ROUTES)
def test_head_answers_like_get_without_a_body(port: int, path: str) -> None:
    sock = connect(port)
    sock.sendall(f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    status, head_headers, _, rest = read_response(sock, head=True)
    assert status == 200 and int(head_headers["content-length"]) > 0
    # the same connection answers a GET next: had the HEAD carried a body, its bytes would come first
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    tail, _ = read_until_closed(sock)
    sock.close()
    assert (rest + tail).startswith(b"HTTP/1.1 200 OK\r\n"), (rest + tail)[:80]
    got = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)
    assert got.headers["content-type"] == head_headers["content-type"]


def test_other_methods_are_405_naming_the_allowed_ones(port: int) -> None:
    for method in ("POST", "PUT", "DELETE", "OPTIONS"):
        r = httpx.request(method, f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD", method
        assert "GET and HEAD" in r.json()["error"]
    assert httpx.head(f"http://127.0.0.1:{port}/nope", timeout=5).status_code == 404


# -- malformed request lines ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [b"GET /metrics\r\n", b"\r\nGET /metrics\n", b"GARBAGE\r\n", b"GET /metrics HTTP/2.0\r\n", b"\x16\x03\x01\r\n"],
)
def test_a_request_line_that_is_not_http1_is_answered_400_and_closed_at_once(port: int, line: bytes) -> None:
    # idle timeout 30 s: a close within 2 s is the request line's doing, not the timeout's
    sock = connect(port, timeout=10)
    sock.sendall(line)
    got, took = read_until_closed(sock)
    sock.close()
    assert got.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"not an HTTP/1.x request line" in got
    assert took < 2.0


# -- bounded threads, connection cap, idle timeout ---------------------------------------------------------------


def test_idle_connections_take_no_thread_and_the_cap_refuses_one_more(tmp_path: Path) -> None:
    cap = 40
    exporter, bound = serve(
        tmp_path, ServeLimits(max_connections=cap, header_timeout_s=30, idle_timeout_s=30, workers=2)
    )
    held: list[socket.socket] = []
    try:
        assert httpx.get(f"http://127.0.0.1:{bound}/metrics", timeout=5).status_code == 200  # pool warm
        threads = threading.active_count()
        held = [connect(bound) for _ in range(cap)]
        deadline = time.monotonic() + 5
        while exporter.http is not None and exporter.http.open_connections < cap and time.monotonic() < deadline:
            time.sleep(0.01)
        assert exporter.http is not None and exporter.http.open_connections == cap
        assert threading.active_count() == threads  # 40 idle connections, not one thread more

        extra = connect(bound)  # one over the cap: 503 without sending anything, then closed
        got, took = read_until_closed(extra)
        extra.close()
        assert got.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and took < 2.0
        assert exporter.http.refused == 1

        held.pop().close()  # a slot frees: served again
        deadline = time.monotonic() + 5
        while exporter.http.open_connections >= cap and time.monotonic() < deadline:
            time.sleep(0.01)
        assert httpx.get(f"http://127.0.0.1:{bound}/healthz", timeout=5).status_code == 200
        assert threading.active_count() == threads
    finally:
        for sock in held:
            sock.close()
        exporter.stop()


def test_a_connection_that_sends_no_request_head_in_time_is_closed(tmp_path: Path) -> None:
    exporter, bound = serve(tmp_path, ServeLimits(header_timeout_s=0.5, idle_timeout_s=0.5))
    try:
        silent = connect(bound)
        got, took = read_until_closed(silent)
        silent.close()
        assert got == b"" and 0.3 < took < 3.0

        # a head trickled in, a header every 0.1 s: closed at the timeout all the same
        trickle = connect(bound)
        trickle.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        start, closed = time.monotonic(), False
        for i in range(40):  # at most 4 s
            try:
                trickle.sendall(f"X-Slow-{i}: y\r\n".encode())
            except OSError:
                closed = True
                break
            trickle.settimeout(0.1)
            try:
                if trickle.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
        trickle.close()
        assert closed and time.monotonic() - start < 3.0

        # after a response, an idle keep-alive connection is closed too
        kept = connect(bound)
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, _, _ = read_response(kept)
        assert status == 200
        got, took = read_until_closed(kept)
        kept.close()
        assert got == b"" and took < 3.0
        assert exporter.http is not None and exporter.http.timed_out >= 2
    finally:
        exporter.stop()


def test_serve_limits_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        ServeLimits(max_connections=0)
    with pytest.raises(ValueError, match="idle_timeout_s"):
        ServeLimits(idle_timeout_s=float("nan"))
    with pytest.raises(ValueError, match="header_timeout_s"):
        ServeLimits(header_timeout_s=float("inf"))
    with pytest.raises(ValueError, match="workers"):
        ServeLimits(workers=0)


def test_an_empty_line_before_the_request_line_is_allowed(port: int) -> None:
    sock = connect(port)
    sock.sendall(b"\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    got, _ = read_until_closed(sock)
    sock.close()
    assert got.startswith(b"HTTP/1.1 200 OK\r\n"), got[:80]
