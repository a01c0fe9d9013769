"""A small synchronous client of the loopback API server (httpx), for the fixtures and the scenarios' assertions:
what the API server shows is what the tests check."""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, response: httpx.Response) -> None:
        self.status = response.status_code
        self.body = response.text
        super().__init__(f"{response.request.method} {response.request.url.path}: {self.status} {self.body[:2000]}")


class Api:
    def __init__(
        self,
        server: str,
        ca: Path,
        *,
        cert: tuple[Path, Path] | None = None,
        token: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        context = ssl.create_default_context(cafile=str(ca))
        if cert is not None:
            context.load_cert_chain(str(cert[0]), str(cert[1]))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = server
        self.ca = ca
        self.client = httpx.Client(base_url=server, verify=context, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.client.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.request(method, path, **kwargs)

    def call(self, method: str, path: str, *, ok: tuple[int, ...] = (200, 201, 202), **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        if response.status_code not in ok:
            raise ApiError(response)
        return response.json() if response.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params=params or None)

    def get_or_none(self, path: str) -> Any:
        response = self.request("GET", path)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise ApiError(response)
        return response.json()

    def create(self, path: str, body: dict[str, Any]) -> Any:
        return self.call("POST", path, json=body)

    def merge_patch(self, path: str, body: dict[str, Any]) -> Any:
        return self.call("PATCH", path, json=body, headers={"Content-Type": "application/merge-patch+json"})

    def delete(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.call("DELETE", path, ok=(200, 202, 404), json=body)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.25) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` and the last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
        except (httpx.TransportError, ApiError) as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:.0f} s (last: {last!r:.2000})")
        time.sleep(interval)
